"""spaCy pipeline components: "linker" links every entity span of a Doc with a linker index; "linker_ae" sets
``doc.ents`` to the adverse events, drugs and therapeutic effects the tagger (`linker.extract`) finds.

    import spacy
    import linker.spacy_component  # registers the factories (also entry points once installed)

    nlp = spacy.load("en_core_web_sm")  # any pipeline that sets doc.ents
    nlp.add_pipe("linker", config={"index": "indexes/default", "k": 5})
    for ent in nlp("Patient reports hair loss.").ents:
        print(ent.text, ent._.kb_ents)  # [(concept_id, score), ...], best first

    nlp = spacy.blank("en")  # or: extract, then link, as `linker annotate` does
    nlp.add_pipe("linker_ae")
    nlp.add_pipe("linker", config={"index": "indexes/default", "labels": ["AdverseEvent"]})
    for ent in nlp("Severe rash after lamotrigine; no fever.").ents:
        print(ent.label_, ent.text, ent._.ae_status, ent._.kb_ents)  # a negated event is not linked

"linker_ae" writes every span as an entity (``ent._.ae_status``: positive, negated or hypothetical;
``ent._.ae_confidence``); where a drug and an event overlap, the longer span is kept (spaCy's
``filter_spans``: entities may not overlap). "linker" follows it as `linker annotate` does: it links only
the entities of ``labels`` (all when None) and leaves negated and hypothetical ones unlinked.

The extensions follow scispaCy's EntityLinker, so a pipeline that reads ``ent._.kb_ents`` switches
by changing its ``add_pipe`` line: ``Span._.kb_ents`` is a list of (concept id, score) and
``Span._.linker`` the full `linker.link.Candidate` objects (matched name, term type, source,
MedDRA hierarchy, calibrated confidence); ``Span._.linker_decision`` is what to do with the best one
(auto, review, no link: `linker.confidence`; None when the index has no calibration). All entity spans of a Doc (of a batch of Docs under ``nlp.pipe``) are linked
in one `Linker.link` call; the index is loaded once, when the component is created.
Needs the optional extra: ``pip install linker[spacy]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from linker.extras import check as _check_extra

_check_extra(("spacy",), extra="spacy", what="linker.spacy_component")  # one line, not an ImportError, without it

from spacy.language import Language  # noqa: E402
from spacy.tokens import Doc, Span  # noqa: E402

from linker.errors import ConfigError  # noqa: E402
from linker.link import Linker  # noqa: E402


def _register_extensions() -> None:
    # default=[] as scispaCy does, so code written for it reads an unlinked span the same way;
    # an extension that scispaCy already registered is left as it is.
    for name in ("kb_ents", "linker"):
        if not Span.has_extension(name):
            Span.set_extension(name, default=[])
    # "linker_decision": set by "linker" (auto, review, no link; None without a calibrated index), like the JSON form
    for name in ("ae_status", "ae_confidence", "linker_decision"):  # None on other pipelines' entities
        if not Span.has_extension(name):
            Span.set_extension(name, default=None)


def _batches(docs: Iterable[Doc], size: int) -> Iterator[list[Doc]]:
    batch: list[Doc] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class EntityLinker:
    """Sets ``ent._.kb_ents`` and ``ent._.linker`` on every span of ``doc.ents``."""

    def __init__(self, index: str, *, k: int = 5, lang: str | None = None, threshold: float | None = None,
                 batch_size: int = 256, labels: list[str] | None = None) -> None:
        if k < 1:
            raise ConfigError(f"linker component: k must be at least 1, found {k}")
        _register_extensions()
        self.linker = Linker.load(index)
        self.k, self.lang, self.threshold, self.batch_size = k, lang, threshold, batch_size
        self.labels = None if labels is None else set(labels)

    def _wanted(self, ent: Span) -> bool:
        # a negated or hypothetical event is no event of the drug: not coded, as `linker annotate` decides
        return (bool(ent.text.strip()) and (self.labels is None or ent.label_ in self.labels)
                and ent._.ae_status in (None, "positive"))

    def _link(self, docs: list[Doc]) -> None:
        spans = [ent for doc in docs for ent in doc.ents if self._wanted(ent)]
        if not spans:
            return
        results = self.linker.link([ent.text for ent in spans], k=self.k, lang=self.lang)
        for ent, result in zip(spans, results, strict=True):
            candidates = [c for c in result.candidates if self.threshold is None or c.score >= self.threshold]
            ent._.linker = candidates
            ent._.kb_ents = [(c.concept_id, round(float(c.score), 6)) for c in candidates]  # as in the JSON form
            ent._.linker_decision = result.decision

    def __call__(self, doc: Doc) -> Doc:
        self._link([doc])
        return doc

    def pipe(self, docs: Iterable[Doc], *, batch_size: int | None = None) -> Iterator[Doc]:
        """`nlp.pipe`: the spans of `batch_size` Docs at a time are linked in one call."""
        for batch in _batches(docs, batch_size or self.batch_size):
            self._link(batch)
            yield from batch


class EventExtractor:
    """Sets ``doc.ents`` to the spans of the tagger (`linker.extract`), with ``_.ae_status`` and ``_.ae_confidence``."""

    def __init__(self, model: str = "auto", *, style: str = "auto", assertion: str = "rules",
                 threshold: float | None = None, labels: list[str] | None = None, batch_size: int = 32,
                 lang: str | None = None) -> None:
        from linker.extract import extract, load_extractor

        _register_extensions()
        self.extractor = load_extractor(model)
        self.options = {"style": style, "assertion": assertion, "threshold": threshold, "labels": labels}
        extract(["check the options"], model=self.extractor, **self.options)  # a bad option fails here, not mid-pipe
        self.options["lang"] = lang  # the pipeline's language picks the tagger and cues; None: detected per Doc
        self.batch_size = batch_size

    def _set(self, docs: list[Doc]) -> None:
        from spacy.util import filter_spans

        from linker.extract import annotate_documents

        texts = [doc.text for doc in docs]
        found = (annotate_documents(texts, model=self.extractor, **self.options) if any(t.strip() for t in texts)
                 else [[] for _ in docs])
        for doc, spans in zip(docs, found, strict=True):
            ents = []
            contiguous = [(s.start, s.end) for s in spans if s.pieces is None]
            for span in spans:
                # An entity is contiguous: a discontinuous event ("ciliary and conjunctival hyperemia": "ciliary ...
                # hyperemia") is set on its piece that no other span covers ("ciliary"), the word it was tagged by.
                start, end = (span.start, span.end) if span.pieces is None else next(
                    ((a, b) for a, b in span.pieces if not any(s < b and a < e for s, e in contiguous)), span.pieces[0])
                ent = doc.char_span(start, end, label=span.label, alignment_mode="expand")
                if ent is not None:
                    ent._.ae_status, ent._.ae_confidence = span.status, round(span.confidence, 4)
                    ents.append(ent)
            doc.ents = filter_spans(ents)

    def __call__(self, doc: Doc) -> Doc:
        self._set([doc])
        return doc

    def pipe(self, docs: Iterable[Doc], *, batch_size: int | None = None) -> Iterator[Doc]:
        """`nlp.pipe`: `batch_size` Docs per tagger call."""
        for batch in _batches(docs, batch_size or self.batch_size):
            self._set(batch)
            yield from batch


@Language.factory(
    "linker",
    default_config={"index": "indexes/default", "k": 5, "lang": None, "threshold": None, "labels": None},
    assigns=["span._.kb_ents", "span._.linker"],
    requires=["doc.ents"],
)
def make_entity_linker(nlp: Language, name: str, index: str, k: int, lang: str | None,
                       threshold: float | None, labels: list[str] | None) -> EntityLinker:
    """The "linker" factory: `index` is an index folder from `linker index build`; `lang` restricts
    candidates to names of one language; `threshold` drops candidates scoring below it; `labels` links only
    the entities of these labels (all when None)."""
    return EntityLinker(index, k=k, lang=lang, threshold=threshold, labels=labels)


@Language.factory(
    "linker_ae",
    default_config={"model": "auto", "style": "auto", "assertion": "rules", "threshold": None, "labels": None},
    assigns=["doc.ents", "span._.ae_status", "span._.ae_confidence"],
)
def make_event_extractor(nlp: Language, name: str, model: str, style: str, assertion: str,
                         threshold: float | None, labels: list[str] | None) -> EventExtractor:
    """The "linker_ae" factory: the tagger `model` ("auto": the shipped one of the pipeline's language, linker-ae
    for English, linker-ae-multi for the others; a shipped name, or a release folder) with
    `linker.extract.extract`'s options; its spans replace ``doc.ents``. A multi-language pipeline ("xx") detects
    each Doc's language."""
    from linker.language import LANGUAGES

    return EventExtractor(model, style=style, assertion=assertion, threshold=threshold, labels=labels,
                          lang=nlp.lang if nlp.lang in LANGUAGES else None)
