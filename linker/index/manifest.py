"""manifest.json: what an index folder holds, and the check that it still holds it.

An index folder is self-contained: its own copy of the concept table (``concepts.parquet``,
plus ``concepts.hierarchy.parquet`` for MedDRA), the kind's files, and ``manifest.json`` with
the kind, the resolved build parameters, the encoder (dense/hybrid), the library version,
the build time, counts, and the size and sha256 of every file. `verify` refuses a folder
whose files were changed, truncated or removed after the build, or that a newer major
version of the library wrote, because such an index would silently return wrong concepts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import linker
from linker.errors import IndexMismatchError, InputFormatError, LinkerError, MissingInputError
from linker.fileio import atomic_file, is_temporary
from linker.folders import (LARGE_MAX_BYTES, REBUILD_FIX, cache_root, error_text, folder_file, mapped_blocks,
                            read_folder_bytes, relative_name, sha256_file)

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
    if not os.path.lexists(path):
        raise IndexMismatchError(
            f"{path}: missing; {folder} is not an index folder (build one with `linker index build`)"
        )
    raw = read_folder_bytes(folder, MANIFEST, what="a linker index manifest", fix="rebuild the index")
    try:
        manifest = json.loads(raw.decode("utf-8"))
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
    for field, kind in _OPTIONAL.items():
        value = manifest.get(field)
        if value is not None and not isinstance(value, kind):
            raise InputFormatError(path, f"field {field!r} as {_TYPE_NAMES[kind]} or null",
                                   f"{type(value).__name__} {str(value)[:40]!r}", fix=REBUILD_FIX)
    # A file that a field names is read by a loader: it must be one of the listed files, whose sizes and
    # checksums `verify` checks (a prior named '../../x.json' would otherwise be read unverified).
    named = {"concepts.path": manifest["concepts"]["path"]}
    if manifest.get("prior"):
        named["prior.file"] = manifest["prior"].get("file")
    for field, name in named.items():
        relative_name(path.parent, name, "a file", f"{path}: field {field!r}", REBUILD_FIX)
        if name not in manifest["files"]:
            raise InputFormatError(path, f"field {field!r} naming one of the files the manifest lists",
                                   f"{name!r}, which 'files' does not list (its checksum is unknown)", fix=REBUILD_FIX)


# Fields that only some indexes have: when present (and not null), of this type.
_OPTIONAL: dict[str, type] = {"prior": dict, "calibration": dict, "reranker": dict, "encoder": dict, "dense": dict}


_MISSING = object()


def verify(folder: str | Path, manifest: dict, *, checksums: bool = True, trust_stamp: bool = True) -> None:
    """Refuse (IndexMismatchError) an index whose files or library version do not match its manifest.

    With ``checksums=False`` only presence and sizes are checked (fast start for large dense
    indexes on trusted storage); the default hashes every file, once: a `VerifiedStamp` records the check and
    later calls trust it while every file is unchanged (``trust_stamp=False`` hashes them again).
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
    paths = {}
    for relative, entry in manifest["files"].items():
        path = folder / relative
        if not os.path.lexists(path):
            raise IndexMismatchError(f"{path}: listed in the manifest but missing; {hint}")
        # Inside the folder, a regular file: a link out of it or to a device is refused before it is hashed.
        path = folder_file(folder, relative, max_bytes=LARGE_MAX_BYTES, what="a file of the index", fix=hint)
        size = path.stat().st_size
        if size != entry["size"]:
            raise IndexMismatchError(f"{folder / relative}: {size} bytes, the manifest says {entry['size']} "
                                     f"(changed or truncated after the build); {hint}")
        paths[relative] = path
    if checksums:
        stamp = VerifiedStamp.of(folder, manifest, paths)
        if trust_stamp and stamp.holds():
            log.debug("%s: files unchanged since their checksums were verified (%s)", folder, stamp.path)
            return
        # Largest first, on as many threads as cores (hashlib releases the GIL): a 5M-name index holds GBs, and
        # hashing them is most of its start-up (eval/scale/report.md).
        order = sorted(paths, key=lambda r: -manifest["files"][r]["size"])
        with ThreadPoolExecutor(max_workers=min(len(order), os.cpu_count() or 1) or 1) as pool:
            digests = dict(zip(order, pool.map(lambda r: sha256_file(paths[r]), order)))
        for relative in manifest["files"]:
            if digests[relative] != manifest["files"][relative]["sha256"]:
                raise IndexMismatchError(f"{folder / relative}: sha256 differs from the manifest "
                                         f"(changed after the build); {hint}")
        stamp.write()
    log.debug("verified %d files of %s", len(manifest["files"]), folder)


# ----------------------------------------------------------------------------- verified once
#
# Hashing every file at every load cost a dense CLI call most of a second (230 MB of vectors) and a 5M-name index
# seconds. So a full check is recorded in a stamp in the user's cache (never in the index folder, which may be
# read-only or shared), and a later load trusts it while every file still has the identity it had when it was
# hashed: size, mtime_ns, ctime_ns, inode and device. Writing to a file moves its ctime, and no user process can
# set a ctime (`os.utime` sets mtime and atime only, and moves ctime to now), so content changed after the check,
# even with its mtime put back, is caught; so is a file replaced by another (inode) or the folder moved to another
# disk (device). What the stamp cannot see: a change by someone able to set the system clock or write the raw
# disk (root), or a file system that does not keep ctime. A stamp that is missing, malformed or of another
# manifest is ignored and the files are hashed again.

STAMP_FORMAT = 1
STAMP_DIR = "verified"
# A file changed less than this before its check is not stamped: file times advance in kernel clock ticks
# (milliseconds), so a write in the same tick as the one the check saw would leave the identity unchanged
# (git's "racy" index entries). The next load checks it again.
RACY_NS = 2_000_000_000


def file_identity(path: str | Path) -> list[int]:
    """[size, mtime_ns, ctime_ns, inode, device] of a file (following links, as a reader opens it)."""
    info = os.stat(path)
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev]


@dataclasses.dataclass(frozen=True)
class VerifiedStamp:
    """The record that `folder`'s files matched the checksums of its manifest (`verify`): a JSON file in
    ``<cache>/verified/`` named after the folder's resolved path and the manifest's sha256."""

    path: Path
    key: str
    files: dict[str, Path]

    @classmethod
    def of(cls, folder: Path, manifest: dict, files: dict[str, Path]) -> VerifiedStamp:
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True, ensure_ascii=True, default=str).encode()).hexdigest()
        return cls.of_key(f"{Path(folder).resolve()}\0{digest}", files)

    @classmethod
    def of_key(cls, key: str, files: dict[str, Path]) -> VerifiedStamp:
        """The stamp of a check named by `key` over `files`."""
        name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"
        return cls(cache_root() / STAMP_DIR / name, key, files)

    def identities(self) -> dict[str, list[int]]:
        return {name: file_identity(path) for name, path in sorted(self.files.items())}

    def holds(self) -> bool:
        """Whether the stamp is there, well formed, of this folder and manifest, and every file is as stamped."""
        try:
            data = json.loads(self.path.read_bytes())
            return (isinstance(data, dict) and data.get("format") == STAMP_FORMAT and data.get("key") == self.key
                    and data.get("files") == self.identities())
        except (OSError, ValueError, RecursionError):  # missing, unreadable, not JSON: check in full
            return False

    def write(self) -> None:
        """Record the files' identities (after a full check). Best effort: a cache that cannot be written (read-only
        home, full disk) costs the next load a full check, nothing else."""
        now = time.time_ns()
        identities = self.identities()
        if any(now - max(mtime, ctime) < RACY_NS for _size, mtime, ctime, _ino, _dev in identities.values()):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(self.path) as tmp:
                Path(tmp).write_text(json.dumps({"format": STAMP_FORMAT, "key": self.key, "files": identities}),
                                     encoding="utf-8")
            _prune_stamps(self.path.parent)
        except (OSError, LinkerError) as exc:
            log.debug("could not write the verification stamp %s: %s", self.path, exc)


MAX_STAMPS = 1024  # a stamp per index folder and manifest; temporary folders (tests, benchmarks) would pile up


def _prune_stamps(folder: Path) -> None:
    """Keep the `MAX_STAMPS` // 2 most recent stamps once there are more than `MAX_STAMPS` (a pruned one only costs
    its index one full check)."""
    stamps = list(folder.glob("*.json"))
    if len(stamps) <= MAX_STAMPS:
        return
    for old in sorted(stamps, key=lambda p: p.stat().st_mtime_ns)[: len(stamps) - MAX_STAMPS // 2]:
        old.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- arrays of a folder
#
# Read through `linker.folders.folder_file`, like every file a folder names (its caps and checks).

# Arrays read into memory (the tf-idf idf vector: 8 bytes per n-gram; a multilingual UMLS has a few
# million n-grams, so 1 GiB is over a hundred million).
ARRAY_MAX_BYTES = 1 << 30


def npy_header(handle, where: str | Path, available: int, *,
               fix: str = REBUILD_FIX) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) of the ``.npy`` at `handle`'s position, refusing object
    arrays and a header whose data does not take exactly the `available` bytes after it (so that no
    reader allocates for a shape the file does not hold)."""
    start = handle.tell()
    try:
        version = np.lib.format.read_magic(handle)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(handle) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(handle, max_header_size=1 << 16))
    except (ValueError, OSError, SyntaxError, TypeError) as exc:
        raise InputFormatError(where, "a numpy .npy array", error_text(exc), fix=fix) from None
    if dtype.hasobject:
        raise InputFormatError(where, "a numeric array", "an object array (it would need pickle)", fix=fix)
    offset = handle.tell() - start
    data = math.prod(shape) * dtype.itemsize
    if offset + data != available:
        raise InputFormatError(where, f"{offset + data:,} bytes for an array of shape {shape} {dtype}",
                               f"{available:,} bytes", fix=fix)
    return shape, fortran, dtype, offset


def check_array(where: str | Path, array: np.ndarray, *, what: str, shape: tuple[int | None, ...],
                kinds: str = "f", fix: str = REBUILD_FIX, finite: bool = True) -> np.ndarray:
    """Refuse an array of another dimension count, shape (None = any length) or dtype kind, or (with `finite`) a
    float array with a NaN or infinity (checked in blocks: a memory-mapped array stays mapped)."""
    if array.ndim != len(shape) or any(want is not None and got != want for got, want in zip(array.shape, shape)):
        wanted = "(" + ", ".join("n" if n is None else str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
        raise InputFormatError(where, f"{what} of shape {wanted}", f"shape {array.shape}", fix=fix)
    if array.dtype.kind not in kinds:
        raise InputFormatError(where, f"{what} of dtype kind {'/'.join(kinds)}", f"dtype {array.dtype}", fix=fix)
    if array.dtype.kind == "f" and finite:
        start = 0
        for part in _flat_blocks(array, 1 << 24):
            if not _all_finite(part):
                bad = int(np.argmin(np.isfinite(part)))
                raise InputFormatError(where, f"{what} of finite numbers", f"{part[bad]} at flat position {start + bad}",
                                       fix=fix)
            start += len(part)
    return array


FP16_EXPONENT = 0x7C00  # a float16's exponent bits: all set in a NaN or an infinity, and only there


def _all_finite(values: np.ndarray) -> bool:
    """`np.isfinite(values).all()`; for float16 by its exponent bits, 3x faster (numpy widens float16 to test it,
    and a 5M-name index's vectors are 1.9 billion of them)."""
    if values.dtype.itemsize != 2 or values.dtype.kind != "f":
        return bool(np.isfinite(values).all())
    return int(np.bitwise_and(values.view(np.uint16), FP16_EXPONENT).max(initial=0)) != FP16_EXPONENT


def _flat_blocks(array: np.ndarray, block: int):
    """`array`'s values in flat blocks. A whole memory-mapped file is read through a map of its own, whose pages are
    dropped block by block (`mapped_blocks`), not through the array's: pages read through that mapping would stay
    in this process's resident memory, and a check of a 4 GB index would leave the server holding all of it (its
    queries touch a few pages each)."""
    if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.flags.c_contiguous:
        for part in mapped_blocks(array.filename, array.offset, array.offset + array.nbytes,
                                  block * array.dtype.itemsize):
            yield np.frombuffer(part, dtype=array.dtype)
        return
    flat = array.reshape(-1) if array.flags.c_contiguous else array.ravel(order="K")
    for start in range(0, flat.size, block):
        yield np.asarray(flat[start : start + block])


def read_folder_array(folder: str | Path, name: object, *, what: str, shape: tuple[int | None, ...],
                      kinds: str = "f", mmap: bool = False, max_bytes: int = ARRAY_MAX_BYTES,
                      named_by: str | None = None, fix: str = REBUILD_FIX) -> np.ndarray:
    """A ``.npy`` file of a folder (`folder_file`), its header checked against its size (`npy_header`)
    before numpy reads it and its content by `check_array`; memory-mapped read-only with `mmap`."""
    path = folder_file(folder, name, max_bytes=max_bytes, what=what, named_by=named_by, fix=fix)
    shown = Path(folder) / str(name)
    with path.open("rb") as handle:
        npy_header(handle, shown, os.fstat(handle.fileno()).st_size, fix=fix)
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputFormatError(shown, what, error_text(exc), fix=fix) from None
    if not (mmap and array.dtype.kind == "f"):
        return check_array(shown, array, what=what, shape=shape, kinds=kinds, fix=fix)
    # A mapped array is a large one (the default index's vectors: 230 MB, a tenth of a second to scan): its values
    # are checked once per file, and a `VerifiedStamp` lets later loads trust the check while the file is unchanged.
    stamp = VerifiedStamp.of_key(f"finite values\0{path}\0{array.dtype.str}\0{array.shape}", {"array": path})
    checked = stamp.holds()
    array = check_array(shown, array, what=what, shape=shape, kinds=kinds, fix=fix, finite=not checked)
    if not checked:
        stamp.write()
    return array


_PARAMETER_TYPES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def typed_parameters(config_type: type, parameters: dict) -> dict:
    """`parameters` (a manifest's JSON) for the dataclass `config_type`, each value of its field's default
    type (an integer where a float goes); TypeError naming the field otherwise, so that a wrong type is
    refused when the index loads instead of failing inside a search."""
    if not isinstance(parameters, dict):
        raise TypeError(f"parameters as an object, found {type(parameters).__name__}")
    for field in dataclasses.fields(config_type):
        if field.name not in parameters or field.default is dataclasses.MISSING:
            continue
        want, value = type(field.default), parameters[field.name]
        fits = (isinstance(value, want) and (want is bool or not isinstance(value, bool))) or (
            want is float and type(value) is int)
        if not fits:
            raise TypeError(f"{field.name}: expected {_PARAMETER_TYPES.get(want, want.__name__)}, found {value!r}")
    return parameters
