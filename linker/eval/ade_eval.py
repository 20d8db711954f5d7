"""ADE Eval scorer: adverse-event mentions and their MedDRA codes in drug labels (issue 37, part 3).

Definitions and where they come from
====================================

The ADE Eval evaluation document (MITRE / FDA, 2019) itself was not found in any searchable
public source. The paper that reports the evaluation -- Bayer S, Clark C, Dang O, Aberdeen J,
Brajovic S, Swank K, Hirschman L, Ball R. "ADE Eval: An Evaluation of Text Processing Systems
for Adverse Event Extraction from Drug Labels for Pharmacovigilance", Drug Safety 44:83-94
(2021), doi:10.1007/s40264-020-00996-3, PMC7813736 -- names the measures only in its abstract
(MedDRA-coding F1, a "quality" score = the portion of the annotated text an algorithm correctly
identified for a found MedDRA term, and an "averaged, weighted F1-measure for mention finding"
that models the cost of correcting output). The exact arithmetic below is therefore taken from
MITRE's reference scorer, released with the ADE Eval materials: ``OSE_AE/score.py``,
``label.py``, ``tac_format.py`` (Copyright 2018 The MITRE Corporation, "a massively refactored
and expanded version of the scorer from the TAC ADR 2017 evaluation"), read, not copied. Where
that code and this module differ, the difference is listed under "Choices made here".

1. Pairing (score.py ``PairSet``). Per section, gold and submission mentions are paired one-to-one
   by Kuhn-Munkres (maximum total similarity; here `scipy.optimize.linear_sum_assignment`).
   A mention is a set of character offsets (the union of its ``start``/``len`` pieces, so a
   discontinuous mention is compared like any other). With ``overlap = |A & B| / |A | B|``:

   - overlap 0: similarity 0 -- never a pair (a pair the assignment leaves at 0 is split into
     one missing and one spurious);
   - identical offsets and a shared MedDRA PT id: similarity 1 ("match");
   - a shared PT id, offsets differ: ``0.2 + 0.8 * overlap`` ("span clash");
   - no shared PT id: ``0.8 * overlap`` ("code clash", whatever the overlap).

   Unpaired gold mentions are *missing*, unpaired submission mentions *spurious*.

2. Use case 1, mention finding (score.py ``OSEMetric1Weighted``, "Exact mention match -
   weighted"), micro-averaged over the corpus. Counts: match, clash (every other pair), missing,
   spurious. A clash earns half credit, a spurious mention costs a quarter of an error:
   ``P = (match + 0.5 clash) / (match + clash + 0.25 spurious)``,
   ``R = (match + 0.5 clash) / (match + clash + missing)``, F = their harmonic mean.

3. Use case 2, MedDRA coding (score.py ``FrontOfficeMedDRARetrieval``), per section, then
   macro-averaged over sections (P, R and F each averaged; F is not recomputed from the means):
   matched codes = every gold PT id of a gold mention paired with a shared code (match or span
   clash); missing codes = the gold PT ids of code-clash pairs and of missing gold mentions;
   spurious codes = the submission PT id of code-clash pairs and of spurious mentions; missing
   and spurious lose the matched codes. ``P = matched / (matched + spurious)``,
   ``R = matched / (matched + missing)``.

4. Quality (score.py ``FrontOfficeQuality``, section scope): for every submission code that has
   at least one pair with a shared code in the section, the share of that code's submission
   mentions that are supported by an identically coded gold mention, weighted by overlap:
   ``(exact matches + sum of span-clash overlaps) / (exact matches + span clashes + code clashes
   + spurious mentions with that code)``. A section's quality is the mean over its codes; the
   corpus quality is the mean over the sections that have at least one such code (None if none).

5. Empty denominators (score.py ``Aggregator._prf``): precision is 1 when nothing was submitted,
   recall is 1 when there is nothing to find, F is 0 when both P and R are 0. So a section with
   neither gold nor submission mentions scores 1 in use case 2, as in the reference scorer.

6. Which mentions are scored (label.py, tac_format.py): gold mentions of type
   ``OSE_Labeled_AE`` (ADE Eval) or ``AdverseReaction`` (TAC 2017), positive only (TAC's rule:
   not Negated, not Hypothetical because of a DrugClass or Animal -- applied by
   `linker.formats.ade_xml.read_ade_xml`); a mention whose first offset or last end lies in one
   of the gold label's ``<IgnoredRegion>``s of its section is left out, as is a mention with no
   MedDRA PT id (TAC ``flag="unmapped"``). A mention's codes are the ``meddra_pt_id`` of its own
   ``<Normalization>`` children (ADE Eval) or, failing those, of the ``<Reaction>`` whose
   ``str`` is the mention's lower-cased, white-space-collapsed text (TAC 2017). A submission
   mention is scored with its first code in use case 2 and quality (ADE Eval submissions carry
   exactly one); the pairing uses all of them.

Choices made here
-----------------

- Sections are paired by id and must have the same text in gold and submission (the reference
  pairs them by name and asserts equal ids and texts). A mismatch is an `InputFormatError`.
- Labels are paired by file name. A gold label without a submission file is an error by default
  (``missing="error"``); ``"skip"`` leaves it out with a note, as the reference does; ``"empty"``
  scores it as an empty submission. Submission files without a gold label are listed, not scored.
- The reference splits a section into regions of chained overlapping mentions before running
  Kuhn-Munkres on each; one assignment over the whole section has the same optimum.
- The worked example of the evaluation document (2 matching codes, 1 spurious, 1 missing;
  quality 0.2 and 0.5) is reconstructed in ``tests/test_ade_eval.py`` since the document itself
  was not available.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from linker.errors import ConfigError, InputFormatError, MissingInputError
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.formats.ade_xml import read_ade_xml

# Weights of the reference scorer (see the module docstring for sources).
SPAN_WEIGHT = 0.8  # share of a pair's similarity that comes from character overlap
CODE_WEIGHT = 0.2  # added when the two mentions share a MedDRA PT id
CLASH_CREDIT = 0.5  # use case 1: a clashing pair counts half a match
SPURIOUS_WEIGHT = 0.25  # use case 1: a spurious mention counts a quarter of an error
SCORED_TYPES = ("OSE_Labeled_AE", "AdverseReaction")
MISSING_RULES = ("error", "skip", "empty")

_SPACES = re.compile(r"\s+")


# ----------------------------------------------------------------------------- mentions and pairing


@dataclass(frozen=True)
class EvalMention:
    """One adverse-event mention: its section, its (start, length) pieces, its MedDRA PT id(s)."""

    section: str
    pieces: tuple[tuple[int, int], ...]
    codes: tuple[str, ...]
    type: str = "OSE_Labeled_AE"
    mention_id: str = ""

    def __post_init__(self) -> None:
        where = f"mention {self.mention_id or '(no id)'} in section {self.section}"
        if not self.pieces or any(
            not (isinstance(s, int) and isinstance(n, int)) or s < 0 or n < 1 for s, n in self.pieces
        ):
            raise InputFormatError(where, "one or more (start >= 0, length >= 1) integer pieces", repr(self.pieces))
        if not self.codes or any(not isinstance(c, str) or not c for c in self.codes):
            raise InputFormatError(where, "at least one MedDRA PT id", repr(self.codes))
        object.__setattr__(self, "pieces", tuple(sorted(self.pieces)))

    @cached_property
    def intervals(self) -> tuple[tuple[int, int], ...]:
        """The pieces as sorted, merged [start, end) intervals: the mention's set of offsets."""
        merged: list[list[int]] = []
        for start, length in self.pieces:
            end = start + length
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return tuple((s, e) for s, e in merged)

    @cached_property
    def size(self) -> int:
        return sum(e - s for s, e in self.intervals)

    @property
    def extent(self) -> tuple[int, int]:
        """First offset and end of the last piece (the reference scorer's region bounds)."""
        return self.intervals[0][0], self.intervals[-1][1]

    @property
    def primary_code(self) -> str:
        return self.codes[0]


def _shared_chars(a: EvalMention, b: EvalMention) -> int:
    i = j = shared = 0
    ai, bi = a.intervals, b.intervals
    while i < len(ai) and j < len(bi):
        lo, hi = max(ai[i][0], bi[j][0]), min(ai[i][1], bi[j][1])
        if hi > lo:
            shared += hi - lo
        if ai[i][1] <= bi[j][1]:
            i += 1
        else:
            j += 1
    return shared


def span_overlap(a: EvalMention, b: EvalMention) -> float:
    """|offsets(a) & offsets(b)| / |offsets(a) | offsets(b)| (0 for mentions in different sections)."""
    if a.section != b.section:
        return 0.0
    shared = _shared_chars(a, b)
    return shared / (a.size + b.size - shared)


PairKind = Literal["match", "span_clash", "code_clash"]


@dataclass(frozen=True)
class Pair:
    """Gold mention `gold` paired with submission mention `submission` (indices into the section's lists)."""

    gold: int
    submission: int
    similarity: float
    overlap: float
    exact_span: bool
    codes_agree: bool

    @property
    def kind(self) -> PairKind:
        if self.codes_agree:
            return "match" if self.exact_span else "span_clash"
        return "code_clash"


def similarity(gold: EvalMention, submission: EvalMention) -> Pair:
    """The reference scorer's pair similarity (index fields 0; `pair_mentions` fills them)."""
    shared = _shared_chars(gold, submission) if gold.section == submission.section else 0
    union = gold.size + submission.size - shared
    overlap = shared / union
    agree = bool(set(gold.codes) & set(submission.codes))
    exact = shared == union
    if shared == 0:
        value = 0.0
    elif exact and agree:
        value = 1.0
    elif agree:
        value = CODE_WEIGHT + SPAN_WEIGHT * overlap
    else:
        value = SPAN_WEIGHT * overlap
    return Pair(0, 0, value, overlap, exact, agree)


@dataclass(frozen=True)
class SectionPairing:
    gold: tuple[EvalMention, ...]
    submission: tuple[EvalMention, ...]
    pairs: tuple[Pair, ...]
    missing: tuple[int, ...]  # gold indices
    spurious: tuple[int, ...]  # submission indices


def pair_mentions(gold: Sequence[EvalMention], submission: Sequence[EvalMention]) -> SectionPairing:
    """Kuhn-Munkres pairing of one section's gold and submission mentions (maximum total similarity)."""
    gold, submission = tuple(gold), tuple(submission)
    pairs: list[Pair] = []
    if gold and submission:
        g_ext = np.array([m.extent for m in gold]).reshape(-1, 2)
        s_ext = np.array([m.extent for m in submission]).reshape(-1, 2)
        # Only mentions whose extents overlap can share an offset; compute those pairs only.
        near = (g_ext[:, None, 0] < s_ext[None, :, 1]) & (s_ext[None, :, 0] < g_ext[:, None, 1])
        candidates: dict[tuple[int, int], Pair] = {}
        for i, j in zip(*np.nonzero(near), strict=True):
            pair = similarity(gold[i], submission[j])
            if pair.similarity > 0:
                candidates[(int(i), int(j))] = pair
        if candidates:
            rows = sorted({i for i, _ in candidates})
            cols = sorted({j for _, j in candidates})
            row_at = {g: r for r, g in enumerate(rows)}
            col_at = {s: c for c, s in enumerate(cols)}
            matrix = np.zeros((len(rows), len(cols)))
            for (i, j), pair in candidates.items():
                matrix[row_at[i], col_at[j]] = pair.similarity
            for r, c in zip(*linear_sum_assignment(matrix, maximize=True), strict=True):
                found = candidates.get((rows[r], cols[c]))
                if found is not None:  # a zero cell the assignment had to fill is no pair
                    pairs.append(Pair(rows[r], cols[c], found.similarity, found.overlap, found.exact_span,
                                      found.codes_agree))
    pairs.sort(key=lambda p: (p.gold, p.submission))
    paired_gold = {p.gold for p in pairs}
    paired_sub = {p.submission for p in pairs}
    return SectionPairing(
        gold, submission, tuple(pairs),
        tuple(i for i in range(len(gold)) if i not in paired_gold),
        tuple(j for j in range(len(submission)) if j not in paired_sub),
    )


# ----------------------------------------------------------------------------- scores


@dataclass(frozen=True)
class Prf:
    precision: float
    recall: float
    f1: float


def prf(match: float, clash: float, missing: float, spurious: float) -> Prf:
    """P = match / (match + clash + spurious), R = match / (match + clash + missing); 1 on an empty base."""
    hyp = match + clash + spurious
    ref = match + clash + missing
    p = match / hyp if hyp else 1.0
    r = match / ref if ref else 1.0
    f = 0.0 if p == 0 and r == 0 else 2 * p * r / (p + r)
    return Prf(p, r, f)


@dataclass(frozen=True)
class MentionScore:
    """Use case 1: weighted mention finding from the pair counts."""

    match: int
    clash: int
    missing: int
    spurious: int

    @property
    def weighted(self) -> Prf:
        half = CLASH_CREDIT * self.clash
        return prf(self.match + self.clash - half, half, self.missing, SPURIOUS_WEIGHT * self.spurious)

    def __add__(self, other: MentionScore) -> MentionScore:
        return MentionScore(self.match + other.match, self.clash + other.clash, self.missing + other.missing,
                            self.spurious + other.spurious)


@dataclass(frozen=True)
class SectionScore:
    document: str
    section: str
    name: str
    pairing: SectionPairing
    mentions: MentionScore
    codes_matched: tuple[str, ...]
    codes_missing: tuple[str, ...]
    codes_spurious: tuple[str, ...]
    quality_by_code: Mapping[str, float]

    @property
    def codes(self) -> Prf:
        """Use case 2 for this section."""
        return prf(len(self.codes_matched), 0, len(self.codes_missing), len(self.codes_spurious))

    @property
    def quality(self) -> float | None:
        values = list(self.quality_by_code.values())
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class EvalSection:
    """One section to score: its gold and submission mentions (already filtered to the scored ones)."""

    document: str
    section: str
    gold: tuple[EvalMention, ...]
    submission: tuple[EvalMention, ...]
    name: str = ""


def score_section(section: EvalSection) -> SectionScore:
    for side, mentions in (("gold", section.gold), ("submission", section.submission)):
        for m in mentions:
            if m.section != section.section:
                raise InputFormatError(f"{section.document} {side}", f"mentions of section {section.section}",
                                       f"mention {m.mention_id or '(no id)'} of section {m.section}")
    pairing = pair_mentions(section.gold, section.submission)
    gold, sub = pairing.gold, pairing.submission
    by_kind: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairing.pairs:
        by_kind[pair.kind].append(pair)
    mention_score = MentionScore(len(by_kind["match"]), len(by_kind["span_clash"]) + len(by_kind["code_clash"]),
                                 len(pairing.missing), len(pairing.spurious))

    # Use case 2: code sets of the section.
    matched: set[str] = set()
    for pair in by_kind["match"] + by_kind["span_clash"]:
        matched.update(gold[pair.gold].codes)
    missing = {c for p in by_kind["code_clash"] for c in gold[p.gold].codes}
    missing.update(c for i in pairing.missing for c in gold[i].codes)
    spurious = {sub[p.submission].primary_code for p in by_kind["code_clash"]}
    spurious.update(sub[j].primary_code for j in pairing.spurious)

    # Quality: per submission code with at least one code-sharing pair.
    credit: dict[str, float] = {}
    count: dict[str, int] = {}
    for pair in by_kind["match"] + by_kind["span_clash"]:
        code = sub[pair.submission].primary_code
        credit[code] = credit.get(code, 0.0) + (1.0 if pair.exact_span else pair.overlap)
        count[code] = count.get(code, 0) + 1
    for code in [sub[p.submission].primary_code for p in by_kind["code_clash"]] + [
        sub[j].primary_code for j in pairing.spurious
    ]:
        if code in count:
            count[code] += 1
    return SectionScore(
        section.document, section.section, section.name, pairing, mention_score,
        tuple(sorted(matched)), tuple(sorted(missing - matched)), tuple(sorted(spurious - matched)),
        {code: credit[code] / count[code] for code in sorted(count)},
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class CodeScore:
    """Use case 2 over several sections: P, R, F macro-averaged over sections, and summed code counts."""

    precision: float
    recall: float
    f1: float
    sections: int
    matched: int
    missing: int
    spurious: int


def _code_score(sections: Sequence[SectionScore]) -> CodeScore:
    per = [s.codes for s in sections]
    n = len(per)
    return CodeScore(
        sum(p.precision for p in per) / n, sum(p.recall for p in per) / n, sum(p.f1 for p in per) / n, n,
        sum(len(s.codes_matched) for s in sections), sum(len(s.codes_missing) for s in sections),
        sum(len(s.codes_spurious) for s in sections),
    )


@dataclass(frozen=True)
class DocumentScore:
    document: str
    sections: int
    mentions: MentionScore
    codes: CodeScore
    quality: float | None


@dataclass(frozen=True)
class AdeEvalResult:
    """The corpus scores, per-document rows, and what was left out; `to_dict` is JSON-ready."""

    sections: tuple[SectionScore, ...]
    mentions: MentionScore
    codes: CodeScore
    quality: float | None
    quality_sections: int
    documents: tuple[DocumentScore, ...]
    unscored_gold: int = 0
    unscored_submission: int = 0
    skipped_documents: tuple[str, ...] = ()
    extra_submissions: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        def rnd(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        def mention_dict(m: MentionScore) -> dict[str, Any]:
            w = m.weighted
            return {"match": m.match, "clash": m.clash, "missing": m.missing, "spurious": m.spurious,
                    "precision": rnd(w.precision), "recall": rnd(w.recall), "f1": rnd(w.f1)}

        def code_dict(c: CodeScore) -> dict[str, Any]:
            return {"precision": rnd(c.precision), "recall": rnd(c.recall), "f1": rnd(c.f1), "sections": c.sections,
                    "matched": c.matched, "missing": c.missing, "spurious": c.spurious}

        return {
            "metric": "ADE Eval",
            "weights": {"span": SPAN_WEIGHT, "code": CODE_WEIGHT, "clash_credit": CLASH_CREDIT,
                        "spurious_weight": SPURIOUS_WEIGHT},
            "documents": len(self.documents),
            "sections": len(self.sections),
            "gold_mentions": sum(len(s.pairing.gold) for s in self.sections),
            "submission_mentions": sum(len(s.pairing.submission) for s in self.sections),
            "unscored_gold_mentions": self.unscored_gold,
            "unscored_submission_mentions": self.unscored_submission,
            "use_case_1_mentions_micro_weighted": mention_dict(self.mentions),
            "use_case_2_codes_macro_by_section": code_dict(self.codes),
            "quality": {"value": rnd(self.quality), "sections": self.quality_sections},
            "per_document": [
                {"document": d.document, "sections": d.sections, "mentions": mention_dict(d.mentions),
                 "codes": code_dict(d.codes), "quality": rnd(d.quality)}
                for d in self.documents
            ],
            "skipped_documents": list(self.skipped_documents),
            "extra_submissions": list(self.extra_submissions),
            "notes": list(self.notes),
        }

    def to_markdown(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.2f}"

        m, w, c = self.mentions, self.mentions.weighted, self.codes
        lines = [
            f"ADE Eval: {len(self.documents)} labels, {len(self.sections)} sections, "
            f"{sum(len(s.pairing.gold) for s in self.sections)} gold and "
            f"{sum(len(s.pairing.submission) for s in self.sections)} submission mentions scored.",
            "",
            "| measure | P | R | F | counts |",
            "|---|---|---|---|---|",
            f"| use case 1: mentions, weighted, micro | {pct(w.precision)} | {pct(w.recall)} | {pct(w.f1)} | "
            f"match {m.match}, clash {m.clash}, missing {m.missing}, spurious {m.spurious} |",
            f"| use case 2: MedDRA codes, macro by section | {pct(c.precision)} | {pct(c.recall)} | {pct(c.f1)} | "
            f"matched {c.matched}, missing {c.missing}, spurious {c.spurious} |",
            f"| quality (found codes) | {pct(self.quality)} | | | {self.quality_sections} sections |",
        ]
        if self.unscored_gold or self.unscored_submission:
            lines += ["", f"Left out (no MedDRA PT id, or in an ignored region): {self.unscored_gold} gold, "
                          f"{self.unscored_submission} submission mentions."]
        lines += [f"\nNote: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def score_sections(sections: Iterable[EvalSection], **extra: Any) -> AdeEvalResult:
    """Score sections (of one or more labels); `extra` fills the result's bookkeeping fields."""
    scored = tuple(score_section(s) for s in sections)
    if not scored:
        raise MissingInputError("ADE Eval: no sections to score (no gold label was read)")
    total = MentionScore(0, 0, 0, 0)
    by_doc: dict[str, list[SectionScore]] = defaultdict(list)
    for s in scored:
        total = total + s.mentions
        by_doc[s.document].append(s)
    documents = []
    for doc, secs in by_doc.items():
        doc_mentions = MentionScore(0, 0, 0, 0)
        for s in secs:
            doc_mentions = doc_mentions + s.mentions
        documents.append(DocumentScore(doc, len(secs), doc_mentions, _code_score(secs),
                                       _mean([q for s in secs if (q := s.quality) is not None])))
    qualities = [q for s in scored if (q := s.quality) is not None]
    return AdeEvalResult(scored, total, _code_score(scored), _mean(qualities), len(qualities), tuple(documents),
                         **extra)


# ----------------------------------------------------------------------------- reading XML labels


@dataclass(frozen=True)
class EvalLabel:
    """One drug label read for scoring: section texts and names, the scored mentions, what was left out."""

    path: Path
    sections: Mapping[str, tuple[str, str]]  # id -> (name, text)
    mentions: tuple[EvalMention, ...]
    ignored_regions: Mapping[str, tuple[tuple[int, int], ...]]  # section id -> [start, end) regions
    unscored: int

    @property
    def name(self) -> str:
        return self.path.stem


def _in_region(m: EvalMention, regions: Sequence[tuple[int, int]]) -> bool:
    start, end = m.extent
    return any(lo <= start < hi or lo < end <= hi for lo, hi in regions)


def load_label(
    path: str | Path,
    *,
    ignored_regions: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> EvalLabel:
    """Read a TAC 2017 or ADE Eval XML label; `ignored_regions` (the gold's) replace the file's own."""
    path = Path(path)
    doc = read_ade_xml(path, types=SCORED_TYPES, limits=limits)
    root = doc.root
    sections = {s.get("id", ""): (s.get("name", ""), s.text or "") for s in root.find("Text")}
    mention_list = root.find("Mentions")
    elements = {e.get("id"): e for e in ([] if mention_list is None else mention_list)}
    reaction_codes: dict[str, list[str]] = {}
    for reaction in root.iter("Reaction"):
        key = _SPACES.sub(" ", reaction.get("str", "")).strip().lower()
        reaction_codes.setdefault(key, []).extend(
            n.get("meddra_pt_id", "") for n in reaction.iter("Normalization") if n.get("meddra_pt_id"))
    if ignored_regions is None:
        regions: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for region in root.iter("IgnoredRegion"):
            try:
                start, length = int(region.get("start", "")), int(region.get("len", ""))
            except ValueError:
                raise InputFormatError(path, '<IgnoredRegion section= start="integer" len="integer">',
                                       repr(dict(region.attrib))) from None
            regions[region.get("section", "")].append((start, start + length))
        ignored = {k: tuple(v) for k, v in regions.items()}
    else:
        ignored = {k: tuple(v) for k, v in ignored_regions.items()}
    mentions: list[EvalMention] = []
    unscored = 0
    for mention in doc.mentions:
        element = elements[mention.mention_id]
        codes = [n.get("meddra_pt_id", "") for n in element.iter("Normalization") if n.get("meddra_pt_id")]
        if not codes:
            codes = reaction_codes.get(_SPACES.sub(" ", mention.text).strip().lower(), [])
        # read_ade_xml has checked the offsets; a zero-length piece adds no character, so it is dropped
        pieces = tuple((s, n) for s, n in zip(map(int, element.get("start", "").split(",")),
                                               map(int, element.get("len", "").split(",")), strict=True) if n > 0)
        if not codes or not pieces:
            unscored += 1
            continue
        m = EvalMention(mention.section, pieces, tuple(dict.fromkeys(codes)), mention.type, mention.mention_id)
        if _in_region(m, ignored.get(m.section, ())):
            unscored += 1
            continue
        mentions.append(m)
    return EvalLabel(path, sections, tuple(mentions), ignored, unscored)


def label_sections(gold: EvalLabel, submission: EvalLabel) -> list[EvalSection]:
    """The sections of one gold label with the submission's mentions; refuses differing sections."""
    if set(gold.sections) != set(submission.sections):
        raise InputFormatError(submission.path, f"the gold label's sections {', '.join(sorted(gold.sections))}",
                               ", ".join(sorted(submission.sections)) or "none",
                               fix=f"score it against {gold.path}")
    out = []
    for sid, (name, text) in gold.sections.items():
        sub_text = submission.sections[sid][1]
        if sub_text != text:
            at = next((i for i, (a, b) in enumerate(zip(text, sub_text)) if a != b), min(len(text), len(sub_text)))
            raise InputFormatError(submission.path, f"section {sid} with the gold's text ({len(text)} characters)",
                                   f"{len(sub_text)} characters, first difference at offset {at}",
                                   fix=f"the submission must keep the text of {gold.path}")
        out.append(EvalSection(gold.name, sid, tuple(m for m in gold.mentions if m.section == sid),
                               tuple(m for m in submission.mentions if m.section == sid), name))
    return out


def _xml_files(folder: Path, what: str) -> dict[str, Path]:
    if not folder.is_dir():
        raise MissingInputError(f"{folder}: no such folder ({what} labels)")
    files = sorted(folder.glob("*.xml"))
    if not files and what == "gold":
        raise MissingInputError(f"{folder}: no *.xml gold labels in this folder")
    return {p.stem: p for p in files}


def score_paths(
    gold: Sequence[str | Path],
    submission: Sequence[str | Path],
    *,
    missing: str = "error",
    limits: ReadLimits = DEFAULT_LIMITS,
) -> AdeEvalResult:
    """Score gold labels against submission labels, paired by file name (stem)."""
    if missing not in MISSING_RULES:
        raise ConfigError(f"--missing must be one of {', '.join(MISSING_RULES)}, found {missing!r}")
    gold_by = {Path(p).stem: Path(p) for p in gold}
    sub_by = {Path(p).stem: Path(p) for p in submission}
    absent = [name for name in gold_by if name not in sub_by]
    if absent and missing == "error":
        raise MissingInputError(
            f"ADE Eval: no submission for {len(absent)} gold label(s): {', '.join(absent[:5])}"
            f"{' ...' if len(absent) > 5 else ''} (pass --missing skip or --missing empty to score without them)")
    sections: list[EvalSection] = []
    unscored_gold = unscored_sub = 0
    notes = []
    for name, gold_path in gold_by.items():
        if name not in sub_by and missing == "skip":
            continue
        g = load_label(gold_path, limits=limits)
        unscored_gold += g.unscored
        if name in sub_by:
            s = load_label(sub_by[name], ignored_regions=g.ignored_regions, limits=limits)
            unscored_sub += s.unscored
        else:
            s = EvalLabel(gold_path, g.sections, (), g.ignored_regions, 0)
        sections.extend(label_sections(g, s))
    if absent:
        notes.append(f"{len(absent)} gold label(s) without a submission were "
                     f"{'left out' if missing == 'skip' else 'scored as empty submissions'}")
    return score_sections(
        sections, unscored_gold=unscored_gold, unscored_submission=unscored_sub,
        skipped_documents=tuple(absent) if missing == "skip" else (),
        extra_submissions=tuple(sorted(set(sub_by) - set(gold_by))), notes=tuple(notes),
    )


def score_folders(
    gold_dir: str | Path, submission_dir: str | Path, *, missing: str = "error", limits: ReadLimits = DEFAULT_LIMITS
) -> AdeEvalResult:
    """Score every ``*.xml`` gold label in `gold_dir` against the same-named file in `submission_dir`."""
    gold = _xml_files(Path(gold_dir), "gold")
    sub = _xml_files(Path(submission_dir), "submission")
    return score_paths(list(gold.values()), list(sub.values()), missing=missing, limits=limits)


__all__ = [
    "CLASH_CREDIT", "CODE_WEIGHT", "MISSING_RULES", "SCORED_TYPES", "SPAN_WEIGHT", "SPURIOUS_WEIGHT",
    "AdeEvalResult", "CodeScore", "DocumentScore", "EvalLabel", "EvalMention", "EvalSection", "MentionScore", "Pair",
    "Prf", "SectionPairing", "SectionScore", "label_sections", "load_label", "pair_mentions", "prf", "score_folders",
    "score_paths", "score_section", "score_sections", "similarity", "span_overlap",
]
