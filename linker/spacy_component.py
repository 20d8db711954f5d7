"""A spaCy pipeline component: link every entity span of a Doc with a linker index.

    import spacy
    import linker.spacy_component  # registers the "linker" factory (also an entry point once installed)

    nlp = spacy.load("en_core_web_sm")  # any pipeline that sets doc.ents
    nlp.add_pipe("linker", config={"index": "indexes/default", "k": 5})
    for ent in nlp("Patient reports hair loss.").ents:
        print(ent.text, ent._.kb_ents)  # [(concept_id, score), ...], best first

The extensions follow scispaCy's EntityLinker, so a pipeline that reads ``ent._.kb_ents`` switches
by changing its ``add_pipe`` line: ``Span._.kb_ents`` is a list of (concept id, score) and
``Span._.linker`` the full `linker.link.Candidate` objects (matched name, term type, source,
MedDRA hierarchy). All entity spans of a Doc (of a batch of Docs under ``nlp.pipe``) are linked
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


class EntityLinker:
    """Sets ``ent._.kb_ents`` and ``ent._.linker`` on every span of ``doc.ents``."""

    def __init__(self, index: str, *, k: int = 5, lang: str | None = None, threshold: float | None = None,
                 batch_size: int = 256) -> None:
        if k < 1:
            raise ConfigError(f"linker component: k must be at least 1, found {k}")
        _register_extensions()
        self.linker = Linker.load(index)
        self.k, self.lang, self.threshold, self.batch_size = k, lang, threshold, batch_size

    def _link(self, docs: list[Doc]) -> None:
        spans = [ent for doc in docs for ent in doc.ents if ent.text.strip()]
        if not spans:
            return
        results = self.linker.link([ent.text for ent in spans], k=self.k, lang=self.lang)
        for ent, result in zip(spans, results, strict=True):
            candidates = [c for c in result.candidates if self.threshold is None or c.score >= self.threshold]
            ent._.linker = candidates
            ent._.kb_ents = [(c.concept_id, round(float(c.score), 6)) for c in candidates]  # as in the JSON form

    def __call__(self, doc: Doc) -> Doc:
        self._link([doc])
        return doc

    def pipe(self, docs: Iterable[Doc], *, batch_size: int | None = None) -> Iterator[Doc]:
        """`nlp.pipe`: the spans of `batch_size` Docs at a time are linked in one call."""
        size = batch_size or self.batch_size
        batch: list[Doc] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) >= size:
                self._link(batch)
                yield from batch
                batch = []
        if batch:
            self._link(batch)
            yield from batch


@Language.factory(
    "linker",
    default_config={"index": "indexes/default", "k": 5, "lang": None, "threshold": None},
    assigns=["span._.kb_ents", "span._.linker"],
    requires=["doc.ents"],
)
def make_entity_linker(nlp: Language, name: str, index: str, k: int, lang: str | None,
                       threshold: float | None) -> EntityLinker:
    """The "linker" factory: `index` is an index folder from `linker index build`; `lang` restricts
    candidates to names of one language; `threshold` drops candidates scoring below it."""
    return EntityLinker(index, k=k, lang=lang, threshold=threshold)
