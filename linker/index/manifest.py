"""manifest.json: what an index folder holds, and the check that it still holds it.

An index folder is self-contained: its own copy of the concept table (``concepts.parquet``,
plus ``concepts.hierarchy.parquet`` for MedDRA), the kind's files, and ``manifest.json`` with
the kind, the resolved build parameters, the encoder (dense/hybrid), the library version,
the build time, counts, and the size and sha256 of every file. `verify` refuses a folder
whose files were changed, truncated or removed after the build, or that a newer major
version of the library wrote, because such an index would silently return wrong concepts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import linker
from linker.dictionary import sha256_file
from linker.errors import IndexMismatchError, InputFormatError, MissingInputError
from linker.fileio import atomic_file, is_temporary

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CONCEPTS = "concepts.parquet"
HIERARCHY = "concepts.hierarchy.parquet"
# Bumped when the folder layout changes incompatibly; an index of another format must be rebuilt.
INDEX_FORMAT = 1


def file_entry(folder: Path, relative: str) -> dict:
    path = folder / relative
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def describe_files(folder: Path) -> dict[str, dict]:
    """Size and sha256 of every file in `folder` (recursively), except the manifest itself."""
    files = sorted(p for p in folder.rglob("*")
                   if p.is_file() and p.name != MANIFEST and not is_temporary(p))
    return {p.relative_to(folder).as_posix(): file_entry(folder, p.relative_to(folder).as_posix()) for p in files}


def write_manifest(folder: Path, manifest: dict) -> dict:
    """Add the file list to `manifest` and write it as ``folder/manifest.json``; return it."""
    manifest = {**manifest, "files": describe_files(folder)}
    # Atomic: `linker calibrate` rewrites the manifest of a live index folder.
    with atomic_file(folder / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n")
    return manifest


def _rebuild_hint(manifest: dict) -> str:
    source = manifest.get("concepts", {}).get("source_path", "DICT.parquet")
    return f"rebuild it with `linker index build --dict {source} --kind {manifest.get('kind', 'tfidf')} --out DIR`"


def read_manifest(folder: str | Path) -> dict:
    """Read ``manifest.json`` of an index folder, without checking the files."""
    folder = Path(folder)
    path = folder / MANIFEST
    if folder.is_file():
        what = "a concept table (from `linker dict build`)" if folder.suffix == ".parquet" else "a file"
        raise MissingInputError(
            f"{folder}: expected an index folder, found {what}; `link`, `normalize`, `serve` and `eval` take an "
            f"index folder, which `linker index build --dict {folder} --out DIR` makes from a concept table"
        )
    if not folder.is_dir():
        raise MissingInputError(f"{folder}: no such index folder; build one with `linker index build`")
    if not path.is_file():
        raise IndexMismatchError(
            f"{path}: missing; {folder} is not an index folder (build one with `linker index build`)"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise IndexMismatchError(f"{path}: not valid JSON ({exc}); rebuild the index") from None
    if not isinstance(manifest, dict) or "kind" not in manifest or "files" not in manifest:
        raise IndexMismatchError(f"{path}: expected a linker index manifest with 'kind' and 'files'; rebuild the index")
    check_manifest(path, manifest)
    return manifest


def public_manifest(manifest):
    """The manifest without the building machine's paths (for GET /indexes): an absolute path
    (the concept table's source, an encoder folder) becomes its last component."""
    if isinstance(manifest, dict):
        return {key: public_manifest(value) for key, value in manifest.items()}
    if isinstance(manifest, list):
        return [public_manifest(value) for value in manifest]
    if isinstance(manifest, str) and os.path.isabs(manifest):
        return Path(manifest).name
    return manifest


# The fields every reader of a manifest relies on, with their JSON types; a missing or mistyped
# one is named in the error instead of surfacing as a KeyError deep inside a command.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": int,
    "kind": str,
    "parameters": dict,
    "library_version": str,
    "built_at": str,
    "build_seconds": (int, float),
    "counts": dict,
    "counts.names": int,
    "counts.concepts": int,
    "concepts": dict,
    "concepts.path": str,
    "concepts.source_path": str,
    "concepts.sha256": str,
    "files": dict,
}
_TYPE_NAMES = {int: "an integer", str: "a string", dict: "an object", (int, float): "a number"}


def check_manifest(path: Path, manifest: dict) -> None:
    """Every field present with its type; every listed file a relative path inside the folder."""
    for field, kind in _FIELDS.items():
        value: object = manifest
        for part in field.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING or not isinstance(value, kind) or isinstance(value, bool):
            found = "no such field" if value is _MISSING else f"{type(value).__name__} {str(value)[:40]!r}"
            raise InputFormatError(path, f"field {field!r} as {_TYPE_NAMES[kind]}", found,
                                   fix="rebuild the index with `linker index build`")
    for name, entry in manifest["files"].items():
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not name:
            raise InputFormatError(path, "file names inside the index folder (no absolute or '..' paths)", repr(name),
                                   fix="rebuild the index with `linker index build`")
        if (not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool)
                or not isinstance(entry.get("sha256"), str)):
            raise InputFormatError(path, f"field 'files.{name}' as {{\"size\": integer, \"sha256\": string}}",
                                   str(entry)[:60], fix="rebuild the index with `linker index build`")
    concepts = Path(manifest["concepts"]["path"])
    if concepts.is_absolute() or ".." in concepts.parts:
        raise InputFormatError(path, "field 'concepts.path' inside the index folder", repr(str(concepts)),
                               fix="rebuild the index with `linker index build`")


_MISSING = object()


def verify(folder: str | Path, manifest: dict, *, checksums: bool = True) -> None:
    """Refuse (IndexMismatchError) an index whose files or library version do not match its manifest.

    With ``checksums=False`` only presence and sizes are checked (fast start for large dense
    indexes on trusted storage); the default hashes every file.
    """
    folder = Path(folder)
    hint = _rebuild_hint(manifest)
    fmt = manifest.get("format")
    if fmt != INDEX_FORMAT:
        raise IndexMismatchError(
            f"{folder / MANIFEST}: index format {fmt!r}, this library reads format {INDEX_FORMAT}; {hint}"
        )
    built_with = str(manifest.get("library_version", "?"))
    if built_with.split(".")[0] != linker.__version__.split(".")[0]:
        raise IndexMismatchError(
            f"{folder / MANIFEST}: built by linker {built_with}, this is linker {linker.__version__} "
            f"(another major version); {hint}"
        )
    for relative, entry in manifest["files"].items():
        path = folder / relative
        if not path.is_file():
            raise IndexMismatchError(f"{path}: listed in the manifest but missing; {hint}")
        size = path.stat().st_size
        if size != entry["size"]:
            raise IndexMismatchError(
                f"{path}: {size} bytes, the manifest says {entry['size']} (changed or truncated after the build); {hint}"
            )
        if checksums and sha256_file(path) != entry["sha256"]:
            raise IndexMismatchError(f"{path}: sha256 differs from the manifest (changed after the build); {hint}")
    log.debug("verified %d files of %s", len(manifest["files"]), folder)
