"""Mention-file formats: one reader and one writer per format, shared by `normalize`, `eval` and `train`.

| module | format | reader | writer |
|---|---|---|---|
| `jsonl` | one span per line, ``{"text", "id"?, "lang"?, ...}`` | `read_jsonl` | `write_jsonl` |
| `brat` | standoff ``.ann`` beside its ``.txt`` (folder, zip or one file) | `read_brat`, `brat_sources` | `write_brat` |
| `ade_xml` | TAC 2017 ADR / ADE Eval drug labels | `read_ade_xml` | `write_ade_xml` |
| `pubtator` | PubTator title/abstract/annotation lines (NCBI-disease, BC5CDR) | `read_pubtator` | `write_pubtator` |
| `codiesp` | CodiEsp ``*X.tsv`` rows | `read_codiesp` | `write_codiesp` |
| `mention_lists` | BioSyn ``*.concept``, ``id<TAB>mention`` and ``id||mention`` lists | `read_biosyn`, `read_id_list` | `write_biosyn`, `write_id_list` |

Readers check what they read once, here, so that a check holds for every command: a malformed
line raises `InputFormatError` naming file and line. Every reader is bounded in memory by
`ReadLimits`: a line longer than ``max_line_bytes`` or a document (a brat ``.ann``/``.txt``, an XML
label) larger than ``max_document_bytes`` is refused before it is held whole, gzip and zip members
counted by their decompressed bytes (`linker.fileio`'s reading layer).

Writers follow one rule (`check_identifier`, `check_field`, `clean_label` below): what a format
cannot hold is refused with one line naming the field and value, except a display label (a concept
name written beside a normalisation), which is cleaned; so every file a writer writes reads back
through its own reader unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.fileio import MAX_DOCUMENT_BYTES, MAX_LINE_BYTES, open_binary, read_bounded

# Above this a cap protects nothing (and `readline(n)` needs n to fit a C size_t): 1 TiB.
_MAX_CAP = 1 << 40


@dataclass(frozen=True)
class ReadLimits:
    """Size caps of every reader (`linker.fileio`'s reading layer); the defaults are far above any real
    corpus line or document."""

    max_line_bytes: int = MAX_LINE_BYTES  # 1 MiB: a JSONL span, a PubTator abstract, a brat line, a TSV row
    max_document_bytes: int = MAX_DOCUMENT_BYTES  # 64 MiB: one brat .ann or .txt, one XML drug label

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_document_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_CAP:
                raise ConfigError(f"--{name.replace('_', '-')}: expected a whole number of bytes from 1 to "
                                  f"{_MAX_CAP:,} (1 TiB), found {shorten(str(value), 40)}")


DEFAULT_LIMITS = ReadLimits()


def check_document_size(path: str | Path, size: int, limits: ReadLimits) -> None:
    """Refuse a document whose size is known (a file's, a zip header's) above the cap, before reading it."""
    if size > limits.max_document_bytes:
        raise InputFormatError(
            path, f"a document of at most {limits.max_document_bytes:,} bytes", f"{size:,} bytes",
            fix="raise --max-document-bytes if this file is genuine",
        )


def read_document(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> bytes:
    """The bytes of one document file (decompressed when it is a .gz), refused above
    `limits.max_document_bytes`: a regular file by its size before it is read, anything else (a
    .gz, a device, a pipe) after reading at most one byte past the cap."""
    path = Path(path)
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "a special file (device, pipe or socket)" if path.exists() else None
        raise MissingInputError(f"{path}: expected a file, found {kind}" if kind else f"{path}: no such file")
    if not path.name.lower().endswith(".gz"):
        check_document_size(path, path.stat().st_size, limits)
    with open_binary(path) as handle:
        return read_bounded(handle, path, limits.max_document_bytes)


# ----------------------------------------------------------------------------- what a writer may write
#
# One rule for every writer: an identifier (a concept id, a span or annotation id, a database or
# source name) is one token of printable characters, refused when it holds anything else, because
# no format can escape it (brat's ``Reference T1 db:id``, PubTator's tab-separated ids) and a
# changed id is a wrong answer. Free text that is only a label (the concept name brat and the ADE
# XML write beside a normalisation) is cleaned instead: `clean_label`. Text that must stay equal to
# its document (a mention, a title) is refused by `check_field` when it holds what the format's
# lines cannot hold.

# Characters that end a line for some reader (Python's str.splitlines splits on all of these), other
# C0/C1 controls (NUL, \x01..), lone surrogates (not UTF-8) and U+FFFE/U+FFFF (not XML).
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
# An identifier also may not hold white space nor the invisible format characters (a byte-order mark
# at the start of a file is dropped by every reader, and zero-width ones make two ids look alike).
_NOT_TOKEN = re.compile("[\\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060\ufeff\ud800-\udfff\ufffe\uffff]")


def _problem(value: str, pattern: re.Pattern, forbid: str) -> str | None:
    """What makes `value` unwritable: the first offending character, described, else None."""
    match = pattern.search(value)
    bad = match.group() if match else next((c for c in value if c in forbid), None)
    if bad is None:
        return None
    at = value.index(bad)
    kind = ("a lone surrogate" if "\ud800" <= bad <= "\udfff" else
            "a control character" if bad in _LINE_BREAKS or ord(bad) < 0x20 or 0x7f <= ord(bad) <= 0x9f else
            "white space" if bad.isspace() else "the character")
    return f"{kind} {bad!r} at character {at} of {shorten(value, 60)}"


def check_identifier(value: object, field: str, *, where: str | Path | None = None, line: int | None = None,
                     forbid: str = "", fix: str | None = None) -> str:
    """`value` as an identifier every format can hold: a non-empty string without white space, control
    characters, lone surrogates or any of `forbid`; else InputFormatError naming `field` (and `where`).

    Called where ids enter (terminology sources, ``--db``) and again by every writer that writes one,
    so an index built before this check still cannot inject a line into an output.
    """
    location = field if where is None else where
    what = ("one token" if where is None else f"{field} as one token") + " without white space or control characters"
    what += f" or {' '.join(repr(c) for c in forbid)}" if forbid else ""
    if not isinstance(value, str) or not value:
        raise InputFormatError(location, what, repr(value) if not isinstance(value, str) else "an empty value",
                               line=line, fix=fix)
    problem = _problem(value, _NOT_TOKEN, forbid)
    if problem is not None:
        raise InputFormatError(location, what, problem, line=line, fix=fix)
    return value


def check_field(value: str, field: str, *, where: str | Path, line: int | None = None, forbid: str = "") -> str:
    """`value` as text inside one line of a line-based format: no line break of any reader, no other
    control character but TAB, no lone surrogate, none of `forbid` (the format's separator); else
    InputFormatError naming the field and value."""
    problem = _problem(value, _UNSAFE, forbid)
    if problem is not None:
        separators = f" without {' '.join(repr(c) for c in forbid)}" if forbid else ""
        raise InputFormatError(where, f"{field} that fits on one line of the format{separators}", problem, line=line)
    return value


def clean_label(value: str) -> str:
    """A display label as every format can hold it: each control character, line separator or lone
    surrogate becomes a space (a surrogate U+FFFD), and runs of white space one space."""
    if _UNSAFE.search(value):
        value = _UNSAFE.sub(lambda m: "\ufffd" if "\ud800" <= m.group() <= "\udfff" else " ", value)
    return " ".join(value.split())


_OFFSET = re.compile("[0-9]{1,18}")


def parse_offset(value: str) -> int | None:
    """A character offset written as ASCII digits, else None. Eighteen digits at most: Python refuses
    to convert a number of more than 4,300 digits with a ValueError, and no text is that long."""
    return int(value) if _OFFSET.fullmatch(value) else None


def input_files(input_path: Path, suffix: str) -> list[Path]:
    """The file itself, or every `suffix` file below a folder (sorted, so output order is stable)."""
    if input_path.is_file():
        return [input_path]
    if input_path.is_dir():
        files = sorted(input_path.rglob(f"*{suffix}"))
        if not files:
            raise MissingInputError(f"{input_path}: no {suffix} files in this folder")
        return files
    raise MissingInputError(f"{input_path}: no such file or folder")


__all__ = ["DEFAULT_LIMITS", "ReadLimits", "check_document_size", "check_field", "check_identifier", "clean_label",
           "input_files", "parse_offset", "read_document"]
