"""The service's request and response bodies: pydantic models (they make the OpenAPI schema and validate requests)
and the two 200 bodies, built directly as JSON bytes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from linker.link import MeddraPath

if TYPE_CHECKING:
    from linker.extract import EventLinks
    from linker.service.batcher import LoadedIndex


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


IndexName = Annotated[str | None, Field(description="Index name (GET /indexes); default: the first one loaded.")]


class _TextIn(_Strict):
    """What a span (/link) and a document (/annotate) share. A subclass redefines `text` with its own description;
    the field keeps its place, first, in the schema and in the order of validation errors."""

    text: str
    lang: str | None = Field(None, description="Restrict candidates to names in this language (ISO 639-1).")
    id: str | int | None = Field(None, description="Echoed back unchanged.")


# ----------------------------------------------------------------------------- POST /link


class MentionIn(_TextIn):
    """One span to link."""

    text: str = Field(description="The span text, e.g. 'hair loss'.")


class LinkRequest(_Strict):
    mentions: list[MentionIn]
    k: int | None = Field(None, description="Concepts per mention (default 5).")
    index: IndexName = None


class CandidateOut(BaseModel):
    concept_id: str
    preferred_name: str
    matched_name: str
    score: float
    lang: str
    source: str
    term_id: str
    term_type: str
    hierarchy: list[MeddraPath] | None = None  # pydantic validates the Linker's own dataclass
    retriever_score: float | None = None  # the retriever's score; `score` is the re-ranker's when there is one
    confidence: float | None = None  # calibrated P(correct); absent when the index has no calibration


class MentionOut(BaseModel):
    id: str | int | None = None
    text: str
    lang: str | None = None
    candidates: list[CandidateOut]
    nil: bool = Field(description="No link: no candidate, or the best one below the service's --min-confidence.")
    decision: Literal["auto", "review", "no link"] | None = Field(
        None, description="What to do with the best candidate: auto (code without review), review, no link; "
                          "absent when the index has no calibration.")


class LinkResponse(BaseModel):
    index: str
    version: str
    k: int
    results: list[MentionOut]


class ErrorOut(BaseModel):
    error: str
    field: str | None = None


# ----------------------------------------------------------------------------- POST /annotate


class TextIn(_TextIn):
    """One document to annotate."""

    text: str = Field(description="The document text, e.g. a case report or a drug-label section.")
    lang: str | None = Field(None, description="The text's language (ISO 639-1): picks the tagger and the negation "
                                               "cues, and restricts candidates to names in it; without it, detected "
                                               "for the tagger and the cues only.")


class AnnotateRequest(_Strict):
    texts: list[TextIn]
    k: int | None = Field(None, description="Candidates kept per adverse event (default 1); the code is the best.")
    index: IndexName = None
    threshold: float | None = Field(None, description="In-span probability a word piece needs (default: the tagger's).")
    review_below: float | None = Field(None, description="Decision 'review' instead of 'auto' below this span confidence (default 0.5); the link's decision comes from the index's calibration.")
    style: str | None = Field(None, description="AdverseEvent spans as 'terms' (TAC 2017's convention), 'phrases' "
                                                "(PHEE's) or 'auto' (default: terms, and phrases where no term was found).")


class SpanOut(BaseModel):
    start: int
    end: int
    text: str
    label: str = Field(description="AdverseEvent, Drug, TherapeuticEffect, Indication (what the drug is given for) or "
                       "MedicalHistory (the subject's disorder, present before the drug).")
    status: str = Field(description="positive, negated or hypothetical.")
    confidence: float = Field(description="The tagger's: mean in-span probability of the span's word pieces.")
    code: str | None = None
    name: str | None = None
    link_confidence: float | None = None
    decision: str | None = Field(None, description="auto (code without review), review, no link, not coded (negated or hypothetical); "
                                                   "null for a span that is no adverse event.")
    candidates: list[CandidateOut] = []


class DocumentOut(BaseModel):
    id: str | int | None = None
    spans: list[SpanOut]


class AnnotateResponse(BaseModel):
    index: str
    version: str
    model: str
    k: int
    results: list[DocumentOut]


# ----------------------------------------------------------------------------- 200 bodies, built directly


def _json(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def link_body(loaded: LoadedIndex, k: int, mentions: list[MentionIn], results: list) -> bytes:
    """The LinkResponse as JSON bytes (built directly: 1,000 x k=100 candidates is too many to validate)."""
    out = []
    for m, result in zip(mentions, results, strict=True):
        item: dict[str, Any] = {"id": m.id} if m.id is not None else {}
        item["text"] = m.text
        if m.lang is not None:
            item["lang"] = m.lang
        item["candidates"] = [c.to_dict() for c in result.candidates]
        item["nil"] = result.nil
        if result.decision is not None:
            item["decision"] = result.decision
        out.append(item)
    return _json({"index": loaded.name, "version": loaded.linker.version, "k": k, "results": out})


def annotate_body(loaded: LoadedIndex, k: int, request: AnnotateRequest, model: str, events: EventLinks,
                  results: list, review_below: float) -> bytes:
    """The AnnotateResponse as JSON bytes: each span with its code and decision (`events.decide`); `model` the
    tagger's revision."""
    rows = events.decide(results, review_below=review_below)
    out = []
    for t, doc_rows in zip(request.texts, rows, strict=True):
        item: dict[str, Any] = {"id": t.id} if t.id is not None else {}
        item["spans"] = [{key: value for key, value in row.items() if not key.startswith("_")} for row in doc_rows]
        out.append(item)
    return _json({"index": loaded.name, "version": loaded.linker.version, "model": model, "k": k,
                  "results": out})
