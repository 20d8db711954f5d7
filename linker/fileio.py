"""File helpers shared by every layer: tolerant line reading, output guards and atomic writes."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError

log = logging.getLogger(__name__)

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
def native_read(path: str | Path, expected: str, *, fix: str | None = None) -> Iterator[None]:
    """Turn a native reader's failure (pyarrow, numpy, scipy, FAISS, safetensors) into one InputFormatError.

    Those readers raise their own exception types, often with multi-line or path-less messages;
    a file altered after its checksum was recorded reaches them, so each call is wrapped.
    """
    from linker.errors import LinkerError

    try:
        yield
    except (LinkerError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the foreign reader is a bad file
        message = " ".join(str(exc).split())[:200] or "no message"
        raise InputFormatError(path, expected, f"{type(exc).__name__}: {message}", fix=fix) from None


# ----------------------------------------------------------------------------- outputs
#
# Every output goes through `check_output` before any work and through `atomic_file` /
# `atomic_dir` when written. Temporaries are named ``.<name>.linker-tmp-<pid>-<random>`` beside
# the output, so a run killed with -9 leaves something recognisable: the next run that writes
# into that folder removes the ones whose writer is dead. A folder we write carries `MARKER`;
# `--overwrite` replaces only such folders, never one that something else wrote.

MARKER = ".linker-output"
_TEMP_TAG = "linker-tmp"
_TEMPORARY = re.compile(rf"^\.(.+)\.{_TEMP_TAG}-(\d+)-\w+$")


def is_temporary(path: str | Path) -> bool:
    """True for a temporary that `atomic_file`/`atomic_dir` writes beside its target (never a real output)."""
    return _TEMPORARY.match(Path(path).name) is not None


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{_TEMP_TAG}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove our temporaries in `folder` whose writing process is gone; return what was removed."""
    folder = Path(folder)
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:  # absent or unreadable: nothing of ours to clean, and the write will say why
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or _pid_alive(int(match.group(2))):
            continue
        previous, original = entry / "old", folder / match.group(1)
        if previous.is_dir() and not original.exists():  # killed between atomic_dir's two renames
            os.replace(previous, original)
            log.info("restored %s from %s", original, entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
        log.info("removed %s, left by process %s that no longer runs", entry, match.group(2))
    return removed


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_output(
    output: str | Path,
    *,
    inputs: Iterable[str | Path] = (),
    overwrite: bool = False,
    folder: bool = False,
    option: str = "--output",
) -> None:
    """Refuse, before any work, an output that would destroy an input or something we did not write.

    The output may not equal, contain or lie inside any input (after resolving symlinks). An
    existing output file is replaced only with `overwrite`; an existing non-empty output folder
    only with `overwrite` and only when it carries our `MARKER`.
    """
    out = Path(output)
    _check_path_text(out, option)
    target = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if _is_within(target, source) or _is_within(source, target):
            relation = ("is the input" if target == source else "lies inside the input" if _is_within(target, source)
                        else "contains the input")
            raise ConfigError(f"{option} {out} {relation} {given}; choose an output outside every input "
                              "so that no input is overwritten")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(f"{option} {out}: {ancestor} is a file, expected a folder")
            if not os.access(ancestor, os.W_OK | os.X_OK):  # the temporary and the rename need both
                raise ConfigError(f"{option} {out}: no permission to write into {ancestor}")
            break
    remove_stale_temporaries(target.parent)
    if not out.exists() and not out.is_symlink():
        return
    if folder:
        if not out.is_dir():
            raise ConfigError(f"{option} {out} is a file, expected a folder")
        if not any(out.iterdir()):
            return
        if not (out / MARKER).is_file():
            raise ConfigError(f"{option} {out} is a folder that linker did not write (no {MARKER} in it); "
                              "choose a new folder, or empty or remove it yourself")
        if not overwrite:
            raise ConfigError(f"{option} {out} exists; pass --overwrite to replace it, or choose a new folder")
    else:
        if out.is_dir():
            raise ConfigError(f"{option} {out} is a folder, expected a file")
        if not overwrite:
            raise ConfigError(f"{option} {out} exists; pass --overwrite to replace it, or choose a new file")


def _check_path_text(path: Path, option: str) -> None:
    """A path must be text: a non-UTF-8 byte would fail later, in a manifest or a message."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        byte = str(path)[exc.start].encode("utf-8", "surrogateescape")
        raise InputFormatError(f"{option} {shown}", "a path in UTF-8", f"the byte {byte!r} at character {exc.start}",
                               fix="rename the file or folder") from None


def check_inputs(*paths: str | Path, option: str = "input") -> None:
    """Input paths must be UTF-8 text too (see `_check_path_text`)."""
    for path in paths:
        _check_path_text(Path(path), option)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on failure remove it.

    A crash or an error therefore never leaves a half-written file where a good one stood.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
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
    """Yield a temporary folder beside `path`; on success it replaces `path` (a folder) whole.

    The folder gets our `MARKER`; a non-empty folder without it is never replaced (ConfigError).
    """
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).is_file():
        raise ConfigError(f"{path} is a folder that linker did not write (no {MARKER} in it); not replacing it")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
    try:
        yield tmp
        (tmp / MARKER).write_text(json.dumps({"written_by": "linker", "pid": os.getpid()}) + "\n")
        os.chmod(tmp, _umask_mode(0o777))
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
            os.replace(path, old / "old")
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def repo_root() -> Path:
    """The checkout this package runs from (the folder holding pyproject.toml), else the working directory."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").exists() else Path.cwd().resolve()


def portable_paths(text: str, *, root: str | Path | None = None, data: str | Path | None = None,
                   scratch: str | Path | None = None) -> str:
    """`text` (a report's JSON or markdown) with this machine's paths made portable: paths inside the
    repository root become relative to it (the root itself ``.``), paths inside its sibling ``shared``
    folder (or under `data`, the shared data folder a script was given) become ``../shared/...``, and
    paths under `scratch` (a temporary folder gone once the run ends) ``<scratch>/...``, the encoder
    cache (`linker.encoders.cache_root`, e5-small converted there) ``<linker-cache>/...``, and installed
    packages (an encoder shipped on PyPI) ``<site-packages>/...``, wherever the environment lives.
    Other absolute paths are left as they are."""
    from linker.encoders import cache_root  # lazily: encoders imports this module

    root = Path(root).resolve() if root is not None else repo_root()
    pairs: list[tuple[str, str]] = [(str(Path(scratch)), "<scratch>")] if scratch is not None else []
    pairs += [(str(cache_root()), "<linker-cache>")]
    if data is not None:
        pairs += [(str(Path(data).resolve()), "../shared/data"), (str(Path(data).absolute()), "../shared/data")]
    pairs += [(str(root.parent / "shared"), "../shared")]
    pairs += [(str(root), ".")]
    for absolute, relative in pairs:
        if absolute in ("/", "."):
            continue
        # prefix followed by "/" → relative prefix; the bare folder (at a word boundary) → relative name
        text = text.replace(absolute + "/", "" if relative == "." else relative + "/")
        text = re.sub(re.escape(absolute) + r"(?![\w.-])", relative, text)
    return re.sub(r"(?<![\w.-])/[^\s\"']*/site-packages/", "<site-packages>/", text)
