"""Models trained by this project that ship inside the package: ``linker/models/<name>/``.

A shipped model is never a copy of a base model. It holds only the tensors that training changed, in fp16
safetensors, and names the base it goes on top of (one of the offline encoders that PyPI packages install:
``minilm``, ``e5-small``). Loading it loads the base, checks every shipped file against the sha256 in
``manifest.json`` and overlays the tensors. A release folder holds three files:

- ``manifest.json``: format, name, version, kind (``encoder``, ``tagger`` for `linker.extract`'s linker-ae, or
  ``reranker`` for `linker.rerank`'s cross-encoder), base
  alias and revision, the tensors (names, shapes, dtype), the sha256 and size of each file, training and metrics
  summaries; a tagger's also holds its decoding fields (`DECODING_FIELDS`) and ``decoding_sha256`` over them;
- ``weights.safetensors``: the trained tensors (fp16), keys as in the base transformer's ``state_dict``;
- ``MODEL_CARD.md``: training data and licences, command, times, metrics, intended use and limits.

`linker.train.release` trains and writes them (``linker train release NAME``); `linker.encoders` resolves the
short names (``--encoder linker-en``) through `SHIPPED`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError
from linker.fileio import describe_path
from linker.folders import read_folder_json, sha256_file

FORMAT = "linker-release/1"
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
CARD = "MODEL_CARD.md"
FILES = (WEIGHTS, CARD)
MAX_WEIGHTS_BYTES = 64 << 20  # the budget is 30 MB a model; anything much larger is not one of ours
MAX_MANIFEST_BYTES = 1 << 20
# name -> the base encoder alias it overlays; the registry of short names `linker.encoders` offers.
SHIPPED = {"linker-en": "minilm", "linker-multi": "e5-small"}
# name -> base alias of the shipped cross-encoder re-rankers (kind ``reranker``; `linker.rerank` loads them by name,
# `linker index build --reranker NAME` binds them): their tensors are the sequence-classification model's (``bert.*``
# and ``classifier.*``) that training changed. `linker.train.rerank_release` retrains them.
RERANKERS: dict[str, str] = {"linker-rerank-en": "minilm"}


def shipped_reranker(name_or_path: str | Path) -> str | None:
    """The re-ranker release `name_or_path` names: a shipped one's name (`RERANKERS`), or a release folder (a
    manifest, no ``config.json``: `linker train release linker-rerank-en --out FOLDER`); None for anything else (a
    path that exists is the user's folder, whatever its name). One rule for loading (`linker.rerank`) and binding
    (`bind_reranker`)."""
    name, path = str(name_or_path), Path(name_or_path)
    if name in RERANKERS and not path.exists():
        return name
    return name if (path / MANIFEST).is_file() and not (path / "config.json").exists() else None
# A tagger's fields that decide what it finds (`linker.extract`). `decoding_sha256` covers them and the weights they
# were chosen for: an edited threshold (NaN silently finds nothing) is refused as an edited weights file is.
DECODING_FIELDS = ("labels", "max_length", "stride", "frozen_layers", "threshold", "extend", "split", "lexicon",
                   "decision_cut")
# in the digest only when present: releases written before them keep their digest
OPTIONAL_DECODING = ("lexicon", "decision_cut")
DECODING_DIGEST = "decoding_sha256"
FIX = "reinstall linker, or `git checkout -- linker/models`, or retrain it with `make models`"


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    base: str  # encoder alias of the base (linker.encoders.ENCODERS)
    folder: Path
    manifest: dict

    @property
    def revision(self) -> str:
        """What pins it in an index manifest: name, version and the weights' sha256."""
        return f"{self.name}=={self.version} sha256:{self.manifest['files'][WEIGHTS]['sha256']}"


def release_folder(name: str) -> Path:
    from linker.folders import MODELS_DIR  # looked up at each call: a test points it at a copy

    return MODELS_DIR / name


def read_release(name_or_folder: str | Path, *, verify: bool = True) -> Release:
    """The manifest of a shipped model, every listed file checked (size, sha256) when `verify`.

    A missing, altered or truncated file is one error naming it, what the manifest expects and what was found,
    and how to restore it; nothing is loaded from a release that fails."""
    named = str(name_or_folder) in SHIPPED or str(name_or_folder) in RERANKERS
    folder = release_folder(name_or_folder) if named else Path(name_or_folder)
    path = folder / MANIFEST
    fix = FIX
    if not path.is_file():
        raise MissingInputError(f"{path}: no such file: the shipped model {folder.name!r} is incomplete ({fix})")
    manifest = read_manifest_json(folder)
    if manifest.get("format") != FORMAT:
        raise InputFormatError(path, f"format {FORMAT!r}", repr(manifest.get("format")))
    for field in ("name", "version", "kind", "base"):
        value = manifest.get(field, MISSING)
        if not isinstance(value, str) or not value:
            raise InputFormatError(f"{path}: field {field!r}", "a non-empty string", shown(value), fix=fix)
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(FILES):
        raise InputFormatError(path, f"files {list(FILES)}", repr(sorted(files) if isinstance(files, dict) else files))
    for file, entry in files.items():
        if not isinstance(entry, dict):
            raise InputFormatError(f"{path}: field 'files.{file}'", '{"sha256": ..., "bytes": ...}', shown(entry),
                                   fix=fix)
    if verify:
        for file, expected in files.items():
            target = folder / file
            if not target.is_file() or target.is_symlink():
                found = describe_path(target)
                if found == "no such file":
                    raise MissingInputError(f"{target}: no such file: listed by {path} ({fix})")
                # a symlink is refused, not followed: the checked bytes could change under the release
                raise InputFormatError(target, f"a regular file inside the release folder (listed by {path})",
                                       found, fix=f"copy the file itself in its place, or {fix}")
            size = target.stat().st_size
            if size != expected.get("bytes") or size > MAX_WEIGHTS_BYTES:
                raise InputFormatError(target, f"{expected.get('bytes')} bytes (its manifest)", f"{size} bytes ({fix})")
            digest = sha256_file(target)
            if digest != expected.get("sha256"):
                raise InputFormatError(target, f"sha256 {str(expected.get('sha256'))[:16]}… (its manifest)",
                                       f"{digest[:16]}…: the file was altered ({fix})")
    return Release(manifest["name"], str(manifest["version"]), manifest["base"], folder, manifest)


MISSING = object()  # `manifest.get(field, MISSING)`: a field that is not there, as opposed to a null


def shown(value: object) -> str:
    """A manifest value as JSON, cut short, for 'found ...' in messages ("NaN", "\"0.8\"", "no such field")."""
    return "no such field" if value is MISSING else json.dumps(value, ensure_ascii=False)[:60]


def read_manifest_json(folder: Path) -> dict:
    """A release folder's manifest as a JSON object, read as an index manifest is (a regular file inside the folder,
    at most `MAX_MANIFEST_BYTES`) and nested at most `linker.formats.jsonl.MAX_DEPTH` levels: one error line,
    never a RecursionError, for a hostile 100,000-deep array."""
    from linker.formats.jsonl import _check_structure

    manifest = read_folder_json(folder, MANIFEST, what="a release manifest", max_bytes=MAX_MANIFEST_BYTES, fix=FIX)
    _check_structure(manifest, str(Path(folder) / MANIFEST), None)
    return manifest


def check_release_out(folder: str | Path, kind: str, *, option: str = "--out") -> None:
    """Refuse to write a release of `kind` over a folder that holds a release of another kind (its manifest's
    ``kind``): `linker train extractor --overwrite` would otherwise replace an encoder with a tagger."""
    folder = Path(folder)
    if not (folder / MANIFEST).exists():
        return
    found = read_manifest_json(folder).get("kind")
    if found != kind:
        raise ConfigError(f"{option} {folder} holds a release of kind {str(found)[:40]!r}, not {kind!r}; choose "
                          "another folder (a release is only replaced by one of its own kind)")


def decoding_digest(manifest: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces, ASCII) of a tagger manifest's `DECODING_FIELDS` and
    its weights' sha256."""
    payload = {field: manifest.get(field) for field in DECODING_FIELDS
               if field in manifest or field not in OPTIONAL_DECODING}
    payload["weights_sha256"] = manifest.get("files", {}).get(WEIGHTS, {}).get("sha256")
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def load_tensors(release: Release) -> dict:
    """The trained tensors as fp32 torch tensors (safetensors: no code runs when they load)."""
    import torch
    from safetensors.torch import load_file

    return {key: value.to(torch.float32) for key, value in load_file(str(release.folder / WEIGHTS)).items()}


def overlay(module, release: Release) -> int:
    """Put the release's tensors into `module` (the base transformer); every key and shape must match."""
    import torch

    tensors = load_tensors(release)
    state = module.state_dict()
    for key, value in tensors.items():
        if key not in state or tuple(state[key].shape) != tuple(value.shape):
            found = tuple(state[key].shape) if key in state else "no such tensor"
            raise InputFormatError(release.folder / WEIGHTS, f"tensor {key} {tuple(value.shape)} of base "
                                   f"{release.base!r}", f"{found} (a release for another base?)")
    with torch.no_grad():
        for key, value in tensors.items():
            state[key].copy_(value)
    return len(tensors)


def write_release(folder: Path, *, name: str, version: str, kind: str, base: str, base_revision: str,
                  tensors: dict, card: str, info: dict) -> dict:
    """Write a release folder in place of the previous one: fp16 tensors, card, manifest (last, so a folder with a
    manifest is whole). `tensors`: name -> torch tensor, the trained ones only; `info`: training and metrics
    summaries (JSON). Returns the manifest."""
    import torch
    from safetensors.torch import save_file

    from linker.fileio import atomic_file

    check_release_out(folder, kind)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # a half-rewritten release must fail its check, not load
    half = {key: value.detach().to("cpu", torch.float16).contiguous() for key, value in sorted(tensors.items())}
    with atomic_file(folder / WEIGHTS) as tmp:
        # No header metadata: safetensors writes a metadata map in a random order, so the same tensors would not give
        # the same bytes (and sha256) twice. What the file is, the manifest says.
        save_file(half, str(tmp))
    with atomic_file(folder / CARD) as tmp:
        Path(tmp).write_text(card, encoding="utf-8")
    manifest = {
        "format": FORMAT, "name": name, "version": version, "kind": kind, "base": base, "base_revision": base_revision,
        "tensors": {"dtype": "float16", "count": len(half), "parameters": sum(t.numel() for t in half.values()),
                    "shapes": {k: list(t.shape) for k, t in half.items()}},
        "files": {f: {"sha256": sha256_file(folder / f), "bytes": (folder / f).stat().st_size} for f in FILES},
        **info,
    }
    if kind == "tagger":
        manifest[DECODING_DIGEST] = decoding_digest(manifest)
    with atomic_file(folder / MANIFEST) as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest
