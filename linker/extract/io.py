"""Inputs and outputs of `linker extract` / `linker annotate`.

Inputs (`read_inputs`): a ``.txt`` file; a ``.jsonl`` file of documents ``{"text", "id"?}`` (`linker.formats.jsonl`);
a TAC 2017 / ADE Eval ``.xml`` label (`linker.formats.ade_xml`; each ``<Section>`` a text); or a folder of them
(a brat folder: every ``.txt``, its ``.ann`` ignored; else every ``.xml``). Every input is read and checked before
the model loads.

Outputs (`write_output`, one writer per format in `linker.formats.writers.WRITERS`, each registered here with the
function `linker normalize` reads and writes that format back with, where it has one):

- ``jsonl``: one line per span, ``{"doc", "section"?, "start", "end", "text", "label", "status", "confidence"}``
  (offsets into the document, or into the section for XML), plus with `annotate` ``"code"``, ``"name"``,
  ``"link_confidence"``, ``"decision"``, ``"candidates"``; the lines are valid input of `linker normalize
  --format jsonl` (their ``text`` is the span).
- ``brat``: a folder with ``<doc>.txt`` and ``<doc>.ann``: ``T`` lines, ``A<n> Negated|Hypothetical T<i>`` for
  a negated / hypothetical event, ``#<n> AnnotatorNotes`` with confidence (and decision), and with `annotate`
  ``N<n> Reference T<i> <db>:<code>`` lines (`linker.formats.brat.brat_lines`). TAC input: one document per section.
- ``ade-xml``: a folder with one ``<doc>.xml`` label per input document: its sections and one ``AdverseReaction``
  ``<Mention>`` per positive adverse-event span (negated and hypothetical ones are no reaction of the drug and
  are left out, as TAC's scoring rule does); with `annotate`, ``<Reactions>`` with one MedDRA ``Normalization``
  per distinct string (`linker.formats.ade_xml.write_reactions`). A TAC input keeps its root element.

Inputs are streamed (`stream_inputs`, `batches`): a check pass reads every document and lets it go; the run reads them again
a batch at a time, so memory does not grow with their number; a document over 5 MB of text (`MAX_TEXT_BYTES`) is
refused, naming its file (and line and id).

File names (`output_files`): a document's id (a folder input's path, folder by folder) is used as it is, or refused
before the model loads: one that cannot be a file name (`linker.fileio.safe_stem`: a ``/`` or ``\\``, a control
character, a leading dot...), or two documents or sections on one file, case ignored. A span across a line break is
written to brat as a discontinuous span, one fragment per line.
"""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.fileio import FileNamer, atomic_dir, atomic_file, decode_line, describe_path, safe_stem
from linker.formats import ReadLimits, read_document
from linker.formats.writers import WRITERS, register_writer
from linker.normalize import normalize_ade_xml_path, normalize_brat_path, normalize_jsonl_path

OUTPUT_FORMATS = ("brat", "jsonl", "ade-xml", "labels")
INPUT_SUFFIXES = (".txt", ".jsonl", ".xml")
# The largest document the tagger takes by default (--max-document-bytes): 5 MB of text, some 1.2M word pieces,
# which it holds as arrays of 84 bytes a piece while it tags them (~100 MB). The readers' 64 MiB default let a 50 MB
# document through, and tagging it passed 3 GB.
MAX_TEXT_BYTES = 5_000_000
EXTRACT_LIMITS = ReadLimits(max_document_bytes=MAX_TEXT_BYTES)
_SIZE_FIX = "split it, or raise --max-document-bytes if this machine has the memory"
# Documents tagged (and linked, and written) together: enough texts for full batches of windows (BATCH in
# linker.extract.extractor), few enough characters that a batch holds a few MB.
BATCH_DOCS = 64
BATCH_CHARS = 1_000_000


@dataclass
class InputDoc:
    """One input document: its name (relative path without suffix, or the JSONL id), kind and texts."""

    name: str
    kind: str  # txt | jsonl | xml
    sections: list[tuple[str, str]]  # (section id, text); a .txt or JSONL document has one, id ""
    root: ET.Element | None = None  # xml: the parsed label
    path: Path | None = None
    spans: list[list] = field(default_factory=list)  # per section: spans (ExtractedSpan or annotated dicts)
    line: int | None = None  # jsonl: the document's line
    lang: str | None = None  # jsonl: the document's "lang" (None: `lang`, else detected)

    def name_parts(self) -> list[str]:
        """The parts of the name its output files take: a JSONL id is one, a folder input's path one per folder."""
        return [self.name] if self.kind == "jsonl" else self.name.split("/")


def _read_txt(path: Path, name: str, limits: ReadLimits) -> InputDoc:
    text = decode_line(read_document(path, limits))
    text = text.removeprefix("\ufeff")  # offsets count characters as brat does: no BOM
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise InputFormatError(path, "a text file", "a NUL byte (a binary file?)", line=line)
    if not text.strip():
        raise InputFormatError(path, "a non-empty text", "an empty file" if not text else "white space only", line=1)
    return InputDoc(name, "txt", [("", text)], path=path)


def _read_xml(path: Path, name: str, limits: ReadLimits) -> InputDoc:
    from linker.formats.ade_xml import read_ade_xml

    label = read_ade_xml(path, limits=limits)
    sections = [(s.get("id"), s.text or "") for s in label.root.find("Text")]
    return InputDoc(name, "xml", sections, root=label.root, path=path)


def _iter_jsonl(path: Path, limits: ReadLimits) -> Iterator[InputDoc]:
    from linker.formats.jsonl import jsonl_source, read_jsonl

    lines, where = jsonl_source(str(path), limits)
    for span in read_jsonl(lines(), where):
        name = str(span.record.get("id", span.line))
        size = len(span.text.encode("utf-8", "surrogatepass"))
        if size > limits.max_document_bytes:
            raise InputFormatError(where, f"a document text of at most {limits.max_document_bytes:,} bytes",
                                   f"{size:,} bytes (id {name!r})", line=span.line, fix=_SIZE_FIX)
        yield InputDoc(name, "jsonl", [("", span.text)], path=path, line=span.line, lang=span.lang)


def _documents(path: Path, limits: ReadLimits) -> Iterator[InputDoc]:
    """The documents of a file or folder, read one at a time as they are asked for."""
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            yield from _iter_jsonl(path, limits)
        elif suffix == ".xml":
            yield _read_xml(path, path.stem, limits)
        elif suffix == ".txt":
            yield _read_txt(path, path.stem, limits)
        else:
            raise InputFormatError(path, f"a {', '.join(INPUT_SUFFIXES)} file or a folder of them",
                                   f"a {suffix or 'suffix-less'} file")
    elif path.is_dir():
        texts = sorted(p for p in path.rglob("*.txt") if p.is_file())
        labels = [] if texts else sorted(p for p in path.rglob("*.xml") if p.is_file())
        if not texts and not labels:
            raise MissingInputError(f"{path}: no .txt or .xml files in this folder")
        read = _read_txt if texts else _read_xml
        for file in texts or labels:
            yield read(file, file.relative_to(path).with_suffix("").as_posix(), limits)
    elif path.exists():
        raise MissingInputError(f"{path}: expected a file or folder, found {describe_path(path)} (--input)")
    else:
        raise MissingInputError(f"{path}: no such file or folder (--input)")


def _id_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _check_unique_ids(path: Path, limits: ReadLimits, hashes: array) -> None:
    """Refuse a JSONL id given twice, at its second line. The check pass keeps an 8-byte hash per document, not the
    ids (1,000,000 documents: 8 MB); a hash seen twice is confirmed, or found a collision, by reading the ids again."""
    import numpy as np

    ordered = np.sort(np.frombuffer(hashes, dtype=np.uint64))
    twice = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not twice:
        return
    first: dict[str, int] = {}
    for doc in _documents(path, limits):
        if _id_hash(doc.name) in twice:
            if doc.name in first:
                raise InputFormatError(path, "unique document ids", f"id {doc.name!r} a second time (first on line "
                                       f"{first[doc.name]})", line=doc.line)
            first[doc.name] = doc.line


@dataclass(frozen=True)
class Inputs:
    """The documents of a checked input (`stream_inputs`), read again, one at a time, each time they are iterated: a
    run holds one batch of them, never all (a million one-line documents cost what one does)."""

    path: Path
    limits: ReadLimits
    count: int

    def __iter__(self) -> Iterator[InputDoc]:
        return _documents(self.path, self.limits)

    def __len__(self) -> int:
        return self.count


def stream_inputs(input_path: str | Path, limits: ReadLimits = EXTRACT_LIMITS, *, fmt: str = "jsonl") -> Inputs:
    """Every document of a file or folder (module docstring) read and checked, before any work, then let go; for a
    folder format `fmt`, the names of the files each will be written to as well (`document_files`). The documents,
    to iterate, read again as they are asked for (`Inputs`)."""
    path = Path(input_path)
    namer = None if fmt == "jsonl" else FileNamer(Path("."))
    hashes, count = array("Q"), 0
    for doc in _documents(path, limits):
        if doc.kind == "jsonl":
            hashes.append(_id_hash(doc.name))
        if namer is not None:
            document_files(doc, fmt, namer)
        count += 1
    if not count:  # only a JSONL file can hold no document: the other readers refuse an empty one
        raise InputFormatError(path, 'JSONL documents {"text": ...}', "no document", line=1)
    _check_unique_ids(path, limits, hashes)
    return Inputs(path, limits, count)


def read_inputs(input_path: str | Path, limits: ReadLimits = EXTRACT_LIMITS, *, fmt: str = "jsonl") -> list[InputDoc]:
    """`stream_inputs`, every document held in a list: for a few documents (tests, benchmarks); the CLI streams."""
    return list(stream_inputs(input_path, limits, fmt=fmt))


def batches(docs: Iterable[InputDoc], *, max_docs: int | None = None, max_chars: int | None = None
            ) -> Iterator[list[InputDoc]]:
    """`docs` in lists of at most `max_docs` documents (`BATCH_DOCS`) or about `max_chars` characters
    (`BATCH_CHARS`; a larger document is a list of its own), so that reading, tagging, linking and writing hold one
    list at a time."""
    max_docs, max_chars = max_docs or BATCH_DOCS, max_chars or BATCH_CHARS
    batch, chars = [], 0
    for doc in docs:
        size = sum(len(text) for _, text in doc.sections)
        if batch and (len(batch) >= max_docs or chars + size > max_chars):
            yield batch
            batch, chars = [], 0
        batch.append(doc)
        chars += size
    if batch:
        yield batch


def tag_documents(docs: Iterable[InputDoc], extractor, *, threshold: float | None = None, style: str = "auto",
                  assertion: str = "rules", linker=None, k: int = 1, lang: str | None = None,
                  review_below: float | None = None) -> Iterator[InputDoc]:
    """Each document with its spans (`linker.extract.annotate_documents`: tagged, and with `linker` coded), a batch
    at a time (`batches`) and yielded as soon as it is done, so that a writer taking them one by one
    (`write_output`) holds one batch, however many documents there are."""
    from linker.extract import REVIEW_BELOW, annotate_documents

    for batch in batches(docs):
        texts = [text for doc in batch for _, text in doc.sections]
        langs = [doc.lang for doc in batch for _ in doc.sections]  # a document's own lang wins over `lang`
        spans = annotate_documents(texts, model=extractor, linker=linker, k=k, lang=lang,
                                   langs=langs if any(langs) else None, threshold=threshold, style=style,
                                   assertion=assertion,
                                   review_below=REVIEW_BELOW if review_below is None else review_below)
        at = 0
        for doc in batch:
            doc.spans, at = spans[at:at + len(doc.sections)], at + len(doc.sections)
            yield doc


def check_format(fmt: str) -> None:
    if fmt not in OUTPUT_FORMATS:
        raise ConfigError(f"--format: expected one of {', '.join(OUTPUT_FORMATS)}, found {fmt!r}")


_NAME_FIX = "brat and ade-xml name each document's files after its id; change the id, or write --format jsonl"


def output_files(docs: list[InputDoc], fmt: str, folder: Path) -> list[list[list[Path]]]:
    """Per document, the files it is written to in `folder`: brat ``[<stem>.txt, <stem>.ann]`` per section (the stem
    ``<doc>`` or, for a TAC section, ``<doc>_<section id>``), ade-xml ``[<doc>.xml]``.

    Names go through `linker.fileio.safe_stem` and one `FileNamer`: an id that cannot be a file name, or two
    documents (or sections) on one file (``a_b`` and ``a`` section ``b``; ``A`` and ``a``), is an InputFormatError
    naming the id, so every file lies inside `folder` and none is written twice."""
    namer = FileNamer(folder)
    return [document_files(doc, fmt, namer) for doc in docs]


def document_files(doc: InputDoc, fmt: str, namer: FileNamer) -> list[list[Path]]:
    """`output_files` of one document, claimed from `namer`: one document at a time, for a stream of them."""
    where, line = doc.path or doc.name, doc.line
    what = "a document id" if doc.kind == "jsonl" else "a document name (its path in the input folder)"
    *folders, stem = [safe_stem(part, where, what=what, line=line, fix=_NAME_FIX) for part in doc.name_parts()]
    owner = f"document {shorten(doc.name)}"
    if fmt == "ade-xml":
        return [namer.files([*folders, stem], [".xml"], owner=owner, where=where, line=line)]
    files = []
    for sid, _ in doc.sections:
        if sid:
            safe_stem(sid, where, what="a <Section id>", fix=_NAME_FIX)
        files.append(namer.files([*folders, f"{stem}_{sid}" if sid else stem], [".txt", ".ann"],
                                 owner=owner + (f" section {shorten(sid)}" if sid else ""), where=where, line=line))
    return files


# ----------------------------------------------------------------------------- writers


def _field(span, key, default=None):
    return span.get(key, default) if isinstance(span, dict) else getattr(span, key, default)


def span_pieces(span) -> list[tuple[int, int]]:
    """A span's (start, end) pieces: its ``pieces`` when it is discontinuous, else its start and end."""
    pieces = _field(span, "pieces")
    return [tuple(piece) for piece in pieces] if pieces else [(_field(span, "start"), _field(span, "end"))]


def span_records(doc: InputDoc) -> list[dict]:
    """The JSONL records of a document's spans."""
    out = []
    for (sid, _), spans in zip(doc.sections, doc.spans, strict=True):
        for span in spans:
            record = {"doc": doc.name, **({"section": sid} if sid else {})}
            record.update({k: v for k, v in span.items() if not k.startswith("_")} if isinstance(span, dict)
                          else span.to_dict())
            out.append(record)
    return out


# Where a line of an .ann file ends for some reader: ours splits bytes at CR and LF, Python's str.splitlines at these.
_NO_LINE_BREAK = re.compile("[^\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+")


def _brat_fragments(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """A span's pieces between line breaks: a brat line holds none, so a span across one is written as a
    discontinuous ``START END;START END`` whose text is the pieces joined by a space, as brat itself writes it."""
    return [(m.start(), m.end()) for m in _NO_LINE_BREAK.finditer(text, start, end)] or [(start, end)]


def _source_db(span) -> str:
    """brat's database name for a coded span: its concept's source up to the first ':' as `linker normalize` writes
    it (hpo, icd10cm, umls...), but MedDRA for a MedDRA code (the name TAC 2017 and the ADE Eval use)."""
    candidates = _field(span, "_candidates") or ()
    family = candidates[0].source.split(":", 1)[0] if candidates else ""
    return "MedDRA" if family == "meddra" else family or "linker"


def _brat_document(doc: InputDoc, sid: str, text: str, spans: list, db: str | None, where: Path) -> list[str]:
    """The .ann lines of one text's spans, checked by the brat reader, plus normalisation lines."""
    from linker.formats.brat import brat_lines, parse_brat

    lines, notes, attributes = [], [], []
    for number, span in enumerate(spans, start=1):
        pieces = [fragment for start, end in span_pieces(span) for fragment in _brat_fragments(text, start, end)]
        offsets = ";".join(f"{s} {e}" for s, e in pieces)
        lines.append(f"T{number}\t{_field(span, 'label')} {offsets}\t{' '.join(text[s:e] for s, e in pieces)}")
        status = _field(span, "status", "positive")
        if status != "positive":
            attributes.append(f"A{len(attributes) + 1}\t{status.capitalize()} T{number}")
        note = f"confidence={_field(span, 'confidence'):.3f}"
        if _field(span, "decision") is not None:
            note += f" decision={_field(span, 'decision')}"
            if _field(span, "link_confidence") is not None:
                note += f" link_confidence={_field(span, 'link_confidence'):.3f}"
        notes.append(f"#{number}\tAnnotatorNotes T{number}\t{note}")
    raw = "\n".join([*lines, *attributes, *notes]).encode("utf-8")
    try:
        parsed = parse_brat(where, raw, text)  # what we write reads back through the reader
    except InputFormatError as exc:  # the reader's fix (--lenient) is for input files, not for this output
        raise InputFormatError(where, exc.expected, exc.found, line=exc.line) from None
    norms = [(db or _source_db(s), _field(s, "code"), _field(s, "name") or "") if _field(s, "code") else None
             for s in spans]
    return brat_lines(parsed, norms)


def _xml_label(doc: InputDoc, positive) -> tuple[ET.Element, list]:
    """The label to write: the input's (TAC) or a new <SubmissionLabel>, with the predicted mentions."""
    from linker.formats.ade_xml import AdeMention

    if doc.root is not None:
        root = doc.root
        for old in root.findall("Mentions") + root.findall("Relations") + root.findall("Reactions"):
            root.remove(old)
    else:
        root = ET.Element("SubmissionLabel", {"drug": doc.name.rsplit("/", 1)[-1]})
        text = ET.SubElement(root, "Text")
        section = ET.SubElement(text, "Section", {"id": "S1", "name": "text"})
        section.text = doc.sections[0][1]
    mentions = ET.SubElement(root, "Mentions")
    ade_mentions, kept = [], []
    number = 0
    for (sid, text), spans in zip(doc.sections, doc.spans, strict=True):
        sid = sid or "S1"
        for span in spans:
            if not positive(span):
                continue
            number += 1
            pieces = span_pieces(span)  # a discontinuous mention as TAC writes one: start="10,30" len="7,9"
            string = " ".join(text[s:e] for s, e in pieces)
            ET.SubElement(mentions, "Mention", {"id": f"M{number}", "section": sid, "type": "AdverseReaction",
                                                "start": ",".join(str(s) for s, _ in pieces),
                                                "len": ",".join(str(e - s) for s, e in pieces), "str": string})
            ade_mentions.append(AdeMention(f"M{number}", sid, "AdverseReaction", " ".join(string.split()), 0))
            kept.append(span)
    return root, list(zip(ade_mentions, kept))


def write_output(docs: Iterable[InputDoc], output: Path, fmt: str, *, db: str | None = None,
                 coded: bool = False, labels: Sequence[str] | None = None) -> int:
    """Write the documents' spans in `fmt` to `output` (a file for jsonl, a folder otherwise) with the writer
    `linker.formats.writers.WRITERS` holds for it; the spans written. `docs` is taken one document at a time (a
    stream: `tag_documents`). `db`: brat's database name of every code (default: each code's source, `_source_db`).
    `coded` (annotate): ade-xml labels get their <Reactions>, even an empty one. `labels`: the concept ids of
    ``labels`` (`linker.formats.doc_labels`)."""
    check_format(fmt)
    if fmt == "labels":  # the label list is the format's own option
        if labels is None:
            raise ConfigError("--format labels needs --labels LIST (a file of concept ids, one a line)")
        return WRITERS.get(fmt).write(docs, Path(output), labels=labels)
    return WRITERS.get(fmt).write(docs, Path(output), db=db, coded=coded)


@register_writer("jsonl", folder=False, normalize=normalize_jsonl_path)
def write_jsonl_spans(docs: Iterable[InputDoc], output: Path, *, db: str | None = None, coded: bool = False) -> int:
    """One JSON line per span (`span_records`), written atomically."""
    with atomic_file(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        return write_jsonl_lines(docs, handle)


def write_jsonl_lines(docs: Iterable[InputDoc], handle) -> int:
    """One JSON line per span of `docs` (`span_records`) to the open text `handle`; the lines written."""
    from linker.formats.jsonl import write_jsonl

    written = 0
    for doc in docs:
        for record in span_records(doc):
            write_jsonl(handle, record)
            written += 1
    return written


@register_writer("brat", folder=True, normalize=normalize_brat_path)
def write_brat_spans(docs: Iterable[InputDoc], output: Path, *, db: str | None = None, coded: bool = False) -> int:
    """A folder of ``<doc>.txt`` and ``<doc>.ann`` per text (`document_files`), written atomically."""
    from linker.formats.brat import write_brat

    written = 0
    with atomic_dir(output) as tmp:
        namer = FileNamer(tmp)  # names claimed document by document: `docs` may be a stream
        for doc in docs:
            files = document_files(doc, "brat", namer)
            for (sid, text), spans, (txt, ann) in zip(doc.sections, doc.spans, files, strict=True):
                txt.parent.mkdir(parents=True, exist_ok=True)
                txt.write_text(text, encoding="utf-8", newline="")
                lines = _brat_document(doc, sid, text, spans, db, output / ann.relative_to(tmp))
                write_brat(lines, ann)
                written += len(spans)
    return written


@register_writer("ade-xml", folder=True, normalize=normalize_ade_xml_path)
def write_ade_xml_spans(docs: Iterable[InputDoc], output: Path, *, db: str | None = None,
                        coded: bool = False) -> int:
    """A folder of one ``<doc>.xml`` label per document (`document_files`), written atomically; the spans written
    are its positive adverse events."""
    from linker.extract.data import AE
    from linker.formats.ade_xml import AdeDoc, write_ade_xml, write_reactions

    def positive(span) -> bool:
        return _field(span, "label") == AE and _field(span, "status", "positive") == "positive"

    written = 0
    with atomic_dir(output) as tmp:
        namer = FileNamer(tmp)  # names claimed document by document: `docs` may be a stream
        for doc in docs:
            files = document_files(doc, "ade-xml", namer)
            root, pairs = _xml_label(doc, positive)
            label = AdeDoc(doc.path or Path(doc.name), root, [m for m, _ in pairs])
            if coded or any(_field(s, "decision") is not None for _, s in pairs):
                write_reactions(label, [tuple(_field(s, "_candidates") or ()) for _, s in pairs])
            else:
                ET.indent(root, space="  ")
            write_ade_xml(label, files[0][0])
            written += len(pairs)
    return written


@register_writer("labels", folder=False)
def write_doc_labels(docs: Iterable[InputDoc], output: Path, *, labels: Sequence[str]) -> int:
    """One row per document (`linker.formats.doc_labels`): 1 under each listed concept that a positive adverse event
    of it is coded with (decision auto or review), written atomically; the documents written."""
    from linker.formats.doc_labels import doc_label_lines

    def rows():
        for doc in docs:
            yield doc.name, {row.get("code") for rows in doc.spans for row in rows
                             if isinstance(row, dict) and row.get("decision") in ("auto", "review")}

    written = 0
    with atomic_file(output) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
        for line in doc_label_lines(labels, rows()):
            handle.write(line)
            written += 1
    return written - 1


__all__ = [
    "EXTRACT_LIMITS",
    "INPUT_SUFFIXES",
    "MAX_TEXT_BYTES",
    "OUTPUT_FORMATS",
    "InputDoc",
    "Inputs",
    "batches",
    "check_format",
    "document_files",
    "output_files",
    "read_inputs",
    "stream_inputs",
    "tag_documents",
    "span_records",
    "write_ade_xml_spans",
    "write_brat_spans",
    "write_jsonl_lines",
    "write_jsonl_spans",
    "write_output",
]
