"""Flat mention lists with gold ids, as BioSyn and simple test sets write them.

- BioSyn's processed ``*.concept`` files: ``doc||start|end||type||mention||cui``.
- ``id<TAB>mention[<TAB>lang]`` (``tsv``) and ``id||mention`` (``query``) lists.

Ids are kept as written (``A|B+C``); `linker.datasets` reads alternatives and parts from them.

The writers refuse (one line naming the field) what a line cannot hold: a line break or another
control character, the separator (a tab, or ``||`` and a ``|`` at either end of a field of the
``||`` formats), an empty mention or id, and ids or documents that are not one token.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_field, check_identifier, parse_offset


@dataclass(frozen=True)
class BiosynRow:
    line: int
    doc: str
    start: int  # -1 when not a number
    end: int
    type: str
    text: str
    ids: str


def read_biosyn(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[BiosynRow]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if not line.strip():
            continue
        fields = line.split("||")
        if len(fields) != 5 or "|" not in fields[1]:
            raise InputFormatError(path, "'doc||start|end||type||mention||cui'", shorten(line), line=number)
        start, _, end = fields[1].partition("|")
        first, last = parse_offset(start), parse_offset(end)
        yield BiosynRow(number, fields[0], -1 if first is None else first, -1 if last is None else last,
                        fields[2], fields[3], fields[4])


def _check_pipes(value: str, field: str, where: str) -> str:
    """A field of a ``||``-separated line: no ``||``, and no ``|`` at an end (``a|||b`` splits as a, |b)."""
    if "||" in value or value.startswith("|") or value.endswith("|"):
        raise InputFormatError(where, f"{field} without '||' inside or '|' at either end", shorten(value))
    return value


def write_biosyn(out: TextIO, rows: Iterable[BiosynRow]) -> None:
    for r in rows:
        where = f"BioSyn row {shorten(r.doc, 40)}"
        check_identifier(r.doc, "the document id", where=where)
        for field, value in (("type", r.type), ("mention text", r.text), ("ids", r.ids)):
            _check_pipes(check_field(value, f"the {field}", where=where), f"the {field}", where)
        _check_pipes(r.doc, "the document id", where)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= -1 for v in (r.start, r.end)):
            raise InputFormatError(where, "start and end as whole numbers (-1 for none)", f"{r.start!r} {r.end!r}")
        out.write(f"{r.doc}||{r.start}|{r.end}||{r.type}||{r.text}||{r.ids}\n")


@dataclass(frozen=True)
class ListRow:
    line: int
    ids: str
    text: str  # stripped
    lang: str | None  # the optional third column


SEPARATORS = {"tsv": ("\t", "'id<TAB>mention[<TAB>lang]'"), "query": ("||", "'id||mention'")}


def read_id_list(path: str | Path, kind: str, *, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ListRow]:
    """Rows of a ``tsv`` or ``query`` list (`kind`)."""
    sep, expected = SEPARATORS[kind]
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if not line.strip():
            continue
        fields = line.split(sep)
        if len(fields) not in (2, 3) or not fields[0].strip() or not fields[1].strip():
            raise InputFormatError(path, expected, shorten(line), line=number)
        yield ListRow(number, fields[0], fields[1].strip(), fields[2].strip() if len(fields) == 3 else None)


def write_id_list(out: TextIO, kind: str, rows: Iterable[ListRow]) -> None:
    """Rows as the reader reads them back: the mention and the language stripped (as `ListRow` holds them)."""
    sep = SEPARATORS[kind][0]
    for r in rows:
        where = f"{kind} list row {shorten(str(r.ids), 40)}"
        lang = (r.lang or "").strip()
        fields = [check_identifier(r.ids, "the ids", where=where), r.text.strip()] + ([lang] if lang else [])
        if not fields[1]:
            raise InputFormatError(where, "a non-empty mention", repr(r.text))
        for field, value in zip(("ids", "mention", "language"), fields):
            check_field(value, f"the {field}", where=where, forbid="\t" if sep == "\t" else "")
            if sep == "||":
                _check_pipes(value, f"the {field}", where)
        out.write(sep.join(fields) + "\n")


__all__ = ["SEPARATORS", "BiosynRow", "ListRow", "read_biosyn", "read_id_list", "write_biosyn", "write_id_list"]
