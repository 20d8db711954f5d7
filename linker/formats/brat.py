"""brat standoff: ``.ann`` annotation files beside the ``.txt`` they point into.

Reader: every line is checked (``ID<TAB>...``; text-bound ``T1<TAB>Type START END[;START END]<TAB>text``
with START <= END, unique ids, a non-empty text), and, when the ``.txt`` is there, every span
against it: its offsets inside the text and its text equal to the slices (fragments joined by a
space, as brat writes them). A mismatch raises InputFormatError naming the ``.ann`` and line, or,
with ``lenient``, drops that annotation and records it in `BratDoc.skipped`.

Every line is capped at ``ReadLimits.max_line_bytes`` (a span's text included) and every ``.ann``
and ``.txt`` at ``max_document_bytes``, zip members by their decompressed bytes. Normalisation lines
``N<n><TAB>Reference T<i> <db>:<id><TAB><name>`` are read back into `BratDoc.normalizations`.

Writer: the document's lines as read, plus one normalisation line
``N<n><TAB>Reference T<i> <db>:<id><TAB><name>`` per linked text-bound annotation. brat has no
escapes: a db or id that is not one token (white space, a control character, a ``:`` in the db)
is refused, and the name, a label only, is cleaned (`linker.formats.clean_label`).

Sources: a folder, a zip (read in place; ``__MACOSX`` entries ignored) or a single ``.ann`` file.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError, shorten
from linker.fileio import READ_ERRORS, decode_line, read_bounded, read_failure
from linker.formats import (DEFAULT_LIMITS, ReadLimits, check_document_size, check_identifier, clean_label,
                            read_document)

# An id is one printable token (no control character either: the writer repeats it in N lines).
_BRAT_ID = re.compile(r"^([A-Za-z]|#|\*)([0-9]*)([^\s\x00-\x1f\x7f-\x9f]*)$")
# Offsets of at most 18 digits: int() refuses more than 4,300 with a ValueError, and no text is that long.
_BRAT_SPANS = re.compile(r"^[0-9]{1,18} [0-9]{1,18}(;[0-9]{1,18} [0-9]{1,18})*$")
_REFERENCE = re.compile(r"^Reference (\S+) ([^\s:]+):(\S+)$")


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
class BratNormalization:
    """A normalisation line ``N1<TAB>Reference T1 db:id<TAB>name`` as read."""

    line: int
    nid: str
    target: str
    db: str
    concept_id: str
    name: str


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
    normalizations: tuple[BratNormalization, ...] = ()


@dataclass(frozen=True)
class BratSource:
    """Where one document's .ann (and .txt, if any) can be read from, without reading it yet."""

    name: str
    read_ann: Callable[[], bytes]
    read_txt: Callable[[], bytes] | None
    limits: ReadLimits = DEFAULT_LIMITS


def parse_brat(
    name: str | Path, raw: bytes, text: str | None = None, *, lenient: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> BratDoc:
    """Check the lines of one .ann file (and its spans against `text`); see the module docstring."""
    lines: list[str] = []
    entities: list[BratEntity] = []
    notes: dict[str, str] = {}
    references: list[BratNormalization] = []
    skipped: list[str] = []
    max_n = 0
    tids: set[str] = set()
    for number, raw_line in enumerate(raw.splitlines(), start=1):
        if len(raw_line) > limits.max_line_bytes:  # one span's text is one line: this caps it too
            raise InputFormatError(name, f"lines of at most {limits.max_line_bytes:,} bytes", "a longer line",
                                   line=number, fix="raise --max-line-bytes if this line is genuine")
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
            max_n = max(max_n, int(digits[:18]))
            head, _, label = rest.partition("\t")
            if reference := _REFERENCE.match(head):
                references.append(BratNormalization(number, ann_id, *reference.groups(), label))
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
    return BratDoc(Path(str(name)), tuple(lines), tuple(entities), max_n + 1, notes, text, tuple(skipped),
                   tuple(references))


def _span_problem(spans: Sequence[tuple[int, int]], given: str, text: str) -> tuple[str, str] | None:
    """(expected, found) when a span does not fit the document text, else None."""
    beyond = [(s, e) for s, e in spans if e > len(text)]
    if beyond:
        return f"offsets inside the .txt ({len(text):,} characters)", f"{beyond[0][0]} {beyond[0][1]}"
    # Lengths first: a short line may repeat one long fragment many times ("0 30000000;0 30000000;..."),
    # whose joined text would be far larger than any line. Only text of the given length is built.
    length = sum(e - s for s, e in spans) + len(spans) - 1
    expected = " ".join(text[s:e] for s, e in spans) if length == len(given) else \
        " ".join(text[s:min(e, s + 61)] for s, e in spans[:61])
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
                        (lambda: read_document(txt, limits)) if txt.is_file() else None, limits)
    return read_source(source, lenient=lenient)


def read_source(source: BratSource, *, lenient: bool = False) -> BratDoc:
    """Read and check one document of `brat_sources` (within the caps it was listed with)."""
    text = None if source.read_txt is None else _decode_text(source.read_txt())
    return parse_brat(source.name, source.read_ann(), text, lenient=lenient, limits=source.limits)


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
                             (lambda txt=txt: read_document(txt, limits)) if txt.is_file() else None, limits)
        return
    if not zipfile.is_zipfile(path):
        if path.suffix == ".ann":
            txt = path.with_suffix(".txt")
            yield BratSource(str(path), lambda: read_document(path, limits),
                             (lambda: read_document(txt, limits)) if txt.is_file() else None, limits)
            return
        raise InputFormatError(path, "a folder or zip of brat .ann files, or one .ann file", "another kind of file")
    try:
        archive = zipfile.ZipFile(path)
    except READ_ERRORS as exc:
        raise read_failure(exc, path) from None
    members = {info.filename: info for info in archive.infolist()}

    def reader(name: str) -> Callable[[], bytes]:
        def read() -> bytes:
            where = f"{path}!{name}"
            check_document_size(where, members[name].file_size, limits)  # a header that admits it is too big
            try:
                with archive.open(name) as handle:  # the header may understate: the read stops past the cap
                    return read_bounded(handle, where, limits.max_document_bytes)
            except READ_ERRORS as exc:  # CRC mismatch, corrupt deflate data, encryption, unknown compression
                raise read_failure(exc, where) from None

        return read

    for name in sorted(members):
        if name.endswith(".ann") and "__MACOSX" not in name.split("/"):
            txt = name[:-4] + ".txt"
            yield BratSource(f"{path}!{name}", reader(name), reader(txt) if txt in members else None, limits)


_FIX_ID = "the index holds this value; rebuild its concept table with the current linker, which refuses such ids"


def brat_lines(doc: BratDoc, normalisations: Sequence[tuple[str, str, str] | None]) -> list[str]:
    """The document's lines plus one normalisation line per entity given (db, id, name) for; None = none.

    db and id are refused unless they are one token (brat cannot escape them, and a line break in
    either would inject annotations); the name is cleaned to one line of printable text.
    """
    out = list(doc.lines)
    n = doc.next_n
    for entity, norm in zip(doc.entities, normalisations, strict=True):
        if norm is None:
            continue
        db, concept_id, name = norm
        check_identifier(db, f"the database name of the normalisation of {entity.tid}", where=doc.path,
                         line=entity.line, forbid=":", fix="pass --db with a name such as UMLS or MedDRA")
        check_identifier(concept_id, f"the concept id of the normalisation of {entity.tid}", where=doc.path,
                         line=entity.line, fix=_FIX_ID)
        out.append(f"N{n}\tReference {entity.tid} {db}:{concept_id}\t{clean_label(name)}")
        n += 1
    return out


def write_brat(lines: Sequence[str], target: Path) -> None:
    """Write .ann lines (as from `brat_lines`) to `target`, creating its folder."""
    for number, line in enumerate(lines, start=1):
        if "\n" in line or "\r" in line:  # the reader splits there: the line would become two
            raise InputFormatError(target, "brat lines without a line break inside", shorten(line), line=number)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


__all__ = ["BratDoc", "BratEntity", "BratNormalization", "BratSource", "brat_lines", "brat_sources", "parse_brat",
           "read_brat", "read_source", "write_brat"]
