"""Training and evaluation documents for the adverse-event tagger, read through the project's format readers.

A `Doc` is one text with character spans ``(start, end, label, status)``: ``label`` one of `LABELS`, ``status``
one of `STATUSES` (an adverse event the text negates, or one that is hypothetical, is tagged as such, not
dropped). Discontinuous mentions (TAC ``start="10,30"``) become one span per piece: the tagger learns the
pieces that cover the mention, and `Doc.groups` keeps which pieces form one mention for scoring.

- PHEE (brat, `linker.formats.brat`): ``Effect`` spans are adverse events when the sentence has an
  ``Adverse_event`` trigger, beneficial (therapeutic) effects when its only triggers are
  ``Potential_therapeutic_event``; ``Drug`` spans are drugs; ``Treat-Disorder`` spans (the disorder a drug is
  given for) are indications; ``Sub-Disorder`` spans (the subject's own disorder: "a patient with sarcoidosis",
  "a history of NMS", present before the drug) are kept aside in `Doc.subject_disorders`, for evaluation only (no
  head learns them). The brat files carry no event arguments
  (``E`` lines hold the trigger only), so an event attribute (``A1 Negated E1`` / ``Speculated``) marks the
  Effect spans of its sentence when the sentence has one event, and is left out otherwise.
- TAC 2017 (XML, `linker.formats.ade_xml`): ``AdverseReaction`` mentions, a label of their own (`AR`): TAC's
  annotators mark short reaction terms ("rash", "nausea"; "severe" is a Severity), PHEE's whole effect phrases
  ("severe rash and nausea"), so each convention has its own head and `Extractor.extract(style=...)` picks one
  for the AdverseEvent spans it returns. A ``Negated`` relation makes one
  negated, a ``Hypothetical`` relation to a ``DrugClass`` or ``Animal`` hypothetical (the reader's rule of
  what is no reaction of the drug). TAC annotates no drugs: its documents carry no Drug labels (`Doc.types`
  says which labels a document is annotated for, so training leaves the Drug head out of their loss).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from linker.formats.ade_xml import read_ade_xml
from linker.formats.brat import brat_sources, read_source

AE = "AdverseEvent"
DRUG = "Drug"
BENEFIT = "TherapeuticEffect"
AR = "AdverseReaction"  # adverse events as TAC 2017 marks them (terms); AE: as PHEE marks them (phrases)
INDICATION = "Indication"  # the disorder a drug is given for (PHEE's Treat-Disorder): no adverse event of it
LABELS = (AE, DRUG, BENEFIT, AR, INDICATION)
# The subject's own disorder, present before the drug (PHEE's Sub-Disorder; an ICH E2B report's medical history): no
# head tags it; the decision head (`linker.extract.decision`) gives it to an adverse-event span it reads so
HISTORY = "MedicalHistory"
EVENT_LABELS = (AE, BENEFIT, AR)  # labels with a status
STATUSES = ("positive", "negated", "hypothetical")


@dataclass
class Doc:
    id: str
    text: str
    spans: list[tuple[int, int, str, str]] = field(default_factory=list)  # (start, end, label, status)
    types: tuple[str, ...] = LABELS  # labels this document is annotated for
    groups: list[tuple[tuple[tuple[int, int], ...], str, str]] = field(default_factory=list)  # whole mentions
    source: str = ""  # "phee" | "tac"
    section: str = ""  # TAC section id
    subject_disorders: list[tuple[int, int]] = field(default_factory=list)  # PHEE Sub-Disorder spans (evaluation)


def read_phee(path: str | Path, skipped: list[str] | None = None) -> list[Doc]:
    """Every sentence of a PHEE brat zip or folder, with its AdverseEvent, TherapeuticEffect and Drug spans.

    Read leniently: an annotation whose text does not match the .txt (PHEE dev has one, ``'dysphagia\\t'``) is
    left out and its message appended to `skipped`."""
    docs = []
    for source in brat_sources(Path(path)):
        doc = read_source(source, lenient=True)
        if skipped is not None:
            skipped.extend(doc.skipped)
        events, attributes = {}, {}
        for line in doc.lines:  # E and A lines as the reader kept them verbatim (it checks T lines only)
            key, _, rest = line.partition("\t")
            if key.startswith("E") and rest:
                events[key] = rest.split(" ")[0].split(":")[0]
            elif key.startswith("A") and rest:
                parts = rest.split(" ")
                if len(parts) >= 2:
                    attributes.setdefault(parts[1], set()).add(parts[0])
        kinds = set(events.values())
        effect = AE if "Adverse_event" in kinds or not kinds else BENEFIT
        status = "positive"
        if len(events) == 1:
            marks = attributes.get(next(iter(events)), set())
            status = "negated" if "Negated" in marks else "hypothetical" if "Speculated" in marks else "positive"
        spans = []
        for entity in doc.entities:
            label = {"Effect": effect, "Drug": DRUG, "Treat-Disorder": INDICATION}.get(entity.type)
            if label is None:
                continue
            for start, end in entity.spans:
                spans.append((start, end, label, status if label != DRUG else "positive"))
        name = Path(str(doc.path).rpartition("!")[2]).stem
        docs.append(Doc(name, doc.text or "", sorted(spans), LABELS,
                        [(tuple(e.spans), effect if e.type == "Effect" else DRUG, "positive")
                         for e in doc.entities if e.type in ("Effect", "Drug")], "phee",
                        subject_disorders=sorted(p for e in doc.entities if e.type == "Sub-Disorder" for p in e.spans)))
    return docs


def read_tac(path: str | Path) -> list[Doc]:
    """Every section of one TAC 2017 label (or of every .xml in a folder) with its AdverseReaction mentions."""
    path = Path(path)
    files = sorted(path.glob("*.xml")) if path.is_dir() else [path]
    docs = []
    for file in files:
        label = read_ade_xml(file)  # checks every mention's offsets and text against its section
        root = label.root
        sections = {s.get("id"): s.text or "" for s in root.find("Text")}
        types = {m.get("id"): m.get("type") for m in root.iter("Mention")}
        status = {}
        for relation in root.iter("Relation"):
            kind, arg1, arg2 = relation.get("type"), relation.get("arg1"), relation.get("arg2")
            if kind == "Negated":
                status[arg1] = "negated"
            elif kind == "Hypothetical" and types.get(arg2) in ("DrugClass", "Animal"):
                status.setdefault(arg1, "hypothetical")
        per_section: dict[str, Doc] = {
            sid: Doc(f"{file.stem}#{sid}", text, [], (AR,), [], "tac", sid) for sid, text in sections.items()}
        for mention in root.iter("Mention"):
            if mention.get("type") != "AdverseReaction":
                continue
            pieces = tuple((s, s + n) for s, n in zip(map(int, mention.get("start").split(",")),
                                                      map(int, mention.get("len").split(","))))
            doc = per_section[mention.get("section")]
            mark = status.get(mention.get("id"), "positive")
            doc.groups.append((pieces, AR, mark))
            doc.spans.extend((s, e, AR, mark) for s, e in pieces)
        for doc in per_section.values():
            doc.spans.sort()
            docs.append(doc)
    return docs


def tac_split(folder: str | Path, dev_share: float = 0.2, seed: int = 13) -> tuple[list[Path], list[Path]]:
    """(train, dev) label files: a seeded `dev_share` of the files held out (the same split every run)."""
    files = sorted(Path(folder).glob("*.xml"))
    shuffled = files[:]
    random.Random(seed).shuffle(shuffled)
    dev = set(shuffled[: round(len(files) * dev_share)])
    return [f for f in files if f not in dev], [f for f in files if f in dev]


def tac_names(files: list[Path]) -> list[str]:
    """The MedDRA PT and LLT names that the labels' Normalization elements give: the closed-world dictionary of a
    TAC split (`bench.extract` codes with the same names)."""
    names = set()
    for file in files:
        for norm in read_ade_xml(file).root.iter("Normalization"):
            names.update(n for n in (norm.get("meddra_pt"), norm.get("meddra_llt")) if n)
    return sorted(names)


def read_tac_files(files: list[Path]) -> list[Doc]:
    return [doc for file in files for doc in read_tac(file)]


def iter_pieces(spans) -> Iterator[tuple[int, int]]:
    for start, end, *_ in spans:
        yield start, end


__all__ = [
    "AE",
    "AR",
    "BENEFIT",
    "DRUG",
    "EVENT_LABELS",
    "HISTORY",
    "LABELS",
    "STATUSES",
    "Doc",
    "read_phee",
    "read_tac",
    "read_tac_files",
    "tac_split",
]
