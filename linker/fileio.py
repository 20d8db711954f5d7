"""File helpers shared by every layer: tolerant line reading, output guards and atomic writes."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import gzip
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import unicodedata
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.folders import cache_root

STDIO = "-"  # the path that means standard input or output, in every command and reader that takes one

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


# ----------------------------------------------------------------------------- the bounded reading layer
#
# Every reader of the project (mention formats, terminology sources, shards, typo and filter lists)
# reads through these functions, so one policy holds everywhere: a line is refused past
# `max_line_bytes` and a document past `max_document_bytes` after reading at most one byte more
# than the cap, counting decompressed bytes (gzip here, zip members in `linker.formats.brat`), and a
# truncated or corrupt file is one InputFormatError naming it, never a traceback. `ReadLimits`
# (linker.formats) carries the caps as options; these are its defaults, far above any real corpus
# line or document and far below what would exhaust memory.

MAX_LINE_BYTES = 1 << 20  # 1 MiB: a JSONL span, a PubTator abstract, a brat line, a terminology row
MAX_DOCUMENT_BYTES = 64 << 20  # 64 MiB: one brat .ann or .txt, one XML drug label, one ClaML class


def open_binary(path: str | Path):
    """Open a file for reading as bytes; a ``.gz`` name is decompressed as it is read."""
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"{path}: no such file")
    if path.is_dir():
        raise MissingInputError(f"{path}: expected a file, found a folder")
    try:
        return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb")
    except OSError as exc:
        raise MissingInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def describe_path(path: str | Path) -> str:
    """What is at `path`, for 'expected a file, found ...': a path that exists but is no regular file must not be
    called missing (``/dev/zero`` is there)."""
    path = Path(path)
    if path.is_symlink():
        return "a symlink" + ("" if path.exists() else " to nothing")
    if not path.exists():
        return "no such file"
    return "a folder" if path.is_dir() else "a regular file" if path.is_file() else \
        "a special file (device, pipe or socket)"


def read_failure(exc: BaseException, where: str | Path, *, line: int | None = None) -> InputFormatError:
    """The InputFormatError for a failure while reading or decompressing `where` (a gzip or zip stream
    that ends early or is corrupt, a file named .gz that is no gzip file, an I/O error)."""
    message = " ".join(str(exc).split())[:160] or type(exc).__name__
    if isinstance(exc, EOFError):
        return InputFormatError(where, "a complete compressed file",
                                f"its end before the end of the stream ({message})", line=line,
                                fix="the file is truncated: copy or download it again")
    if isinstance(exc, gzip.BadGzipFile):
        return InputFormatError(where, "a gzip file (the name ends in .gz)", message, line=line,
                                fix="compress it with gzip, or remove .gz from its name")
    if isinstance(exc, (zlib.error, zipfile.BadZipFile)):
        return InputFormatError(where, "a valid compressed stream", f"corrupt data ({message})", line=line)
    return InputFormatError(where, "a readable file", f"{type(exc).__name__}: {message}", line=line)


# What reading or decompressing can raise: zlib.error for corrupt deflate data, EOFError for a
# truncated stream, BadZipFile (zip CRC), NotImplementedError/RuntimeError (zip compression or encryption
# we cannot read), OSError (BadGzipFile, I/O errors).
READ_ERRORS = (OSError, EOFError, zlib.error, zipfile.BadZipFile, NotImplementedError, RuntimeError)


def read_bounded(handle, where: str | Path, max_bytes: int, *, option: str = "--max-document-bytes") -> bytes:
    """All bytes of an open binary handle, refused (InputFormatError) past `max_bytes` after reading at
    most one byte more: a zip member or gzip file whose header understates its size cannot grow past it."""
    try:
        data = handle.read(max_bytes + 1)
    except READ_ERRORS as exc:
        raise read_failure(exc, where) from None
    if len(data) > max_bytes:
        raise InputFormatError(where, f"a document of at most {max_bytes:,} bytes", f"more than {max_bytes:,} bytes",
                               fix=f"raise {option} if this file is genuine")
    return data


def iter_raw_lines(handle, where: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes without the line ending) of an open binary handle.

    `handle.readline(n)` returns at most n bytes, so a line longer than the cap (default
    `MAX_LINE_BYTES`) is refused after reading at most cap + 2 bytes of it: never held whole.
    """
    cap = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    size = cap + 2  # room for CR LF
    number = 0
    while True:
        try:
            raw = handle.readline(size)
        except READ_ERRORS as exc:
            raise read_failure(exc, where, line=number + 1) from None
        if not raw:
            return
        number += 1
        raw = raw.rstrip(b"\r\n")
        if len(raw) > cap:
            raise InputFormatError(where, f"lines of at most {cap:,} bytes", "a longer line", line=number,
                                   fix="raise --max-line-bytes if this line is genuine")
        yield number, raw


def iter_lines(path: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its line ending), streaming and encoding-tolerant.

    Each line is decoded on its own, so a file that is UTF-8 except for a few legacy bytes
    (a common state of hand-edited terminology files) still reads, and memory stays constant.
    A UTF-8 byte-order mark at the start is dropped. A line longer than `max_line_bytes` (default
    `MAX_LINE_BYTES`; there is no unbounded mode) raises InputFormatError after reading at most
    that many bytes of it.
    """
    path = Path(path)
    with open_binary(path) as handle:
        yield from iter_handle_lines(handle, path, max_line_bytes=max_line_bytes)


def iter_handle_lines(handle, where: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """`iter_lines` over an open binary handle (a file, or stdin's buffer)."""
    for number, raw in iter_raw_lines(handle, where, max_line_bytes=max_line_bytes):
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


@dataclass(frozen=True)
class Input:
    """A path a command reads, and what names it (``--index``, ``typos= of --dataset X``) for the error."""

    path: Path
    named_by: str = ""

    def __str__(self) -> str:
        return f"the input {self.path}" + (f" ({self.named_by})" if self.named_by else "")


def model_inputs(name: str | Path | None, option: str) -> list[Input]:
    """A model option's value (--rerank, --encoder) as inputs: a local folder is one (with an ``#cls`` /
    ``#mean`` pooling suffix dropped); an alias, a hub name or ``none`` names no local path (the folders that
    aliases load, shipped releases and the model cache, are inputs of every command: `shipped_model_inputs`)."""
    if name is None or str(name) in ("", "none"):
        return []
    text = str(name)
    for candidate in (text, text.rpartition("#")[0]):
        path = Path(candidate).expanduser()
        if candidate and (path.exists() or path.is_symlink()):
            return [Input(path, option)]
    return []


def shipped_model_inputs(*, release: str | Path | None = None) -> list[Input]:
    """The package's model folders (``linker/models``) and the model cache (`linker.folders.cache_root`): inputs of
    every command, whether or not it reads them, since an output there would replace weights that later runs load.

    `release`: the release folder a training command rewrites (`linker train extractor` / `release`, once
    `linker.models.check_release_out` found it of the same kind or absent); when it is one folder of the package's
    models, that folder alone is left out."""
    from linker.folders import MODELS_DIR  # looked up at each call: a test points it at a copy

    cache = Input(cache_root(), "the model cache")
    own = Path(release).resolve() if release is not None else None
    if own is not None and own.parent == MODELS_DIR.resolve():
        return [*(Input(p, "a model shipped with linker") for p in sorted(MODELS_DIR.iterdir()) if p.resolve() != own),
                cache]
    return [Input(MODELS_DIR, "the models shipped with linker"), cache]


def check_apart(output: str | Path, *, inputs: Iterable[str | Path | Input] = (), option: str = "--output",
                release: str | Path | None = None) -> None:
    """Refuse an output path that equals, contains or lies inside an input or a shipped model folder
    (`shipped_model_inputs`), after resolving symlinks: `check_output`'s input rule alone, for a path written
    in place (a work folder) whose existing content is the command's own."""
    out = Path(output)
    target, cache = out.resolve(), {}
    for given in [*inputs, *shipped_model_inputs(release=release)]:
        source = given if isinstance(given, Input) else Input(Path(given))
        relation = _relation(target, Path(source.path).resolve(), cache)
        if relation is not None:
            raise ConfigError(f"{option} {out} {relation} {source}; choose an output outside every input "
                              "so that no input is overwritten")


def _identity(path: Path, cache: dict[Path, tuple[int, int, bool] | None]) -> tuple[int, int, bool] | None:
    """(device, inode, is a folder) of an existing path, else None; `cache` spares repeated stats."""
    if path not in cache:
        try:
            st = os.stat(path)
            cache[path] = (st.st_dev, st.st_ino, stat.S_ISDIR(st.st_mode))
        except (OSError, ValueError):
            cache[path] = None
    return cache[path]


def _relation(target: Path, source: Path, cache: dict) -> str | None:
    """How the output `target` touches the input `source` (both resolved): ``is``, ``lies inside``,
    ``contains`` or None. Paths are compared after resolving symlinks and ``..``; existing ones also by
    (device, inode), which catches a hard link, a bind mount or a case-insensitive spelling of the same thing."""
    if target == source:
        return "is"
    if source in target.parents:
        return "lies inside"
    if target in source.parents:
        return "contains"
    source_id, target_id = _identity(source, cache), _identity(target, cache)
    if source_id is not None and source_id == target_id:
        return "is"
    if source_id is not None and source_id[2] and any(_identity(p, cache) == source_id for p in target.parents):
        return "lies inside"
    if target_id is not None and target_id[2] and any(_identity(p, cache) == target_id for p in source.parents):
        return "contains"
    return None


def input_relation(output: str | Path, source: str | Path) -> str | None:
    """``is``, ``lies inside`` or ``contains`` when writing `output` would touch the input `source`, else None."""
    return _relation(Path(output).resolve(), Path(source).resolve(), {})


# Outputs that check_output found absent (or absent enough: an empty folder) and may not replace: their
# atomic_file / atomic_dir commit is an exclusive create, so that a file someone else makes there after
# the check is never replaced without --overwrite. Keyed by the resolved parent and the name.
_NO_REPLACE: set[str] = set()


def _key(path: Path) -> str:
    path = Path(path)
    if path.name in ("", ".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(path.parent), path.name)


def check_output(
    output: str | Path,
    *,
    inputs: Iterable[str | Path | Input] = (),
    overwrite: bool = False,
    folder: bool = False,
    option: str = "--output",
    release: str | Path | None = None,
) -> None:
    """Refuse, before any work, an output that would destroy an input or something we did not write.

    The output may not equal, contain or lie inside any input (`Input`, or a plain path: "the input"),
    nor a shipped model folder or the model cache (`shipped_model_inputs`; `release`: the one release folder
    a training command rewrites), after resolving symlinks (`check_apart`). An existing output file is
    replaced only with `overwrite`; an existing non-empty output folder only with `overwrite` and only when
    it carries our `MARKER`. Without `overwrite`, the later atomic_file / atomic_dir write will not replace
    anything that appears there meanwhile either.
    """
    out = Path(output)
    if str(out) == STDIO:  # a user means standard output; a file called "-" in the working folder surprises everyone
        raise ConfigError(f"{option} -: this command writes files, not standard output (`linker normalize`, "
                          "`extract` and `annotate` with --format jsonl write JSONL there); name a file or folder")
    _check_path_text(out, option)
    check_apart(out, inputs=inputs, option=option, release=release)
    target = out.resolve()
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ConfigError(f"{option} {out}: {ancestor} is a file, expected a folder")
            if not os.access(ancestor, os.W_OK | os.X_OK):  # the temporary and the rename need both
                raise ConfigError(f"{option} {out}: no permission to write into {ancestor}")
            break
    remove_stale_temporaries(target.parent)
    if out.exists() or out.is_symlink():
        _check_existing(out, overwrite=overwrite, folder=folder, option=option)
    if overwrite:
        _NO_REPLACE.discard(_key(out))
    else:
        _NO_REPLACE.add(_key(out))


def _check_existing(out: Path, *, overwrite: bool, folder: bool, option: str) -> None:
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


# ----------------------------------------------------------------------------- file names made from data
#
# A name that data chooses (a JSONL "id", a TAC <Section id>, each part of a folder input's relative path)
# becomes a file name only through `safe_stem`, and the files of one output folder are handed out by one
# `FileNamer`. A name is used as it is or refused, never rewritten: the output of id X is X.<suffix>, and no
# rewriting can make two ids one name. A "/" is refused, not made a folder: data does not choose where in
# the output a file goes.

# NAME_MAX is 255 bytes on ext4, XFS, btrfs and APFS (255 UTF-16 units on NTFS); 55 are left for what other
# tools add to a name (editors' backup suffixes, a zip's folder).
MAX_NAME_BYTES = 200
# Windows device names: there `CON.txt` or `nul.ann` opens the device, whatever the suffix.
_DEVICE_NAME = re.compile(r"(con|prn|aux|nul|(com|lpt)[0-9\u00b9\u00b2\u00b3])(\..*)?", re.IGNORECASE)
# Characters no file name may hold: they end a C string (NUL), break a line of a listing or a log, or are not text.
_NOT_IN_NAMES = {"Cc": "a control character", "Cs": "a lone surrogate (not text)", "Zl": "a line separator",
                 "Zp": "a paragraph separator"}


def _name_problem(name: str) -> str | None:
    """What keeps `name` from being one file name in any folder (see `safe_stem`), or None."""
    if not name:
        return "is empty"
    for char in name:
        kind = _NOT_IN_NAMES.get(unicodedata.category(char))
        if kind is not None:
            return f"holds {kind} (U+{ord(char):04X})"
    for separator in ("/", "\\"):
        if separator in name:
            return f"holds {separator!r}"  # a file name is one path component
    if name.startswith("."):
        return "starts with a dot"  # '..' climbs out; other such names are hidden, like our marker and temporaries
    if name[-1] in ". ":
        return "ends with a dot or space"  # Windows drops it: 'a.' and 'a' would be one file
    if _DEVICE_NAME.fullmatch(name):
        return "is a Windows device name"
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        return f"is {size:,} bytes of UTF-8, more than {MAX_NAME_BYTES}"
    return None


def safe_stem(name: str, where: str | Path, *, what: str = "a name", line: int | None = None,
              fix: str | None = None) -> str:
    """`name` itself when it can be one file name in any folder, else InputFormatError at where:line naming it.

    Refused: an empty name; a control character (NUL included), a lone surrogate, a line or paragraph separator;
    a ``/`` or ``\\``; a leading dot (``.``, ``..``, hidden files, and this folder's own marker and temporaries);
    a trailing dot or space; a Windows device name (CON, NUL, COM1... with any suffix); more than
    `MAX_NAME_BYTES` bytes of UTF-8. A name that passes is one path component: `folder / name` lies in `folder`."""
    problem = _name_problem(name)
    if problem is not None:
        raise InputFormatError(where, f"{what} usable as a file name", f"{shorten(name)}, which {problem}", line=line,
                               fix=fix)
    return name


def _caseless(name: str) -> str:
    # Unicode's caseless match: names that a case-insensitive, normalising file system (APFS, NTFS) takes as one
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


class FileNamer:
    """Hands out the file names of one output folder, so that no two documents share a file.

    Every name passes `safe_stem`, so every path lies inside `folder` (an `atomic_dir` temporary until the commit)
    whatever the data. A name another owner holds is refused, case and Unicode normalisation ignored (macOS and
    Windows ignore them: ``A.txt`` and ``a.txt`` are one file there), and so is a file where another owner has a
    folder (``a.txt`` beside the folder input's ``a.txt/b``); owners share folders. The refusal names both."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._taken: dict[str, tuple[str, bool]] = {}  # folded relative path -> (owner (where), is a folder)

    def files(self, parts: Sequence[str], suffixes: Sequence[str], *, owner: str, where: str | Path,
              line: int | None = None, fix: str | None = None) -> list[Path]:
        """`folder/parts[0]/.../parts[-1]<suffix>` for each suffix, claimed for `owner` (such as ``id 'a'``, found
        at where:line); InputFormatError when a name is unsafe or taken."""
        *folders, stem = parts
        names = [stem + suffix for suffix in suffixes]
        for name in [*folders, *names]:
            safe_stem(name, where, line=line, fix=fix)
        claims = [("/".join(folders[: i + 1]), True) for i in range(len(folders))]
        claims += [("/".join([*folders, name]), False) for name in names]
        keys = [_caseless(relative) for relative, _ in claims]
        for key, (relative, is_folder) in zip(keys, claims, strict=True):
            held = self._taken.get(key)
            if held is not None and not (is_folder and held[1]):
                raise InputFormatError(where, "distinct output file names (case ignored, as on macOS and Windows)",
                                       f"{owner} and {held[0]} both named {relative}", line=line,
                                       fix="rename one of them")
        location = f"{where}:{line}" if line is not None else str(where)
        for key, (_, is_folder) in zip(keys, claims, strict=True):
            self._taken.setdefault(key, (f"{owner} ({location})", is_folder))
        return [self.folder.joinpath(*folders, name) for name in names]


# Write errors that only the writing sees; the exception names no file (or our temporary), so it is
# given the output's name: `error: out.jsonl: No space left on device`, not `a file`.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@contextlib.contextmanager
def _name_write_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        text = str(exc)
        full = exc.errno in _WRITE_ERRNOS or "No space left" in text or "Disk quota" in text
        if full and (exc.filename is None or is_temporary(exc.filename)):
            exc.filename = str(path)
        raise


def _raced(path: Path) -> ConfigError:
    return ConfigError(f"{path}: expected to create it, found it created by someone else while this run worked; "
                       "left as it is (pass --overwrite to replace it, or choose a new name)")


@functools.cache
def _renameat2():
    """libc's renameat2 (Linux, glibc >= 2.28), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def rename_no_replace(src: str | Path, dst: str | Path) -> None:
    """Rename `src` to `dst`, never replacing what is at `dst` (FileExistsError then).

    renameat2(RENAME_NOREPLACE) makes that one atomic step where the kernel and file system have it;
    elsewhere a check then a rename, whose window is short (and a folder never replaces a non-empty one).
    """
    function = _renameat2()
    if function is not None:
        if function(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):  # unsupported: fall back
            raise OSError(code, os.strerror(code), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def _commit_file(tmp: Path, path: Path) -> None:
    key = _key(path)
    if key not in _NO_REPLACE:
        os.replace(tmp, path)
        return
    # A hard link fails on anything at `path`: an exclusive create of the finished file (atomic_file removes tmp).
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _raced(path) from None
    except OSError:  # a file system without hard links
        try:
            rename_no_replace(tmp, path)
        except FileExistsError:
            raise _raced(path) from None
    _NO_REPLACE.discard(key)  # ours now: a second write of it in this run replaces it


def _commit_dir(tmp: Path, path: Path) -> None:
    key = _key(path)
    if key in _NO_REPLACE:
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):  # the empty folder check_output accepted; kept if filled since
                path.rmdir()
        try:
            rename_no_replace(tmp, path)
        except FileExistsError:
            raise _raced(path) from None
        _NO_REPLACE.discard(key)
        return
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
        os.replace(path, old / "old")
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on failure remove it.

    A crash or an error therefore never leaves a half-written file where a good one stood. An output
    that `check_output` checked without `overwrite` is created exclusively: a file that appeared there
    meanwhile is left as it is (ConfigError).
    """
    path = Path(path)
    tmp = None
    try:
        with _name_write_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(path.parent)
            fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
            os.close(fd)
            tmp = Path(tmp_name)
            yield tmp
            os.chmod(tmp, _umask_mode(0o666))
            _commit_file(tmp, path)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` (a folder) whole.

    The folder gets our `MARKER`; a non-empty folder without it is never replaced (ConfigError), and
    one checked without `overwrite` is not replaced by this write either (see `atomic_file`).
    """
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / MARKER).is_file():
        raise ConfigError(f"{path} is a folder that linker did not write (no {MARKER} in it); not replacing it")
    tmp = None
    try:
        with _name_write_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(path.parent)
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
            yield tmp
            (tmp / MARKER).write_text(json.dumps({"written_by": "linker", "pid": os.getpid()}) + "\n")
            os.chmod(tmp, _umask_mode(0o777))
            _commit_dir(tmp, path)
    finally:
        if tmp is not None:
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
    cache (`linker.folders.cache_root`, e5-small converted there) ``<linker-cache>/...``, and installed
    packages (an encoder shipped on PyPI) ``<site-packages>/...``, wherever the environment lives.
    Other absolute paths are left as they are."""
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
