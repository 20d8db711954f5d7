"""brat standoff: ``.ann`` annotation files beside the ``.txt`` they point into.

Reader: every line is checked (``ID<TAB>...``; text-bound ``T1<TAB>Type START END[;START END]<TAB>text``
with START <= END, unique ids, a non-empty text), and, when the ``.txt`` is there, every span
against it: its offsets inside the text and its text equal to the slices (fragments joined by a
space, as brat writes them). A mismatch raises InputFormatError naming the ``.ann`` and line, or,
with ``lenient``, drops that annotation and records it in `BratDoc.skipped`.

Writer: the document's lines as read, plus one normalisation line
``N<n><TAB>Reference T<i> <db>:<id><TAB><name>`` per linked text-bound annotation.

Sources: a folder, a zip (read in place; ``__MACOSX`` entries ignored) or a single ``.ann`` file.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError, shorten
from linker.fileio import decode_line
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_document_size, read_document

_BRAT_ID = re.compile(r"^([A-Za-z]|#|\*)([0-9]*)(\S*)$")
_BRAT_SPANS = re.compile(r"^\d+ \d+(;\d+ \d+)*$")


@dataclass(frozen=True)
class BratEntity:
    """A text-bound annotation: its line, id, type, fragments (start, end) and text."""

    line: int
    tid: str
    type: str
    spans: tuple[tuple[int, int], ...]
    text: str

    @property
    def start(self) -> int:
        return min(s for s, _ in self.spans)

    @property
    def end(self) -> int:
        return max(e for _, e in self.spans)


@dataclass(frozen=True)
class BratDoc:
    """One .ann file: its lines as read (kept verbatim), its text-bound annotations and notes."""

    path: Path  # the .ann file; inside a zip, "archive.zip!member.ann"
    lines: tuple[str, ...]
    entities: tuple[BratEntity, ...]
    next_n: int  # first free number for a new N annotation
    notes: dict[str, str] = field(default_factory=dict)  # AnnotatorNotes: annotation id -> note
    text: str | None = None  # the .txt beside, when there is one
    skipped: tuple[str, ...] = ()  # lenient: one message per dropped annotation


@dataclass(frozen=True)
class BratSource:
    """Where one document's .ann (and .txt, if any) can be read from, without reading it yet."""

    name: str
    read_ann: Callable[[], bytes]
    read_txt: Callable[[], bytes] | None


def parse_brat(
    name: str | Path, raw: bytes, text: str | None = None, *, lenient: bool = False
) -> BratDoc:
    """Check the lines of one .ann file (and its spans against `text`); see the module docstring."""
    lines: list[str] = []
    entities: list[BratEntity] = []
    notes: dict[str, str] = {}
    skipped: list[str] = []
    max_n = 0
    tids: set[str] = set()
    for number, raw_line in enumerate(raw.splitlines(), start=1):
        line = decode_line(raw_line)
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        lines.append(line)
        if not line.strip():
            continue
        ann_id, tab, rest = line.partition("\t")
        match = _BRAT_ID.match(ann_id)
        if not tab or not match:
            raise InputFormatError(
                name, "a brat annotation line 'ID<TAB>...' (ID such as T1, R2, N3, #1)", shorten(line), line=number
            )
        kind, digits = match.group(1), match.group(2)
        if kind == "N" and digits:
            max_n = max(max_n, int(digits))
        if kind == "#":
            target = rest.split("\t", 1)
            head = target[0].split(" ")
            if len(head) == 2 and head[0] == "AnnotatorNotes":
                notes[head[1]] = target[1] if len(target) > 1 else ""
            continue
        if kind != "T":
            continue
        fields = rest.split("\t", 1)
        type_, _, span_text = fields[0].partition(" ")
        if len(fields) != 2 or not type_ or not _BRAT_SPANS.match(span_text):
            raise InputFormatError(
                name, "a text-bound line 'T1<TAB>Type START END[;START END]<TAB>text'", shorten(line), line=number
            )
        spans = tuple(tuple(map(int, s.split(" "))) for s in span_text.split(";"))
        if any(end < start for start, end in spans):
            raise InputFormatError(name, "span offsets with START <= END", repr(span_text), line=number)
        if ann_id in tids:
            raise InputFormatError(name, "unique annotation ids", f"{ann_id} a second time", line=number)
        tids.add(ann_id)
        if not fields[1].strip():
            raise InputFormatError(name, "a non-empty span text", repr(fields[1]), line=number)
        if text is not None:
            problem = _span_problem(spans, fields[1], text)
            if problem is not None:
                error = InputFormatError(name, problem[0], problem[1], line=number,
                                         fix="pass --lenient to skip such annotations")
                if not lenient:
                    raise error
                skipped.append(str(error).removesuffix(f" ({error.fix})"))
                continue
        entities.append(BratEntity(number, ann_id, type_, spans, fields[1]))  # type: ignore[arg-type]
    return BratDoc(Path(str(name)), tuple(lines), tuple(entities), max_n + 1, notes, text, tuple(skipped))


def _span_problem(spans: Sequence[tuple[int, int]], given: str, text: str) -> tuple[str, str] | None:
    """(expected, found) when a span does not fit the document text, else None."""
    beyond = [(s, e) for s, e in spans if e > len(text)]
    if beyond:
        return f"offsets inside the .txt ({len(text):,} characters)", f"{beyond[0][0]} {beyond[0][1]}"
    expected = " ".join(text[s:e] for s, e in spans)
    if expected != given:
        return f"the span text equal to the .txt at its offsets ({shorten(expected, 60)})", shorten(given, 60)
    return None


def read_brat(path: str | Path, *, limits: ReadLimits = DEFAULT_LIMITS, lenient: bool = False) -> BratDoc:
    """Read and check one .ann file and, when it is there, the .txt beside it."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such .ann file")
    txt = path.with_suffix(".txt")
    source = BratSource(str(path), lambda: read_document(path, limits),
                        (lambda: read_document(txt, limits)) if txt.is_file() else None)
    return read_source(source, lenient=lenient)


def read_source(source: BratSource, *, lenient: bool = False) -> BratDoc:
    text = None if source.read_txt is None else _decode_text(source.read_txt())
    return parse_brat(source.name, source.read_ann(), text, lenient=lenient)


def _decode_text(raw: bytes) -> str:
    # Offsets count characters of the text as brat reads it: UTF-8, without a byte-order mark.
    text = decode_line(raw)
    return text[1:] if text.startswith("\ufeff") else text


def brat_sources(path: Path, *, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[BratSource]:
    """Every .ann document of a folder, a zip or a single .ann file, in name order."""
    if path.is_dir():
        for file in sorted(path.rglob("*.ann")):
            txt = file.with_suffix(".txt")
            yield BratSource(str(file), lambda file=file: read_document(file, limits),
                             (lambda txt=txt: read_document(txt, limits)) if txt.is_file() else None)
        return
    if not zipfile.is_zipfile(path):
        if path.suffix == ".ann":
            txt = path.with_suffix(".txt")
            yield BratSource(str(path), lambda: read_document(path, limits),
                             (lambda: read_document(txt, limits)) if txt.is_file() else None)
            return
        raise InputFormatError(path, "a folder or zip of brat .ann files, or one .ann file", "another kind of file")
    archive = zipfile.ZipFile(path)
    members = {info.filename: info for info in archive.infolist()}

    def reader(name: str) -> Callable[[], bytes]:
        def read() -> bytes:
            where = f"{path}!{name}"
            check_document_size(where, members[name].file_size, limits)
            with archive.open(name) as handle:  # the size in the header may lie: read one byte past the cap
                data = handle.read(limits.max_document_bytes + 1)
            check_document_size(where, len(data), limits)
            return data

        return read

    for name in sorted(members):
        if name.endswith(".ann") and "__MACOSX" not in name.split("/"):
            txt = name[:-4] + ".txt"
            yield BratSource(f"{path}!{name}", reader(name), reader(txt) if txt in members else None)


def brat_lines(doc: BratDoc, normalisations: Sequence[tuple[str, str, str] | None]) -> list[str]:
    """The document's lines plus one normalisation line per entity given (db, id, name) for; None = none."""
    out = list(doc.lines)
    n = doc.next_n
    for entity, norm in zip(doc.entities, normalisations, strict=True):
        if norm is None:
            continue
        db, concept_id, name = norm
        name = " ".join(name.split())  # a tab or newline would break the line format
        out.append(f"N{n}\tReference {entity.tid} {db}:{concept_id}\t{name}")
        n += 1
    return out


def write_brat(lines: Sequence[str], target: Path) -> None:
    """Write .ann lines (as from `brat_lines`) to `target`, creating its folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


__all__ = ["BratDoc", "BratEntity", "BratSource", "brat_lines", "brat_sources", "parse_brat", "read_brat",
           "read_source", "write_brat"]
