"""Flat mention lists with gold ids, as BioSyn and simple test sets write them.

- BioSyn's processed ``*.concept`` files: ``doc||start|end||type||mention||cui``.
- ``id<TAB>mention[<TAB>lang]`` (``tsv``) and ``id||mention`` (``query``) lists.

Ids are kept as written (``A|B+C``); `linker.eval.datasets` reads alternatives and parts from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits


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
        yield BiosynRow(number, fields[0], int(start) if start.isdigit() else -1, int(end) if end.isdigit() else -1,
                        fields[2], fields[3], fields[4])


def write_biosyn(out: TextIO, rows: Iterable[BiosynRow]) -> None:
    for r in rows:
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
    sep = SEPARATORS[kind][0]
    for r in rows:
        out.write(sep.join([r.ids, r.text] + ([r.lang] if r.lang else [])) + "\n")


__all__ = ["SEPARATORS", "BiosynRow", "ListRow", "read_biosyn", "read_id_list", "write_biosyn", "write_id_list"]
