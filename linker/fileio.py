"""File helpers shared by every layer: tolerant line reading and atomic writes."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError

# A single-byte fallback for lines that are not UTF-8. cp1252 is a superset of latin-1's
# printable range and is what legacy MedDRA and UMLS files on Windows were written in;
# bytes it leaves undefined are decoded as latin-1 so that decoding never fails.
FALLBACK_ENCODING = "cp1252"


def _umask_mode(mode: int) -> int:
    # mkstemp/mkdtemp create 0600/0700 entries; give finished outputs the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def decode_line(raw: bytes) -> str:
    """Decode one line: UTF-8 when valid, else cp1252 (latin-1 for its five undefined bytes)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        try:
            return raw.decode(FALLBACK_ENCODING)
        except UnicodeDecodeError:
            return raw.decode("latin-1")


def open_binary(path: Path):
    if not path.exists():
        raise MissingInputError(f"{path}: no such file")
    if path.is_dir():
        raise MissingInputError(f"{path}: expected a file, found a folder")
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def iter_lines(path: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its line ending), streaming and encoding-tolerant.

    Each line is decoded on its own, so a file that is UTF-8 except for a few legacy bytes
    (a common state of hand-edited terminology files) still reads, and memory stays constant.
    A UTF-8 byte-order mark at the start is dropped. With `max_line_bytes`, a longer line raises
    InputFormatError after reading at most that many bytes of it.
    """
    path = Path(path)
    with open_binary(path) as handle:
        yield from iter_handle_lines(handle, path, max_line_bytes=max_line_bytes)


def iter_handle_lines(handle, where: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """`iter_lines` over an open binary handle (a file, or stdin's buffer)."""
    # readline(n) returns at most n bytes, so one huge line is never held whole: +2 leaves room for CR LF.
    size = -1 if max_line_bytes is None else max_line_bytes + 2
    number = 0
    while raw := handle.readline(size):
        number += 1
        raw = raw.rstrip(b"\r\n")
        if max_line_bytes is not None and len(raw) > max_line_bytes:
            raise InputFormatError(where, f"lines of at most {max_line_bytes:,} bytes", "a longer line", line=number,
                                   fix="raise --max-line-bytes if this line is genuine")
        line = decode_line(raw)
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        yield number, line


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on failure remove it.

    A crash or an error therefore never leaves a half-written file where a good one stood.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` (a folder) whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, _umask_mode(0o777))
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
