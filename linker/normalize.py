"""Batch normalisation: predicted spans in JSONL, brat or ADE-Eval/TAC-2017 XML -> linked concepts.

Every reader validates its whole input before anything is linked or written, and every writer
goes through `linker.fileio.atomic_file` / `atomic_dir`; so a malformed line in the last of
10,000 files leaves no output at all instead of a half-normalised collection.

Linking goes through `Linker.link` in batches (`BATCH` mentions, grouped by language), with
the index loaded once: the same shape as `Linker.link_batch` on an Arrow record batch, which
is how a distributed engine (Ray `map_batches`, Spark `mapInArrow`) runs this at scale.

Formats:
- ``jsonl``: one span per line, ``{"text": ..., "id"?: ..., "lang"?: ...}``; the output line is
  the input object plus ``candidates`` (ranked). ``lang`` restricts candidates to names in that
  language when the index has some (see `link_texts`).
- ``brat``: a folder of ``.ann`` files (or one file); a normalisation line
  ``N<n>\\tReference T<i> <db>:<id>\\t<name>`` is appended for every text-bound annotation, all
  other lines stay as they were; ``.txt`` and ``.conf`` files are copied.
- ``ade-xml``: drug labels as in TAC 2017 ADR (root ``Label``) or ADE Eval (root
  ``SubmissionLabel``); adverse-event mentions are resolved from their section's text and a
  ``<Reactions>`` element is written with one ``Reaction`` per distinct (lower-cased) mention
  string and exactly one ``Normalization`` in it (``meddra_pt``, ``meddra_pt_id``, and
  ``meddra_llt``/``meddra_llt_id`` when the matched name was an LLT).

With ``expand_abbreviations``, brat and XML mentions that are abbreviations defined in their own
document ("neuroleptic malignant syndrome (NMS)" ... "NMS") are linked as the long form
(`linker.preprocess`); the brat document is the ``.txt`` beside the ``.ann``, the label's is its
sections. The files keep the mention text as written.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from xml.parsers import expat

from linker.errors import ConfigError, InputFormatError, MissingInputError, UnknownNameError, shorten
from linker.fileio import atomic_dir, atomic_file, decode_line, iter_lines
from linker.preprocess import expand_abbreviations, find_abbreviations

if TYPE_CHECKING:  # the Linker is only needed for type hints here; callers pass a loaded one
    from linker.link import Candidate, Linker

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "brat", "ade-xml")
# Mentions per Linker.link call: the tf-idf index searches queries in chunks of 1024, so a batch
# of that size is one sparse product; larger batches only add memory.
BATCH = 1024
# Mention types of the two XML formats that denote an adverse event (TAC 2017: AdverseReaction;
# ADE Eval: OSE_Labeled_AE and NonOSE_AE). Severity, Factor, Negation, DrugClass, Animal mentions
# qualify a reaction and are left without a normalisation.
ADE_MENTION_TYPES = ("AdverseReaction", "OSE_Labeled_AE", "NonOSE_AE")
XML_ROOTS = ("Label", "SubmissionLabel")


# --------------------------------------------------------------------------- shared


@dataclass(frozen=True)
class NormalizeSummary:
    """What a run read and wrote."""

    format: str
    output: str
    documents: int
    mentions: int
    linked: int  # mentions with at least one candidate


def link_texts(
    linker: Linker, texts: Sequence[str], langs: Sequence[str | None], *, k: int, batch: int = BATCH
) -> list[tuple[Candidate, ...]]:
    """Candidates for each text, in input order; batches of `batch`, one `Linker.link` call per language.

    A span's language restricts its candidates to names in that language when the index has
    any; a language the index lacks (a Spanish span against the English default) is linked
    against all names, with a warning, instead of failing the whole batch.
    """
    if len(texts) != len(langs):
        raise ValueError("texts and langs must have the same length")
    known = set(linker.languages)
    missing = sorted({lang for lang in langs if lang is not None and lang not in known})
    if missing:
        log.warning("index has no names in %s; those spans are linked against all languages (%s)",
                    ", ".join(missing), ", ".join(sorted(known)))
        langs = [lang if lang in known else None for lang in langs]
    out: list[tuple[Candidate, ...]] = [()] * len(texts)
    for start in range(0, len(texts), batch):
        by_lang: dict[str | None, list[int]] = {}
        for i in range(start, min(start + batch, len(texts))):
            by_lang.setdefault(langs[i], []).append(i)
        for lang, rows in by_lang.items():
            results = linker.link([texts[i] for i in rows], k=k, lang=lang)
            for i, result in zip(rows, results, strict=True):
                out[i] = tuple(result.candidates)
    return out


def _check_k(k: int) -> None:
    if k < 1:
        raise ConfigError(f"--k must be at least 1, found {k}")


# --------------------------------------------------------------------------- JSONL


@dataclass(frozen=True)
class Span:
    """One JSONL input line: its fields as given, plus the validated text and language."""

    line: int
    record: dict
    text: str
    lang: str | None


def parse_jsonl(lines: Iterable[tuple[int, str]], where: str) -> Iterator[Span]:
    """Validate and yield spans; blank lines are skipped, anything else malformed raises."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFormatError(where, "a JSON object", f"invalid JSON ({exc.msg})", line=number) from None
        if not isinstance(record, dict):
            raise InputFormatError(where, "a JSON object", f"{type(record).__name__} {shorten(line)}", line=number)
        text = record.get("text")
        if not isinstance(text, str):
            found = "no field 'text'" if "text" not in record else f"text of type {type(text).__name__}"
            raise InputFormatError(where, 'a string field "text"', found, line=number)
        if not text.strip():
            raise InputFormatError(where, "a non-empty text", f"text {text!r}", line=number)
        lang = record.get("lang")
        if lang is not None and (not isinstance(lang, str) or not lang.strip()):
            raise InputFormatError(where, '"lang" as a language code such as "en"', f"lang {lang!r}", line=number)
        span_id = record.get("id")
        if span_id is not None and (isinstance(span_id, bool) or not isinstance(span_id, (str, int))):
            raise InputFormatError(where, '"id" as a string or integer', f"id {span_id!r}", line=number)
        yield Span(number, record, text, lang.strip() if lang else None)


def _batched(items: Iterable, size: int) -> Iterator[list]:
    buffer: list = []
    for item in items:
        buffer.append(item)
        if len(buffer) >= size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def normalize_jsonl_lines(
    linker: Linker,
    lines: Callable[[], Iterable[tuple[int, str]]],
    where: str,
    out: TextIO,
    *,
    k: int = 1,
    lang: str | None = None,
) -> NormalizeSummary:
    """Two passes over `lines()`: validate all, then link batch by batch and write one line per span.

    `lines` is a factory so that a file is streamed twice (constant memory) instead of held.
    """
    _check_k(k)
    total = sum(1 for _ in parse_jsonl(lines(), where))  # pass 1: nothing is written before this ends
    linked = 0
    for spans in _batched(parse_jsonl(lines(), where), BATCH):
        candidates = link_texts(linker, [s.text for s in spans], [s.lang or lang for s in spans], k=k)
        for span, cands in zip(spans, candidates, strict=True):
            linked += bool(cands)
            record = {**span.record, "candidates": [c.to_dict() for c in cands]}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return NormalizeSummary("jsonl", getattr(out, "name", "<stream>"), 1, total, linked)


def normalize_jsonl(
    linker: Linker, input_path: str | Path, output_path: str | Path, *, k: int = 1, lang: str | None = None
) -> NormalizeSummary:
    """JSONL file -> JSONL file, written atomically; `lang` applies to spans without their own."""
    return normalize_jsonl_stream(linker, str(input_path), str(output_path), k=k, lang=lang)


def normalize_jsonl_stream(
    linker: Linker, input_path: str, output: str, *, k: int = 1, lang: str | None = None
) -> NormalizeSummary:
    """JSONL in and out where either side may be `-` (stdin / stdout); a file output is written atomically."""
    if input_path == "-":
        lines = [(n, line.rstrip("\r\n")) for n, line in enumerate(sys.stdin, start=1)]  # stdin cannot be read twice
        source, where = (lambda: lines), "<stdin>"
    else:
        if not Path(input_path).is_file():
            raise MissingInputError(f"{input_path}: no such file")
        source, where = (lambda: iter_lines(input_path)), input_path
    if output == "-":
        return normalize_jsonl_lines(linker, source, where, sys.stdout, k=k, lang=lang)
    with atomic_file(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        summary = normalize_jsonl_lines(linker, source, where, handle, k=k, lang=lang)
    return NormalizeSummary("jsonl", output, 1, summary.mentions, summary.linked)


# --------------------------------------------------------------------------- brat

_BRAT_ID = re.compile(r"^([A-Za-z]|#|\*)([0-9]*)(\S*)$")
_BRAT_SPANS = re.compile(r"^\d+ \d+(;\d+ \d+)*$")


@dataclass(frozen=True)
class BratEntity:
    line: int
    tid: str
    text: str


@dataclass(frozen=True)
class BratDoc:
    """One .ann file: its lines as read (kept verbatim) and its text-bound annotations."""

    path: Path
    lines: tuple[str, ...]
    entities: tuple[BratEntity, ...]
    next_n: int  # first free number for a new N annotation


def read_brat(path: str | Path) -> BratDoc:
    """Read and check one .ann file; raise InputFormatError naming file:line on a malformed line."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such .ann file")
    raw = path.read_bytes()
    lines: list[str] = []
    entities: list[BratEntity] = []
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
                path, "a brat annotation line 'ID<TAB>...' (ID such as T1, R2, N3, #1)", shorten(line), line=number
            )
        kind, digits = match.group(1), match.group(2)
        if kind == "N" and digits:
            max_n = max(max_n, int(digits))
        if kind != "T":
            continue
        fields = rest.split("\t", 1)
        type_, _, spans = fields[0].partition(" ")
        if len(fields) != 2 or not type_ or not _BRAT_SPANS.match(spans):
            raise InputFormatError(
                path, "a text-bound line 'T1<TAB>Type START END[;START END]<TAB>text'", shorten(line), line=number
            )
        offsets = [tuple(map(int, s.split(" "))) for s in spans.split(";")]
        if any(end < start for start, end in offsets):
            raise InputFormatError(path, "span offsets with START <= END", repr(spans), line=number)
        if ann_id in tids:
            raise InputFormatError(path, "unique annotation ids", f"{ann_id} a second time", line=number)
        tids.add(ann_id)
        if not fields[1].strip():
            raise InputFormatError(path, "a non-empty span text", repr(fields[1]), line=number)
        entities.append(BratEntity(number, ann_id, fields[1]))
    return BratDoc(path, tuple(lines), tuple(entities), max_n + 1)


def brat_db(candidate: Candidate) -> str:
    """brat's database name for a candidate: its source up to the first ':' (umls:MSH -> umls)."""
    return candidate.source.split(":", 1)[0] or "linker"


def brat_lines(doc: BratDoc, candidates: Sequence[tuple[Candidate, ...]], *, db: str | None = None) -> list[str]:
    """The document's lines plus one normalisation line per linked text-bound annotation."""
    out = list(doc.lines)
    n = doc.next_n
    for entity, cands in zip(doc.entities, candidates, strict=True):
        if not cands:
            continue  # no n-gram in common with any name: leave the annotation unnormalised
        best = cands[0]
        name = " ".join(best.preferred_name.split())  # a tab or newline would break the line format
        out.append(f"N{n}\tReference {entity.tid} {db or brat_db(best)}:{best.concept_id}\t{name}")
        n += 1
    return out


def _check_out_dir(output_path: Path, overwrite: bool) -> None:
    """An output folder is replaced whole (atomic_dir), so never replace one holding anything unasked."""
    if output_path.exists() and (not output_path.is_dir() or (any(output_path.iterdir()) and not overwrite)):
        raise ConfigError(
            f"--output {output_path} exists and is not an empty folder; choose a new --output, "
            "or pass --overwrite to replace that folder whole"
        )


def _input_files(input_path: Path, suffix: str) -> list[Path]:
    """The file itself, or every `suffix` file below a folder (sorted, so output order is stable)."""
    if input_path.is_file():
        return [input_path]
    if input_path.is_dir():
        files = sorted(input_path.rglob(f"*{suffix}"))
        if not files:
            raise MissingInputError(f"{input_path}: no {suffix} files in this folder")
        return files
    raise MissingInputError(f"{input_path}: no such file or folder")


def normalize_brat(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    k: int = 1,
    db: str | None = None,
    lang: str | None = None,
    overwrite: bool = False,
    expand: bool = False,
) -> NormalizeSummary:
    """brat .ann file or folder -> the same with normalisation lines, written atomically.

    A folder is mirrored (sub-folders kept); `.txt` and `.conf` files are copied beside. An
    existing non-empty output folder is replaced only with `overwrite`.
    """
    if k != 1:
        raise ConfigError(f"the brat format writes one normalisation per annotation; use --k 1 (found --k {k})")
    input_path, output_path = Path(input_path), Path(output_path)
    files = _input_files(input_path, ".ann")
    if input_path.is_dir():
        _check_out_dir(output_path, overwrite)
    docs = [read_brat(p) for p in files]  # all validated before any linking
    linked = _link_documents(linker, [[e.text for e in d.entities] for d in docs], lang,
                             documents=[_brat_text(d.path) for d in docs] if expand else None)
    per_doc = [brat_lines(doc, candidates, db=db) for doc, candidates in zip(docs, linked, strict=True)]

    def write(lines: list[str], target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")

    if input_path.is_file():
        txt = input_path.with_suffix(".txt")
        if txt.is_file():
            with atomic_file(output_path.with_suffix(".txt")) as tmp:
                shutil.copyfile(txt, tmp)
        with atomic_file(output_path) as tmp:
            write(per_doc[0], tmp)
    else:
        with atomic_dir(output_path) as tmp:
            for doc, lines in zip(docs, per_doc, strict=True):
                write(lines, tmp / doc.path.relative_to(input_path))
            for extra in sorted([*input_path.rglob("*.txt"), *input_path.rglob("*.conf")]):
                target = tmp / extra.relative_to(input_path)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(extra, target)
    return _summary("brat", output_path, linked)


# --------------------------------------------------------------------------- ADE Eval / TAC 2017 XML


@dataclass(frozen=True)
class AdeMention:
    mention_id: str
    section: str
    type: str
    text: str  # resolved from the section: segments with white space collapsed, joined by " "
    line: int


@dataclass
class AdeDoc:
    """One drug label: the parsed tree (re-serialised on output) and its mentions."""

    path: Path
    root: ET.Element
    mentions: list[AdeMention] = field(default_factory=list)


def _parse_xml(path: Path) -> tuple[ET.Element, dict[int, int]]:
    """Parse with expat directly so that every element keeps its source line (for messages)."""
    builder = ET.TreeBuilder()
    lines: dict[int, int] = {}
    parser = expat.ParserCreate()
    parser.buffer_text = True

    def start(tag: str, attrs: dict[str, str]) -> None:
        element = builder.start(tag, attrs)
        lines[id(element)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(path.read_bytes(), True)
        root = builder.close()
    except expat.ExpatError as exc:
        raise InputFormatError(
            path, "well-formed XML", expat.ErrorString(exc.code), line=exc.lineno, fix=f"column {exc.offset + 1}"
        ) from None
    except LookupError as exc:  # <?xml encoding="..."?> names an encoding Python does not know
        raise InputFormatError(path, "an XML declaration with a known encoding such as UTF-8", str(exc), line=1) from None
    if root is None:
        raise InputFormatError(path, "an XML document", "no root element")
    return root, lines


_OFFSETS = re.compile(r"^\d+(,\d+)*$")
_SPACES = re.compile(r"\s+")


def read_ade_xml(path: str | Path, *, types: Sequence[str] = ADE_MENTION_TYPES) -> AdeDoc:
    """Read one TAC 2017 / ADE Eval drug label; resolve the text of its positive adverse-event mentions."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such XML file")
    root, lines = _parse_xml(path)

    def fail(element: ET.Element, expected: str, found: str) -> InputFormatError:
        return InputFormatError(path, expected, found, line=lines.get(id(element)))

    if root.tag not in XML_ROOTS:
        raise fail(root, f"a drug label with root element {' or '.join(XML_ROOTS)}", f"<{root.tag}>")
    text = root.find("Text")
    if text is None:
        raise fail(root, "a <Text> element with the label's <Section>s", "none")
    sections: dict[str, str] = {}
    for section in text:
        sid = section.get("id")
        if section.tag != "Section" or not sid:
            raise fail(section, '<Section id="S1" name="...">', f"<{section.tag} {dict(section.attrib)}>")
        if sid in sections:
            raise fail(section, "unique section ids", f"{sid} a second time")
        sections[sid] = section.text or ""
    doc = AdeDoc(path, root)
    mentions = root.find("Mentions")
    seen: set[str] = set()
    mention_types: dict[str, str] = {}
    for mention in [] if mentions is None else mentions:
        attrs = mention.attrib
        missing = [a for a in ("id", "section", "type", "start", "len") if not attrs.get(a)]
        if mention.tag != "Mention" or missing:
            found = f"<{mention.tag}> without {', '.join(missing)}" if missing else f"<{mention.tag}>"
            raise fail(mention, '<Mention id= section= type= start= len= [str=]>', found)
        mid = attrs["id"]
        if mid in seen:
            raise fail(mention, "unique mention ids", f"{mid} a second time")
        seen.add(mid)
        if attrs["section"] not in sections:
            raise fail(mention, f"a section id among {', '.join(sections) or '(none)'}", repr(attrs["section"]))
        starts, lens = attrs["start"], attrs["len"]
        if not _OFFSETS.match(starts) or not _OFFSETS.match(lens) or starts.count(",") != lens.count(","):
            raise fail(mention, "start and len as equally many comma-separated integers", f"start={starts!r} len={lens!r}")
        section_text = sections[attrs["section"]]
        parts = []
        for s, n in zip(map(int, starts.split(",")), map(int, lens.split(",")), strict=True):
            if s + n > len(section_text):
                raise fail(
                    mention,
                    f"offsets inside section {attrs['section']} ({len(section_text)} characters)",
                    f"start={s} len={n}",
                )
            parts.append(_SPACES.sub(" ", section_text[s : s + n]))
        resolved = " ".join(parts)
        given = attrs.get("str")
        if given is not None and _SPACES.sub(" ", given) != resolved:
            raise fail(mention, f"str= equal to the section text at the offsets ({resolved!r})", repr(given))
        mention_types[mid] = attrs["type"]
        if attrs["type"] in types:
            if not resolved.strip():
                raise fail(mention, "a non-empty mention text", repr(resolved))
            doc.mentions.append(AdeMention(mid, attrs["section"], attrs["type"], resolved, lines.get(id(mention), 0)))
    # TAC 2017 lists only positive reactions: a mention that is Negated, or Hypothetical because of
    # a DrugClass or Animal, is no reaction of this drug (the task's scoring rule).
    relations = root.find("Relations")
    not_positive: set[str] = set()
    for relation in [] if relations is None else relations:
        kind, arg1, arg2 = (relation.get(a) for a in ("type", "arg1", "arg2"))
        if relation.tag != "Relation" or not kind or arg1 not in mention_types or arg2 not in mention_types:
            raise fail(relation, "<Relation id= type= arg1= arg2=> between mention ids of this label",
                       f"<{relation.tag} {dict(relation.attrib)}>")
        if kind == "Negated" or (kind == "Hypothetical" and mention_types[arg2] in ("DrugClass", "Animal")):
            not_positive.add(arg1)
    doc.mentions = [m for m in doc.mentions if m.mention_id not in not_positive]
    return doc


def write_reactions(doc: AdeDoc, candidates: Sequence[tuple[Candidate, ...]]) -> ET.Element:
    """Replace the label's <Reactions> with one Reaction per distinct mention string, one Normalization each."""
    root = doc.root
    for old in root.findall("Reactions"):
        root.remove(old)
    reactions = ET.SubElement(root, "Reactions")
    by_string: dict[str, tuple[Candidate, ...]] = {}
    for mention, cands in zip(doc.mentions, candidates, strict=True):
        by_string.setdefault(mention.text.lower(), cands)
    for number, (string, cands) in enumerate(by_string.items(), start=1):
        reaction = ET.SubElement(reactions, "Reaction", {"id": f"AR{number}", "str": string})
        attrs = {"id": f"AR{number}.N1"}
        if cands:
            best = cands[0]
            attrs.update(meddra_pt=best.preferred_name, meddra_pt_id=best.concept_id)
            if best.term_type == "LLT":
                attrs.update(meddra_llt=best.matched_name, meddra_llt_id=best.term_id)
        else:
            attrs["flag"] = "unmapped"  # TAC's value for a reaction without a MedDRA term
        ET.SubElement(reaction, "Normalization", attrs)
    # Indentation only rewrites white-space-only text of elements that have children, so the
    # section bodies (the text that the offsets point into) are written back unchanged.
    ET.indent(root, space="  ")
    root.tail = "\n"
    return root


def _check_meddra(linker: Linker) -> None:
    sources = set(linker.concepts.table.column("source").unique().to_pylist())
    if not any(s.split(":", 1)[0] == "meddra" for s in sources):
        raise ConfigError(
            f"the ade-xml format writes MedDRA PT codes (meddra_pt_id), but this index holds "
            f"{', '.join(sorted(sources))}; build an index from a MedDRA concept table "
            "(`linker dict build --source meddra ...`)"
        )


def normalize_ade_xml(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    k: int = 1,
    lang: str | None = None,
    overwrite: bool = False,
    check_meddra: bool = True,
    expand: bool = False,
) -> NormalizeSummary:
    """TAC 2017 / ADE Eval XML file or folder -> the same labels with <Reactions>, written atomically.

    An existing non-empty output folder is replaced only with `overwrite`.
    """
    if k != 1:
        raise ConfigError(f"the ade-xml format writes one Normalization per reaction; use --k 1 (found --k {k})")
    if check_meddra:
        _check_meddra(linker)
    input_path, output_path = Path(input_path), Path(output_path)
    files = _input_files(input_path, ".xml")
    if input_path.is_dir():
        _check_out_dir(output_path, overwrite)
    docs = [read_ade_xml(p) for p in files]
    linked = _link_documents(linker, [[m.text for m in d.mentions] for d in docs], lang,
                             documents=[_label_text(d) for d in docs] if expand else None)
    for doc, candidates in zip(docs, linked, strict=True):
        write_reactions(doc, candidates)

    def write(doc: AdeDoc, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(doc.root).write(target, encoding="UTF-8", xml_declaration=True)

    if input_path.is_file():
        with atomic_file(output_path) as tmp:
            write(docs[0], tmp)
    else:
        with atomic_dir(output_path) as tmp:
            for doc in docs:
                write(doc, tmp / doc.path.relative_to(input_path))
    return _summary("ade-xml", output_path, linked)


# --------------------------------------------------------------------------- documents


def _link_documents(
    linker: Linker,
    mentions: Sequence[Sequence[str]],
    lang: str | None,
    *,
    documents: Sequence[str] | None = None,
) -> list[list[tuple[Candidate, ...]]]:
    """The best candidate of every mention of every document, linked in one pass, split per document.

    With `documents` (each document's text), a mention that is an abbreviation the
    document defines is linked as its long form (see the module docstring).
    """
    texts = [text for doc in mentions for text in doc]
    if documents is not None:
        expanded = []
        for document, doc in zip(documents, mentions, strict=True):
            table = find_abbreviations(document)  # once per document
            expanded += [expand_abbreviations(text, table) for text in doc]
        log.info("expanded %d of %d mentions using abbreviations defined in their documents",
                 sum(a != b for a, b in zip(texts, expanded)), len(texts))
        texts = expanded
    flat = link_texts(linker, texts, [lang] * len(texts), k=1)
    out, pos = [], 0
    for doc in mentions:
        out.append(flat[pos : pos + len(doc)])
        pos += len(doc)
    return out


def _summary(fmt: str, output_path: Path, linked: list[list[tuple[Candidate, ...]]]) -> NormalizeSummary:
    flat = [candidates for doc in linked for candidates in doc]
    return NormalizeSummary(fmt, str(output_path), len(linked), len(flat), sum(1 for c in flat if c))


def _label_text(doc: AdeDoc) -> str:
    return " ".join(section.text or "" for section in doc.root.find("Text"))


def _brat_text(ann: Path) -> str:
    txt = ann.with_suffix(".txt")
    if not txt.is_file():
        log.warning("%s: no .txt beside it; its abbreviations are not expanded", ann)
        return ""
    return "\n".join(line for _, line in iter_lines(txt))


# --------------------------------------------------------------------------- dispatch


def normalize_path(
    linker: Linker,
    input_path: str | Path,
    output_path: str | Path,
    *,
    fmt: str,
    k: int = 1,
    db: str | None = None,
    lang: str | None = None,
    overwrite: bool = False,
    expand_abbreviations: bool = False,
) -> NormalizeSummary:
    """Normalise a file or folder in format `fmt` (one of FORMATS) into `output_path`.

    `expand_abbreviations` (brat, ade-xml): link abbreviations defined in the document as their long form.
    """
    if fmt not in FORMATS:
        raise UnknownNameError("input format", fmt, FORMATS)
    if Path(input_path).resolve() == Path(output_path).resolve() and fmt != "jsonl":
        raise ConfigError(f"--output {output_path} is the input; choose another path so the input stays intact")
    if fmt == "jsonl":
        if expand_abbreviations:
            raise ConfigError("--expand-abbreviations needs the documents: use --format brat or ade-xml")
        return normalize_jsonl(linker, input_path, output_path, k=k, lang=lang)
    if fmt == "brat":
        return normalize_brat(linker, input_path, output_path, k=k, db=db, lang=lang, overwrite=overwrite,
                              expand=expand_abbreviations)
    return normalize_ade_xml(linker, input_path, output_path, k=k, lang=lang, overwrite=overwrite,
                             expand=expand_abbreviations)


__all__ = [
    "ADE_MENTION_TYPES",
    "BATCH",
    "FORMATS",
    "NormalizeSummary",
    "link_texts",
    "normalize_ade_xml",
    "normalize_brat",
    "normalize_jsonl",
    "normalize_jsonl_lines",
    "normalize_jsonl_stream",
    "normalize_path",
    "parse_jsonl",
    "read_ade_xml",
    "read_brat",
]
