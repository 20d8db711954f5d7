"""The folders artefacts live in and the files they are made of: the bottom of the house.

Where they live: the model cache (`cache_root`) and the models shipped inside the package (`MODELS_DIR`). How their
files are read: whole, for a checksum (`mapped_blocks`, `sha256_file`, `file_sha256`), or one by one as a manifest or
a model's config names them, through `folder_file`, which refuses what a load must not read (`read_folder_bytes`,
`read_folder_json`, `check_model_folder`). Index manifests (`linker.index.manifest`), shipped releases
(`linker.models`), encoders, re-rankers, the dictionary and `linker.fileio` all use these, so this module imports
nothing of linker's but its errors.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError


def cache_root() -> Path:
    """Where converted models live: $LINKER_CACHE or ~/.cache/linker (never the repository)."""
    override = os.environ.get("LINKER_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "linker"


# The models shipped inside the package, a release folder each (`linker.models`); inputs no output may touch
# (`linker.fileio.shipped_model_inputs`). Read as `folders.MODELS_DIR` when used, so that a test can point it at a copy.
MODELS_DIR = Path(__file__).resolve().parent / "models"


# ----------------------------------------------------------------------------- checksums


def mapped_blocks(path: str | Path, offset: int = 0, end: int | None = None,
                  block: int = 256 << 20) -> Iterator[memoryview]:
    """The bytes offset..end (None: the file's end) of `path` as read-only views of a memory map, `block` bytes each;
    once the next block is asked for, the pages of the one before are dropped from this process (they stay in the
    page cache, and a view still held reads them back).

    For reading GBs whole (checksums, finite checks): no copy into Python buffers, and a consumer that releases the
    GIL (hashlib, numpy) takes it once per block. 1 MB reads beside a thread importing torch each waited up to the
    5 ms switch interval for the GIL: hashing a 3.8 GB file took 5.9 s there, 3.4 s alone. The map is closed when
    the last view is freed, not here: a caller may still hold one."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        end = size if end is None else min(end, size)
        if end <= offset:
            return
        try:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system that cannot map it: read it
            handle.seek(offset)
            for start in range(offset, end, block):
                yield memoryview(handle.read(min(block, end - start)))
            return
    view = memoryview(mapped)
    for start in range(offset, end, block):
        yield view[start : min(end, start + block)]
        if hasattr(mapped, "madvise"):  # not on Windows
            first = start - start % mmap.PAGESIZE
            mapped.madvise(mmap.MADV_DONTNEED, first, min(end, start + block) - first)


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's bytes, read in `mapped_blocks` (concept tables, index files, release weights)."""
    digest = hashlib.sha256()
    for block in mapped_blocks(path):
        digest.update(block)
    return digest.hexdigest()


@lru_cache(maxsize=32)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """`sha256_file`'s digest, remembered per (path, size, mtime): a model file that pins an encoder's revision is
    hashed once per process, not at every resolve."""
    info = path.stat()
    return _file_sha256(str(path), info.st_size, info.st_mtime_ns)


# ----------------------------------------------------------------------------- files of a folder
#
# Every file that an index or model folder names is read through `folder_file`: the name must be a
# relative path that resolves (symlinks included) inside the folder to a regular file of bounded
# size. So a hostile or damaged folder is refused in one line before a reader sees the file, instead
# of reading /etc/passwd, blocking on a fifo or filling memory from /dev/zero. The caps are by kind
# of file and generous (ten times and more what the largest real folders hold); they bound what a
# load can cost, the manifest's sizes and checksums check the content.

# Metadata JSON (manifest, dense params, calibration, prior, a model's config and tokenizer files):
# parsed whole into Python objects, which take several times the file's bytes. The largest we know
# are a prior counted from a large training set (a few MB) and XLM-R's 17 MB tokenizer.json.
JSON_MAX_BYTES = 64 << 20
# Files memory-mapped or streamed (tf-idf matrix, embeddings, FAISS, parquet, model weights): their
# pages are shared and read on demand, so the cap only refuses absurd (sparse) files; 100M names x
# 384 floats is 154 GB.
LARGE_MAX_BYTES = 256 << 30
# Files of a model folder walked by `check_model_folder` (a model repository holds tens).
MODEL_MAX_FILES = 10_000
REBUILD_FIX = "rebuild the index with `linker index build`"

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def relative_name(folder: Path, name: object, what: str, named_by: str | None, fix: str) -> Path:
    """`name` as a relative path with no '..' (the check on the text, before the file system is asked)."""
    if not isinstance(name, str) or not name or "\0" in name:
        found = f"{type(name).__name__} {str(name)[:60]!r}"
    elif Path(name).is_absolute() or ".." in Path(name).parts:
        found = repr(name[:120])
    else:
        return Path(name)
    raise InputFormatError(named_by or folder, f"{what} named by a relative path inside {folder}", found, fix=fix)


def folder_file(folder: str | Path, name: object, *, max_bytes: int, what: str, named_by: str | None = None,
                fix: str = REBUILD_FIX) -> Path:
    """The resolved path of file `name` of `folder`, after refusing what a load must not read.

    Refused in one line (InputFormatError naming the file): a name that is not a relative path
    without '..'; a path that resolves outside the folder (a symlink included); anything but a regular
    file (a folder, fifo, device, socket); a file over `max_bytes`. A missing file is a
    MissingInputError. `what` says what the file should be; `named_by` where the name came from
    (``manifest.json field 'prior.file'``), for a bad name."""
    folder = Path(folder)
    path = folder / relative_name(folder, name, what, named_by, fix)
    try:
        root, resolved = folder.resolve(), path.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError before Python 3.13)
        raise InputFormatError(path, what, f"a path that does not resolve ({exc})", fix=fix) from None
    if resolved != root and root not in resolved.parents:
        raise InputFormatError(path, f"{what} inside {folder}", f"a link to {resolved}, outside it", fix=fix)
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        raise MissingInputError(f"{path}: missing (expected {what}); {fix}") from None
    except OSError as exc:
        raise InputFormatError(path, what, f"a file that cannot be read ({exc.strerror})", fix=fix) from None
    if not stat.S_ISREG(info.st_mode):
        shown = _kind_of(info.st_mode) + (f" (a link to {resolved})" if os.path.islink(path) else "")
        raise InputFormatError(path, f"{what} (a regular file)", shown, fix=fix)
    if info.st_size > max_bytes:
        raise InputFormatError(path, f"{what} of at most {max_bytes:,} bytes", f"{info.st_size:,} bytes", fix=fix)
    return resolved


def read_folder_bytes(folder: str | Path, name: object, *, what: str, max_bytes: int = JSON_MAX_BYTES,
                      named_by: str | None = None, fix: str = REBUILD_FIX) -> bytes:
    """The bytes of `folder_file`, read from a descriptor that is checked again (a regular file; never
    more than `max_bytes` even if the file grows or is swapped after the check)."""
    path = folder_file(folder, name, max_bytes=max_bytes, what=what, named_by=named_by, fix=fix)
    shown = Path(folder) / str(name)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputFormatError(shown, f"{what} (a regular file)", "a file replaced while it was read", fix=fix)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InputFormatError(shown, f"{what} of at most {max_bytes:,} bytes", "a longer file", fix=fix)
    return data


def read_folder_json(folder: str | Path, name: object, *, what: str, expect: type = dict,
                     max_bytes: int = JSON_MAX_BYTES, named_by: str | None = None, fix: str = REBUILD_FIX):
    """`read_folder_bytes` parsed as JSON whose top level is an `expect` (one line when it is not)."""
    data = read_folder_bytes(folder, name, what=what, max_bytes=max_bytes, named_by=named_by, fix=fix)
    shown = Path(folder) / str(name)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputFormatError(shown, f"{what} (JSON)", error_text(exc), fix=fix) from None
    if not isinstance(value, expect):
        raise InputFormatError(shown, f"{what} (a JSON {_JSON_NAMES.get(expect, expect.__name__)})",
                               f"a JSON {_JSON_NAMES.get(type(value), type(value).__name__)}", fix=fix)
    return value


def error_text(exc: BaseException) -> str:
    """A foreign reader's exception as one short line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean",
               type(None): "null"}


def check_model_folder(folder: str | Path, *, what: str, fix: str) -> list[str]:
    """Refuse a model folder (an encoder, a re-ranker) that a loader must not read: every entry, walked
    without following links, must resolve inside the folder; every file must be a regular file, of at
    most `JSON_MAX_BYTES` when a loader parses it whole (.json, .txt, .model: configs, vocabularies,
    tokenizers) and `LARGE_MAX_BYTES` otherwise (weights are memory-mapped); at most `MODEL_MAX_FILES`.
    Names starting with '.' (``.git``, ``.cache``) are skipped: no loader reads them.
    Returns the files' relative paths."""
    folder = Path(folder)
    root = folder.resolve()
    files: list[str] = []
    for current, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(current)
        for entry in dirs:  # os.walk does not follow a linked folder, so its target must lie inside
            resolved = (here / entry).resolve()
            if resolved != root and root not in resolved.parents:
                raise InputFormatError(here / entry, f"a folder inside {what} {folder}",
                                       f"a link to {resolved}, outside it", fix=fix)
        for entry in sorted(n for n in names if not n.startswith(".")):
            relative = (here / entry).relative_to(folder).as_posix()
            cap = JSON_MAX_BYTES if Path(entry).suffix in (".json", ".txt", ".model") else LARGE_MAX_BYTES
            folder_file(folder, relative, max_bytes=cap, what=f"a file of {what}", fix=fix)
            files.append(relative)
            if len(files) > MODEL_MAX_FILES:
                raise InputFormatError(folder, f"{what} of at most {MODEL_MAX_FILES:,} files",
                                       "more files", fix=fix)
    return files
