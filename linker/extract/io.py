"""Inputs and outputs of `linker extract` / `linker annotate`.

Inputs (`read_inputs`): a ``.txt`` file; a ``.jsonl`` file of documents ``{"text", "id"?}`` (`linker.formats.jsonl`);
a TAC 2017 / ADE Eval ``.xml`` label (`linker.formats.ade_xml`; each ``<Section>`` a text); or a folder of them
(a brat folder: every ``.txt``, its ``.ann`` ignored; else every ``.xml``). Every input is read and checked before
the model loads.

Outputs (`write_output`):

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

File names (`output_files`): a document's id (a folder input's path, folder by folder) is used as it is, or refused
before the model loads: one that cannot be a file name (`linker.fileio.safe_stem`: a ``/`` or ``\\``, a control
character, a leading dot...), or two documents or sections on one file, case ignored. A span across a line break is
written to brat as a discontinuous span, one fragment per line.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.fileio import FileNamer, atomic_dir, atomic_file, decode_line, safe_stem
from linker.formats import DEFAULT_LIMITS, ReadLimits, read_document

OUTPUT_FORMATS = ("brat", "jsonl", "ade-xml")
INPUT_SUFFIXES = (".txt", ".jsonl", ".xml")


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


def _read_jsonl(path: Path, limits: ReadLimits) -> list[InputDoc]:
    from linker.formats.jsonl import jsonl_source, read_jsonl

    lines, where = jsonl_source(str(path), limits)
    docs, seen = [], set()
    for span in read_jsonl(lines(), where):
        name = str(span.record.get("id", span.line))
        if name in seen:
            raise InputFormatError(where, "unique document ids", f"id {name!r} a second time", line=span.line)
        seen.add(name)
        docs.append(InputDoc(name, "jsonl", [("", span.text)], path=path, line=span.line))
    if not docs:
        raise InputFormatError(where, 'JSONL documents {"text": ...}', "no document", line=1)
    return docs


def read_inputs(input_path: str | Path, limits: ReadLimits = DEFAULT_LIMITS, *, fmt: str = "jsonl") -> list[InputDoc]:
    """Every document of a file or folder (module docstring), all checked before any work; for a folder format
    `fmt`, the names of the files each will be written to as well (`output_files`)."""
    docs = _read_inputs(Path(input_path), limits)
    if fmt != "jsonl":
        output_files(docs, fmt, Path("."))
    return docs


def _read_inputs(path: Path, limits: ReadLimits) -> list[InputDoc]:
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _read_jsonl(path, limits)
        if suffix == ".xml":
            return [_read_xml(path, path.stem, limits)]
        if suffix == ".txt":
            return [_read_txt(path, path.stem, limits)]
        raise InputFormatError(path, f"a {', '.join(INPUT_SUFFIXES)} file or a folder of them",
                               f"a {suffix or 'suffix-less'} file")
    if path.is_dir():
        texts = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if texts:
            return [_read_txt(p, p.relative_to(path).with_suffix("").as_posix(), limits) for p in texts]
        labels = sorted(p for p in path.rglob("*.xml") if p.is_file())
        if labels:
            return [_read_xml(p, p.relative_to(path).with_suffix("").as_posix(), limits) for p in labels]
        raise MissingInputError(f"{path}: no .txt or .xml files in this folder")
    raise MissingInputError(f"{path}: no such file or folder (--input)")


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
    out = []
    for doc in docs:
        where, line = doc.path or doc.name, doc.line
        what = "a document id" if doc.kind == "jsonl" else "a document name (its path in the input folder)"
        *folders, stem = [safe_stem(part, where, what=what, line=line, fix=_NAME_FIX) for part in doc.name_parts()]
        owner = f"document {shorten(doc.name)}"
        if fmt == "ade-xml":
            out.append([namer.files([*folders, stem], [".xml"], owner=owner, where=where, line=line)])
            continue
        files = []
        for sid, _ in doc.sections:
            if sid:
                safe_stem(sid, where, what="a <Section id>", fix=_NAME_FIX)
            files.append(namer.files([*folders, f"{stem}_{sid}" if sid else stem], [".txt", ".ann"],
                                     owner=owner + (f" section {shorten(sid)}" if sid else ""), where=where, line=line))
        out.append(files)
    return out


# ----------------------------------------------------------------------------- writers


def _field(span, key, default=None):
    return span.get(key, default) if isinstance(span, dict) else getattr(span, key, default)


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


def _brat_document(doc: InputDoc, sid: str, text: str, spans: list, db: str, where: Path) -> list[str]:
    """The .ann lines of one text's spans, checked by the brat reader, plus normalisation lines."""
    from linker.formats.brat import brat_lines, parse_brat

    lines, notes, attributes = [], [], []
    for number, span in enumerate(spans, start=1):
        pieces = _brat_fragments(text, _field(span, "start"), _field(span, "end"))
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
    norms = [(db, _field(s, "code"), _field(s, "name") or "") if _field(s, "code") else None for s in spans]
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
            start, end = _field(span, "start"), _field(span, "end")
            ET.SubElement(mentions, "Mention", {"id": f"M{number}", "section": sid, "type": "AdverseReaction",
                                                "start": str(start), "len": str(end - start),
                                                "str": text[start:end]})
            ade_mentions.append(AdeMention(f"M{number}", sid, "AdverseReaction", " ".join(text[start:end].split()), 0))
            kept.append(span)
    return root, list(zip(ade_mentions, kept))


def write_output(docs: list[InputDoc], output: Path, fmt: str, *, db: str = "MedDRA", coded: bool = False) -> int:
    """Write the documents' spans in `fmt` to `output` (a file for jsonl, a folder otherwise); the spans written.
    `coded` (annotate): ade-xml labels get their <Reactions>, even an empty one."""
    from linker.extract.data import AE

    check_format(fmt)
    written = 0
    output = Path(output)
    if fmt == "jsonl":
        from linker.formats.jsonl import write_jsonl

        with atomic_file(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for doc in docs:
                for record in span_records(doc):
                    write_jsonl(handle, record)
                    written += 1
        return written
    with atomic_dir(output) as tmp:
        for doc, files in zip(docs, output_files(docs, fmt, tmp), strict=True):
            if fmt == "brat":
                from linker.formats.brat import write_brat

                for (sid, text), spans, (txt, ann) in zip(doc.sections, doc.spans, files, strict=True):
                    txt.parent.mkdir(parents=True, exist_ok=True)
                    txt.write_text(text, encoding="utf-8", newline="")
                    lines = _brat_document(doc, sid, text, spans, db, output / ann.relative_to(tmp))
                    write_brat(lines, ann)
                    written += len(spans)
            else:
                from linker.formats.ade_xml import (
                    AdeDoc,
                    write_ade_xml,
                    write_reactions,
                )

                def positive(span) -> bool:
                    return _field(span, "label") == AE and _field(span, "status", "positive") == "positive"

                root, pairs = _xml_label(doc, positive)
                label = AdeDoc(doc.path or Path(doc.name), root, [m for m, _ in pairs])
                if coded or any(_field(s, "decision") is not None for _, s in pairs):
                    write_reactions(label, [tuple(_field(s, "_candidates") or ()) for _, s in pairs])
                else:
                    ET.indent(root, space="  ")
                write_ade_xml(label, files[0][0])
                written += len(pairs)
    return written


__all__ = [
    "INPUT_SUFFIXES",
    "OUTPUT_FORMATS",
    "InputDoc",
    "check_format",
    "output_files",
    "read_inputs",
    "span_records",
    "write_output",
]
