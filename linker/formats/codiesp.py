"""CodiEsp ``*X.tsv``: ``doc<TAB>DIAGNOSTICO|PROCEDIMIENTO<TAB>code<TAB>mention<TAB>start end[;start end]``.

The writer refuses (one line naming the field) what a row cannot hold: a doc or code that is not
one token, a mention with a tab, a line break or another control character, a label other than the
two, offsets not written as ``start end[;start end]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_field, check_identifier

LABELS = ("DIAGNOSTICO", "PROCEDIMIENTO")
# Offsets as the corpus writes them; 18 digits at most (int() refuses more than 4,300 with a ValueError).
_OFFSETS = re.compile(r"^[0-9]{1,18} [0-9]{1,18}(;[0-9]{1,18} [0-9]{1,18})*$")
_NUMBER = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class CodiespRow:
    line: int
    doc: str
    label: str  # DIAGNOSTICO or PROCEDIMIENTO
    code: str  # as written, e.g. s22.49xa
    text: str
    start: int  # first offset of the first fragment
    end: int  # last offset of the last fragment
    offsets: str  # as written, "start end[;start end]"


def read_codiesp(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[CodiespRow]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5 or fields[1] not in LABELS:
            raise InputFormatError(path, "'doc<TAB>DIAGNOSTICO|PROCEDIMIENTO<TAB>code<TAB>mention<TAB>start end[;start end]'",
                                   shorten(line), line=number)
        offsets = [int(x) for x in _NUMBER.findall(fields[4])] if len(fields[4]) <= 1000 else []
        if not offsets:
            raise InputFormatError(path, "character offsets 'start end'", shorten(fields[4]), line=number)
        yield CodiespRow(number, fields[0], fields[1], fields[2], fields[3], min(offsets), max(offsets), fields[4])


def write_codiesp(out: TextIO, rows: Iterable[CodiespRow]) -> None:
    for r in rows:
        where = f"CodiEsp row {shorten(r.doc, 40)}"
        check_identifier(r.doc, "the document id", where=where)
        check_identifier(r.code, "the code", where=where)
        check_field(r.text, "the mention text", where=where, forbid="\t")
        if r.label not in LABELS:
            raise InputFormatError(where, f"the label {' or '.join(LABELS)}", shorten(str(r.label)))
        if not isinstance(r.offsets, str) or not _OFFSETS.match(r.offsets):
            raise InputFormatError(where, "offsets 'start end[;start end]'", shorten(str(r.offsets)))
        out.write(f"{r.doc}\t{r.label}\t{r.code}\t{r.text}\t{r.offsets}\n")


__all__ = ["LABELS", "CodiespRow", "read_codiesp", "write_codiesp"]
