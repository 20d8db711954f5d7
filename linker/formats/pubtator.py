"""PubTator (NCBI-disease, BC5CDR): ``doc|t|title``, ``doc|a|abstract``, then one tab-separated line per
annotation ``doc<TAB>start<TAB>end<TAB>mention<TAB>type<TAB>ids[<TAB>part texts]``; blank lines between
documents. BC5CDR's relation lines ``doc<TAB>CID<TAB>id<TAB>id`` carry no mention and are skipped.

The reader leaves the ids as written (``MESH:D…``, ``A|B``, ``-1``): what they mean is the
evaluation's business (`linker.eval.datasets`).
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
        head = line[:40]
        if "|t|" in head or "|a|" in head:
            doc, _, text = line.partition("|t|" if "|t|" in head else "|a|")
            doc_text.setdefault(doc, []).append(text)
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
        if not (start.isdigit() and end.isdigit()):
            raise InputFormatError(path, "integer start and end offsets", f"{start!r} {end!r}", line=number)
        yield PubtatorAnnotation(number, doc, int(start), int(end), text, type_, ids, tuple(doc_text.get(doc, ())))


def write_pubtator(out: TextIO, doc: str, title: str, abstract: str, annotations: Iterable[PubtatorAnnotation]) -> None:
    """One document: its title and abstract lines, its annotation lines, and a blank line."""
    out.write(f"{doc}|t|{title}\n{doc}|a|{abstract}\n")
    for a in annotations:
        out.write(f"{doc}\t{a.start}\t{a.end}\t{a.text}\t{a.type}\t{a.ids}\n")
    out.write("\n")


__all__ = ["PubtatorAnnotation", "read_pubtator", "write_pubtator"]
