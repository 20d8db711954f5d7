"""ADE Eval / TAC 2017 ADR drug labels (XML): adverse-event mentions resolved from their section's text.

Reader: root ``Label`` (TAC 2017) or ``SubmissionLabel`` (ADE Eval); every mention's offsets are
checked against its section and its ``str=`` against the resolved text; a mention that is Negated,
or Hypothetical because of a DrugClass or Animal, is no reaction of the drug and is left out.
Every element keeps its source line for messages. The file is refused above the document cap
before it is parsed.

Writer: the label with its ``<Reactions>`` replaced: one ``Reaction`` per distinct (lower-cased)
mention string with exactly one ``Normalization`` (``meddra_pt``, ``meddra_pt_id``, and
``meddra_llt``/``meddra_llt_id`` when the matched name was an LLT). XML 1.0 cannot hold NUL and most
other control characters, even escaped: names, labels only, are cleaned (`linker.formats.clean_label`),
ids that are not one token are refused, and any other character XML cannot hold is refused with the
element and attribute it is in, so a written label is always well-formed and reads back.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from xml.parsers import expat

from linker.errors import InputFormatError, MissingInputError, shorten
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_identifier, clean_label, read_document

if TYPE_CHECKING:
    from linker.link import Candidate

# Mention types of the two XML formats that denote an adverse event (TAC 2017: AdverseReaction;
# ADE Eval: OSE_Labeled_AE and NonOSE_AE). Severity, Factor, Negation, DrugClass, Animal mentions
# qualify a reaction and are left without a normalisation.
ADE_MENTION_TYPES = ("AdverseReaction", "OSE_Labeled_AE", "NonOSE_AE")
# TAC 2017 labels are <Label>; ADE Eval gold files <GoldLabel>, its submissions <SubmissionLabel>.
XML_ROOTS = ("Label", "GoldLabel", "SubmissionLabel")


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


# TAC 2017 and ADE Eval labels are 4 elements deep (Label > Reactions > Reaction > Normalization); writing a label
# (ElementTree.indent, serialisation) recurses once per level, so a deeper file is refused as it is parsed.
MAX_XML_DEPTH = 32


def _parse_xml(path: Path, limits: ReadLimits) -> tuple[ET.Element, dict[int, int]]:
    """Parse with expat directly so that every element keeps its source line (for messages)."""
    builder = ET.TreeBuilder()
    lines: dict[int, int] = {}
    parser = expat.ParserCreate()
    parser.buffer_text = True
    depth = 0

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal depth
        depth += 1
        if depth > MAX_XML_DEPTH:
            raise InputFormatError(path, f"elements nested at most {MAX_XML_DEPTH} deep (a drug label has 4)",
                                   f"<{tag}> at depth {depth}", line=parser.CurrentLineNumber)
        element = builder.start(tag, attrs)
        lines[id(element)] = parser.CurrentLineNumber

    def end(tag: str) -> None:
        nonlocal depth
        depth -= 1
        builder.end(tag)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(read_document(path, limits), True)
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


# ASCII digits, at most 18 each: int() refuses more than 4,300 digits with a ValueError.
_FIX_ID = "the index holds this id; rebuild its concept table with the current linker, which refuses such ids"
_OFFSETS = re.compile(r"^[0-9]{1,18}(,[0-9]{1,18})*$")
# What XML 1.0 can hold (its Char production); anything else makes the file not well-formed.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_SPACES = re.compile(r"\s+")


def read_ade_xml(
    path: str | Path, *, types: Sequence[str] = ADE_MENTION_TYPES, limits: ReadLimits = DEFAULT_LIMITS
) -> AdeDoc:
    """Read one TAC 2017 / ADE Eval drug label; resolve the text of its positive adverse-event mentions."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such XML file")
    root, lines = _parse_xml(path, limits)

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
            attrs.update(meddra_pt=clean_label(best.preferred_name),
                         meddra_pt_id=check_identifier(best.concept_id, "meddra_pt_id", where=doc.path, fix=_FIX_ID))
            if best.term_type == "LLT":
                attrs.update(meddra_llt=clean_label(best.matched_name),
                             meddra_llt_id=check_identifier(best.term_id, "meddra_llt_id", where=doc.path, fix=_FIX_ID))
        else:
            attrs["flag"] = "unmapped"  # TAC's value for a reaction without a MedDRA term
        ET.SubElement(reaction, "Normalization", attrs)
    # Indentation only rewrites white-space-only text of elements that have children, so the
    # section bodies (the text that the offsets point into) are written back unchanged.
    ET.indent(root, space="  ")
    root.tail = "\n"
    return root


def check_xml(root: ET.Element, where: str | Path) -> None:
    """Refuse a tree holding a character XML 1.0 cannot hold, naming the element and attribute."""
    for element in root.iter():
        values = [("text", element.text), ("tail", element.tail), *element.attrib.items()]
        for field, value in values:
            if value and (bad := _NOT_XML.search(value)):
                raise InputFormatError(where, f"<{element.tag}> {field} in characters XML 1.0 can hold",
                                       f"{bad.group()!r} at character {bad.start()} of {shorten(value, 60)}")


def write_ade_xml(doc: AdeDoc, target: Path) -> None:
    """Write the label (after `write_reactions`) to `target`, creating its folder."""
    check_xml(doc.root, doc.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(doc.root).write(target, encoding="UTF-8", xml_declaration=True)


def label_text(doc: AdeDoc) -> str:
    """The label's sections joined: the document in which its abbreviations are defined."""
    return " ".join(section.text or "" for section in doc.root.find("Text"))


__all__ = ["ADE_MENTION_TYPES", "XML_ROOTS", "AdeDoc", "AdeMention", "label_text", "read_ade_xml", "write_ade_xml",
           "write_reactions"]
