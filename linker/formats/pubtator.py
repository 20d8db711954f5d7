"""PubTator (NCBI-disease, BC5CDR): ``doc|t|title``, ``doc|a|abstract``, then one tab-separated line per
annotation ``doc<TAB>start<TAB>end<TAB>mention<TAB>type<TAB>ids[<TAB>part texts]``; blank lines between
documents. BC5CDR's relation lines ``doc<TAB>CID<TAB>id<TAB>id`` carry no mention and are skipped.

The reader leaves the ids as written (``MESH:D…``, ``A|B``, ``-1``): what they mean is the
evaluation's business (`linker.datasets`).

PubTator has no escapes. The writer refuses (one line naming the field) a document id that is not
one token or holds ``|``, a title, abstract or annotation field that holds a line break or another
control character, a tab inside a tab-separated field, and offsets that are not whole numbers >= 0,
so every file it writes reads back the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import re

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_field, check_identifier, parse_offset

# `doc|t|title` / `doc|a|abstract`: a document id holds no `|` and no tab, so an annotation line
# (`doc<TAB>...`) whose mention text holds "|t|" is never taken for a title.
_TEXT_LINE = re.compile(r"^([^\t|]*)\|([ta])\|")


@dataclass(frozen=True)
class PubtatorAnnotation:
    line: int
    doc: str
    start: int
    end: int
    text: str
    type: str
    ids: str
    doc_text: tuple[str, ...]  # the document's title and abstract (as read before this line)


def read_pubtator(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[PubtatorAnnotation]:
    """Yield the annotations of one PubTator file, in file order."""
    doc_text: dict[str, list[str]] = {}
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if text_line := _TEXT_LINE.match(line):
            doc_text.setdefault(text_line.group(1), []).append(line[text_line.end():])
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) == 4 and fields[1] == "CID":  # BC5CDR chemical-induced-disease relation
            continue
        if len(fields) < 6:
            raise InputFormatError(path, "a PubTator title/abstract line or "
                                   "'doc<TAB>start<TAB>end<TAB>mention<TAB>type<TAB>ids'",
                                   shorten(line), line=number)
        doc, start, end, text, type_, ids = fields[:6]
        first, last = parse_offset(start), parse_offset(end)
        if first is None or last is None:
            raise InputFormatError(path, "integer start and end offsets", f"{shorten(start, 30)} {shorten(end, 30)}",
                                   line=number)
        yield PubtatorAnnotation(number, doc, first, last, text, type_, ids, tuple(doc_text.get(doc, ())))


def write_pubtator(out: TextIO, doc: str, title: str, abstract: str, annotations: Iterable[PubtatorAnnotation]) -> None:
    """One document: its title and abstract lines, its annotation lines, and a blank line.

    Everything is checked before the document's first line is written (see the module docstring).
    """
    where = f"PubTator document {shorten(doc, 40)}"
    check_identifier(doc, "the document id", where=where, forbid="|")
    check_field(title, "the title", where=where)
    check_field(abstract, "the abstract", where=where)
    lines = [f"{doc}|t|{title}", f"{doc}|a|{abstract}"]
    for a in annotations:
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (a.start, a.end)):
            raise InputFormatError(where, "start and end offsets as whole numbers >= 0", f"{a.start!r} {a.end!r}")
        for field, value in (("mention text", a.text), ("type", a.type), ("ids", a.ids)):
            check_field(value, f"the annotation {field}", where=where, forbid="\t")
        lines.append(f"{doc}\t{a.start}\t{a.end}\t{a.text}\t{a.type}\t{a.ids}")
    out.write("\n".join(lines) + "\n\n")


__all__ = ["PubtatorAnnotation", "read_pubtator", "write_pubtator"]
