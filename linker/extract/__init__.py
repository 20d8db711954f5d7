"""Adverse-event extraction: from text to spans (`extract`), and from text to MedDRA codes (`annotate`).

The tagger (`linker.extract.model`) finds AdverseEvent, Drug, TherapeuticEffect and Indication spans, each with a
status (positive, negated, hypothetical) and a confidence, and its decision head (`linker.extract.decision`) turns a
positive AdverseEvent span it reads as no event of the drug into an Indication, a TherapeuticEffect or a
MedicalHistory (present before the drug) span; it ships as two release folders, ``linker/models/linker-ae``
(English, on all-MiniLM-L6-v2) and ``linker/models/linker-ae-multi`` (es, fr, de, nl, ja, on multilingual-e5-small),
trained by `linker train extractor` (`linker.extract.train`) on PHEE and the TAC 2017 training labels; by default
each text is tagged by the one of its language (`load_extractor`'s "auto": `ByLanguage`). `annotate` links every
positive AdverseEvent span with a `linker.link.Linker` and says what to do with it (`DECISIONS`).

    from linker.extract import extract
    spans = extract(["Severe rash after starting lamotrigine."])[0]  # [ExtractedSpan(start=0, end=11, ...), ...]
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING

from linker.confidence import AUTO, NO_LINK, REVIEW
from linker.errors import ConfigError, InputFormatError, shorten
from linker.extract.data import AE, BENEFIT, DRUG, HISTORY, INDICATION, LABELS, STATUSES
from linker.extract.extractor import BY_LANGUAGE, MULTI, NAME, ByLanguage, Extractor, load_extractor, text_languages
from linker.extract.lexicon import Lexicon, non_event_ids
from linker.extract.model import ExtractedSpan

if TYPE_CHECKING:
    from linker.link import Linker

log = logging.getLogger(__name__)

# What `annotate` decides for a span: the link's decision (`linker.confidence`: "auto", code it without review;
# "review", a person should look; "no link", the index likely has no concept for it or none above the Linker's
# min_confidence), "review" too when the extraction is not sure (its confidence below `review_below`) or the index
# has no calibration (no link confidence to trust), and "not coded" (negated or hypothetical: no event of the drug).
DECISIONS = (AUTO, REVIEW, NO_LINK, "not coded")
REVIEW_BELOW = 0.5


def check_texts(texts: Sequence[str], where: str = "texts") -> list[str]:
    if isinstance(texts, str):
        raise InputFormatError(where, "a list of texts", f"one string {shorten(texts)}", fix="wrap it in a list")
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InputFormatError(f"{where}[{i}]", "a non-empty text",
                                   shorten(text) if isinstance(text, str) else type(text).__name__)
        out.append(text)
    return out


def extract(texts: Sequence[str], *, model: str | Extractor = BY_LANGUAGE, threshold: float | None = None,
            labels: Sequence[str] | None = None, style: str = "auto", assertion: str = "rules"
            ) -> list[list[ExtractedSpan]]:
    """The spans of each text: character offsets into it, label, status, confidence; sorted by position.

    model: "auto" (the default: each text's tagger by its detected language, `ByLanguage`), a release name or
    folder (`linker-ae`, `linker-ae-multi`) or a loaded `Extractor`; threshold: the in-span probability a word piece
    needs (default: the release's, chosen on dev); labels: keep only these (AdverseEvent, Drug, TherapeuticEffect,
    Indication, MedicalHistory); style: AdverseEvent spans as ``terms`` (TAC 2017's convention, learnt from drug
    labels), ``phrases`` (PHEE's, from case reports) or ``auto`` (the default: terms, and phrases where no term was
    found; `linker.extract.extractor.STYLES`); assertion: ``rules`` (the default: the tagger's status, then
    the NegEx-style cues of `linker.extract.assertion` for the spans it calls positive) or ``model`` (its status only).
    """
    texts = check_texts(texts)
    _check_options(threshold, labels)
    return annotate_documents(texts, model=model, threshold=threshold,
                              labels=tuple(labels) if labels is not None else None, style=style, assertion=assertion)


def _check_options(threshold: float | None, labels: Sequence[str] | None) -> None:
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ConfigError(f"threshold: expected a probability between 0 and 1, found {threshold}")
    if labels is not None:
        unknown = [label for label in labels if label not in (AE, DRUG, BENEFIT, INDICATION, HISTORY)]
        if unknown:
            raise ConfigError(f"labels: expected some of {AE}, {DRUG}, {BENEFIT}, {INDICATION}, {HISTORY}, found "
                              f"{', '.join(map(str, unknown))}")


def annotate_documents(texts: Sequence[str], *, model: str | Extractor = BY_LANGUAGE, linker: Linker | None = None,
                       k: int = 1, lang: str | None = None, langs: Sequence[str | None] | None = None,
                       threshold: float | None = None, labels: Sequence[str] | None = None, style: str = "auto",
                       assertion: str = "rules", review_below: float = REVIEW_BELOW,
                       lexicon: Lexicon | None = None) -> list[list]:
    """The one extract-then-link pipeline: every front end runs it on its batch of texts (`extract` and `annotate`,
    `linker extract` / `linker annotate` through `linker.extract.io.tag_documents`, Ray's
    `linker.engine.ray.annotate_shard`, the spaCy component and `bench/extract.py`; the service runs its steps,
    `tag` and `EventLinks`, with its own workers between them).

    Tags `texts` with the tagger `model` (a release name or folder, or a loaded `Extractor`); without `linker`,
    returns each text's `ExtractedSpan`s; with it, each text's annotated spans (`annotate_spans`: the positive
    AdverseEvent spans linked in one `Linker.link` call, `langs` each text's language, None for `lang`). The
    options are checked by the callers' edges (`extract`, `annotate`, the CLI), once, not here per batch.
    `lexicon`: dictionary names the tagger takes as evidence; by default those of `linker`'s index (`lexicon_of`).
    """
    # a name or folder is loaded; anything else is a loaded extractor (an `Extractor`, or a stand-in with `extract`)
    extractor = load_extractor(model) if isinstance(model, (str, PathLike)) else model
    if lexicon is None and linker is not None and isinstance(extractor, (Extractor, ByLanguage)):
        lexicon = lexicon_of(linker)
    spans = tag(extractor, texts, lexicon=lexicon, langs=langs, lang=lang, threshold=threshold, labels=labels,
                style=style, assertion=assertion)
    if linker is None:
        return spans
    return annotate_spans(linker, texts, spans, k=k, lang=lang, langs=langs, review_below=review_below)


# The steps of `annotate_documents`: tag (`tag`), then link and decide (`EventLinks`). The service runs the same
# steps with its own workers in between (a tagger queue, a batcher shared by concurrent requests), so it calls them
# one by one instead of the whole pipeline.


def tag(extractor: Extractor | ByLanguage, texts: Sequence[str], *, lexicon: Lexicon | None = None,
        langs: Sequence[str | None] | None = None, lang: str | None = None, **options) -> list[list]:
    """The tagging step: `extractor.extract` over `texts` with `options` (threshold, labels, style, assertion), the
    dictionary names `lexicon` as evidence (left out when None) and each text's language (`text_languages`: its
    own in `langs`, else `lang`, else detected), which picks its tagger (`ByLanguage`) and its assertion cues. A
    stand-in with its own `extract` gets neither lexicon nor languages it was not given. The link keeps `lang` and
    `langs` as given: a detected language does not restrict the candidates."""
    if lexicon is not None:
        options["lexicon"] = lexicon
    if isinstance(extractor, (Extractor, ByLanguage)):
        options["langs"] = text_languages(texts, langs, lang)
    return extractor.extract(list(texts), **options)


# An index of more names than this lends the tagger none: a set of 5M normalised names holds ~1 GB, and names by the
# million are mostly synonyms of rare concepts that a drug-safety text does not hold.
LEXICON_MAX_NAMES = 2_000_000
_LEXICONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LEXICONS_LOCK = threading.Lock()


def lexicon_of(linker: Linker) -> Lexicon | None:
    """The names of `linker`'s index as a `Lexicon`, built once per Linker; None above `LEXICON_MAX_NAMES`. The
    names of concepts that name no event (HPO's Left, Bilateral, Mild, Frequent: `non_event_ids`) are left out,
    in every language: the tagger takes a dictionary name inside its span for an event of its own."""
    index = linker.index
    with _LEXICONS_LOCK:
        if linker not in _LEXICONS:
            table = index.concepts.table
            if table.num_rows > LEXICON_MAX_NAMES:
                log.warning("%s: %d names, more than the %d the tagger reads as evidence; it tags without them",
                            index.folder, table.num_rows, LEXICON_MAX_NAMES)
                _LEXICONS[linker] = None
            else:
                import pyarrow as pa
                import pyarrow.compute as pc

                qualifiers = pc.is_in(table.column("concept_id"), value_set=pa.array(sorted(non_event_ids())))
                names = table.column("name").filter(pc.invert(qualifiers))
                _LEXICONS[linker] = Lexicon(names.to_pylist(), source=str(index.folder))
        return _LEXICONS[linker]


def events_to_link(spans: Sequence[Sequence[ExtractedSpan]]) -> list[tuple[int, int]]:
    """(text, span) positions of the spans `annotate` links: the positive AdverseEvent ones."""
    return [(t, i) for t, doc in enumerate(spans) for i, s in enumerate(doc)
            if s.label == AE and s.status == "positive" and s.text.strip()]


def link_text(span: ExtractedSpan) -> str:
    return " ".join(span.text.split())


def decide(spans: Sequence[Sequence[ExtractedSpan]], linked: dict, *, review_below: float = REVIEW_BELOW
           ) -> list[list[dict]]:
    """One dict per span: its fields and ``code``, ``name``, ``link_confidence``, ``decision`` (`DECISIONS`;
    None for a span that is no adverse event), ``candidates``; `linked` maps `events_to_link` positions to
    their `LinkResult`."""
    out = []
    for t, doc in enumerate(spans):
        rows = []
        for i, span in enumerate(doc):
            row = span.to_dict()
            result = linked.get((t, i))
            if span.label != AE:
                row.update(code=None, name=None, link_confidence=None, decision=None, candidates=[])
            elif result is None:
                row.update(code=None, name=None, link_confidence=None, decision="not coded", candidates=[])
            elif result.nil:
                row.update(code=None, name=None, link_confidence=None, decision=NO_LINK, candidates=[])
            else:
                best = result.candidates[0]
                confidence = best.confidence
                decision = REVIEW if result.decision is None else result.decision
                if decision == AUTO and span.confidence < review_below:
                    decision = REVIEW
                row.update(code=None if decision == NO_LINK else best.concept_id,
                           name=None if decision == NO_LINK else best.preferred_name,
                           link_confidence=None if confidence is None else round(float(confidence), 4),
                           decision=decision, candidates=[c.to_dict() for c in result.candidates])
                if decision != NO_LINK:  # a "no link" span keeps its candidates for a person, but is not coded
                    row["_candidates"] = result.candidates  # for the ade-xml writer; `public` drops it
            rows.append(row)
        out.append(rows)
    return out


def annotate_spans(linker: Linker, texts: Sequence[str], spans: Sequence[Sequence[ExtractedSpan]], *, k: int = 1,
                   lang: str | None = None, langs: Sequence[str | None] | None = None,
                   review_below: float = REVIEW_BELOW) -> list[list[dict]]:
    """Link the positive AdverseEvent spans of `spans` (as from `extract`) with `linker` (`decide`): `lang` for all,
    or `langs`, one per text (None: `lang`), a language the index lacks linked against all
    (`linker.link.Linker.usable_langs`)."""
    if not 0.0 <= review_below <= 1.0:
        raise ConfigError(f"review_below: expected a probability from 0 to 1, found {review_below}")
    events = EventLinks.of(spans, lang=lang, langs=langs)
    return events.decide(events.link(linker, k), review_below=review_below)


@dataclass(frozen=True)
class EventLinks:
    """The link-and-decide step of the annotate pipeline: which spans of the tagged texts are linked
    (`events_to_link`), the texts and languages they are linked with, and their rows once the results are back
    (`decide`). `annotate_spans` links them in one `Linker.link` call (`link`); the service sends `mentions` and
    `langs` through its batcher instead, and both decide here."""

    spans: Sequence[Sequence[ExtractedSpan]]
    wanted: list[tuple[int, int]]  # (text, span) of each mention
    mentions: list[str]
    langs: list[str | None] | None  # one per mention; None: `lang` for all
    lang: str | None = None

    @classmethod
    def of(cls, spans: Sequence[Sequence[ExtractedSpan]], *, lang: str | None = None,
           langs: Sequence[str | None] | None = None) -> EventLinks:
        """The events of `spans`; `langs` one language per text (None: `lang`), or `lang` for all."""
        wanted = events_to_link(spans)
        return cls(spans, wanted, [link_text(spans[t][i]) for t, i in wanted],
                   None if langs is None else [langs[t] or lang for t, _ in wanted], lang)

    def link(self, linker: Linker, k: int) -> list:
        """Their `LinkResult`s from one `Linker.link` call: `lang` for all (refused when the index lacks it), or
        each mention's language (a language the index lacks linked against all: `Linker.usable_langs`)."""
        if not self.mentions:
            return []
        if self.langs is None:
            return linker.link(self.mentions, k=k, lang=self.lang)
        return linker.link(self.mentions, k=k, langs=self.langs)

    def decide(self, results: Sequence, *, review_below: float = REVIEW_BELOW) -> list[list[dict]]:
        """One row per span of every text (`decide`), `results` being the `LinkResult` of each mention."""
        return decide(self.spans, dict(zip(self.wanted, results, strict=True)), review_below=review_below)


def annotate(texts: Sequence[str], linker: Linker, *, model: str | Extractor = BY_LANGUAGE, k: int = 1,
             lang: str | None = None, threshold: float | None = None, style: str = "auto",
             assertion: str = "rules", review_below: float = REVIEW_BELOW) -> list[list[dict]]:
    """Extract, then link each positive AdverseEvent span with `linker` (`annotate_spans`)."""
    texts = check_texts(texts)
    if k < 1:
        raise ConfigError(f"k: expected an integer >= 1, found {k}")
    _check_options(threshold, None)
    return annotate_documents(texts, model=model, linker=linker, k=k, lang=lang, threshold=threshold, style=style,
                              assertion=assertion, review_below=review_below)


def public(row: dict) -> dict:
    """An annotated span without its private fields (JSON-ready)."""
    return {key: value for key, value in row.items() if not key.startswith("_")}


__all__ = ["AE", "BENEFIT", "BY_LANGUAGE", "DECISIONS", "DRUG", "HISTORY", "INDICATION", "LABELS", "MULTI", "NAME",
           "REVIEW_BELOW", "STATUSES", "ByLanguage", "EventLinks", "ExtractedSpan", "Extractor", "Lexicon",
           "annotate", "annotate_documents", "annotate_spans", "decide", "events_to_link", "extract", "lexicon_of",
           "link_text", "load_extractor", "public", "tag"]
