"""HTTP service over the same `Linker` as the CLI: POST /link, GET /health, GET /indexes, /docs.

    app = create_app(["indexes/default"])       # indexes load here, once, before serving
    uvicorn.run(app, host="127.0.0.1", port=8000)

Every problem with a request is a 4xx JSON body ``{"error": "...", "field": "..."}`` that names
the field (``mentions[3].text``), what was expected and what was found; a 5xx means a bug in
the service, never bad client input.

Concurrency: linking is CPU-bound, so `/link` is a plain (sync) endpoint that Starlette runs in
its threadpool, leaving the event loop free for /health and other requests. Each index has one
worker thread (`MentionBatcher`) that links the mentions of all requests waiting at that moment in
one call: a sparse product or an encoder pass over 100 queries costs little more than over one, so
concurrent single-mention requests share the work instead of queueing behind a lock. That worker
is the only thread that touches its `Linker`, which keeps the Linker's lazy caches safe.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

import linker
from linker.errors import ConfigError, LinkerError, UnknownNameError
from linker.link import Linker, MeddraPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceLimits:
    """Request limits; each bounds the work (and memory) that one request can ask for."""

    max_text_chars: int = 500  # a mention is a phrase; 500 characters is ~10x the longest in the eval corpora
    max_mentions: int = 1000  # ~1 s of tf-idf linking on one core: keeps one request from starving others
    max_k: int = 100
    default_k: int = 5
    # Upper bound of a valid body: max_mentions * (max_text_chars * 4 UTF-8 bytes + ~100 bytes of
    # JSON and id) ~ 2.1 MB at the defaults; 4 MiB leaves room and refuses anything larger unread.
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise ConfigError(f"service limit {name} must be >= 1, found {value}")
        if self.default_k > self.max_k:
            raise ConfigError(f"default_k {self.default_k} is above max_k {self.max_k}")


# ----------------------------------------------------------------------------- request / response


class MentionIn(BaseModel):
    """One span to link."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(description="The span text, e.g. 'hair loss'.")
    lang: str | None = Field(None, description="Restrict candidates to names in this language (ISO 639-1).")
    id: str | int | None = Field(None, description="Echoed back unchanged.")


class LinkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mentions: list[MentionIn]
    k: int | None = Field(None, description="Concepts per mention (default 5).")
    index: str | None = Field(None, description="Index name (GET /indexes); default: the first one loaded.")


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


class MentionOut(BaseModel):
    id: str | int | None = None
    text: str
    lang: str | None = None
    candidates: list[CandidateOut]


class LinkResponse(BaseModel):
    index: str
    version: str
    k: int
    results: list[MentionOut]


class ErrorOut(BaseModel):
    error: str
    field: str | None = None


class RequestFieldError(Exception):
    """A request field that failed a check the schema cannot express (limits, index names)."""

    def __init__(self, field: str, expected: str, found: str, status: int = 422) -> None:
        self.field = field
        self.status = status
        super().__init__(f"{field}: expected {expected}, found {found}")


# pydantic appends the tried member of a union (`id: str | int`) to an error's location;
# no request field has these names, so they are dropped to name the field itself.
_UNION_TAGS = frozenset({"str", "int"})


def _field_name(loc: Sequence[Any]) -> str:
    """('body', 'mentions', 3, 'text') -> 'mentions[3].text'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if part in _UNION_TAGS:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------- app


@dataclass
class _Job:
    texts: list[str]
    k: int
    lang: str | None
    done: threading.Event
    results: list | None = None
    error: BaseException | None = None


class MentionBatcher:
    """Links the mentions of concurrent requests together, on one worker thread per index."""

    # Mentions per Linker.link call; tf-idf search is chunked by 1,024 queries, so this stays
    # within one chunk and a request's wait is bounded by one such call.
    MAX_BATCH = 512

    def __init__(self, linker: Linker, name: str) -> None:
        self.linker = linker
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"linker-batcher-{name}", daemon=True).start()

    def link(self, texts: list[str], *, k: int, lang: str | None) -> list:
        """Blocks the calling (threadpool) thread until the worker has linked `texts`."""
        job = _Job(texts, k, lang, threading.Event())
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.results

    def _run(self) -> None:
        while True:
            jobs = [self._queue.get()]
            size = len(jobs[0].texts)
            while size < self.MAX_BATCH:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
                size += len(jobs[-1].texts)
            groups: dict[tuple[int, str | None], list[_Job]] = {}
            for job in jobs:
                groups.setdefault((job.k, job.lang), []).append(job)
            for (k, lang), group in groups.items():
                self._link_group(group, k, lang)

    def _link_group(self, group: list[_Job], k: int, lang: str | None) -> None:
        try:
            results = self.linker.link([t for job in group for t in job.texts], k=k, lang=lang)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
            if len(group) > 1:  # one request's input must not fail the others: retry each alone
                for job in group:
                    self._link_group([job], k, lang)
                return
            group[0].error = exc
            group[0].done.set()
            return
        offset = 0
        for job in group:
            job.results = results[offset : offset + len(job.texts)]
            offset += len(job.texts)
            job.done.set()


@dataclass
class _Loaded:
    name: str
    linker: Linker
    batcher: MentionBatcher
    languages: frozenset[str]


def load_indexes(index_dirs: Sequence[str | Path]) -> dict[str, _Loaded]:
    """Load each index folder once; its name is the folder name (which must be unique)."""
    if not index_dirs:
        raise ConfigError("no index given; pass --index DIR (one or more)")
    loaded: dict[str, _Loaded] = {}
    for folder in index_dirs:
        name = Path(folder).resolve().name
        if name in loaded:
            raise ConfigError(f"two indexes named {name!r}; index folders must have distinct names")
        lk = Linker.load(folder)
        loaded[name] = _Loaded(name, lk, MentionBatcher(lk, name), frozenset(lk.languages))
        log.info("loaded index %s (%s)", name, lk.version)
    return loaded


def create_app(index_dirs: Sequence[str | Path], limits: ServiceLimits = ServiceLimits()) -> FastAPI:
    """The FastAPI app with `index_dirs` loaded (LinkerError here, before serving, if one is bad)."""
    indexes = load_indexes(index_dirs)
    default = next(iter(indexes))
    app = FastAPI(
        title="linker",
        version=linker.__version__,
        description="Multilingual medical entity linking: spans in, ranked concepts out.",
    )
    app.state.indexes = indexes
    app.state.limits = limits

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return JSONResponse({"error": f"Content-Length: expected a number, found {_short(length)}",
                                     "field": "body"}, status_code=400)
            if int(length) > limits.max_body_bytes:
                return JSONResponse(
                    {"error": f"body: expected at most {limits.max_body_bytes} bytes, found {length}", "field": "body"},
                    status_code=413,
                )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request", "type": "invalid"}
        if first.get("type") == "json_invalid":
            return JSONResponse({"error": f"body: expected JSON, found invalid JSON ({first.get('msg')})",
                                 "field": "body"}, status_code=400)
        details = [
            {"field": _field_name(e.get("loc", ())), "message": str(e.get("msg")), "type": str(e.get("type"))}
            for e in errors[:20]
        ]
        field = details[0]["field"]
        found = first.get("input", None)
        message = f"{field}: {details[0]['message']}"
        if first.get("type") != "missing":
            message += f", found {_short(found)}"
        return JSONResponse({"error": message, "field": field, "errors": details}, status_code=422)

    @app.exception_handler(RequestFieldError)
    async def field_error(_request: Request, exc: RequestFieldError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=exc.status)

    @app.exception_handler(LinkerError)
    async def linker_error(_request: Request, exc: LinkerError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    # /health and /indexes are async: they run on the event loop, so they answer at once even
    # while every threadpool worker is busy waiting for its index's batcher.
    @app.get("/health")
    async def health() -> dict:
        """Liveness: the service is up and its indexes are loaded."""
        return {"status": "ok", "version": linker.__version__, "indexes": list(indexes)}

    @app.get("/indexes")
    async def list_indexes() -> dict:
        """The loaded indexes with their versions, languages and build manifests."""
        return {
            "default": default,
            "indexes": [
                {"name": i.name, "version": i.linker.version, "languages": sorted(i.languages),
                 "manifest": i.linker.manifest}
                for i in indexes.values()
            ],
        }

    @app.post(
        "/link",
        response_model=LinkResponse,
        response_model_exclude_none=True,
        responses={400: {"model": ErrorOut}, 413: {"model": ErrorOut}, 422: {"model": ErrorOut}},
    )
    def link(request: LinkRequest) -> dict:
        """Link mentions to ranked concepts (score desc, concept_id) with the matched dictionary name."""
        name = request.index or default
        if name not in indexes:
            raise RequestFieldError("index", f"one of {', '.join(indexes)}", repr(name))
        loaded = indexes[name]
        k = limits.default_k if request.k is None else request.k
        if not 1 <= k <= limits.max_k:
            raise RequestFieldError("k", f"an integer from 1 to {limits.max_k}", str(k))
        mentions = request.mentions
        if not mentions:
            raise RequestFieldError("mentions", "at least one mention", "an empty list")
        if len(mentions) > limits.max_mentions:
            raise RequestFieldError("mentions", f"at most {limits.max_mentions} mentions", f"{len(mentions)}", 413)
        for i, m in enumerate(mentions):
            if not m.text.strip():
                raise RequestFieldError(f"mentions[{i}].text", "a non-empty text", repr(m.text))
            if len(m.text) > limits.max_text_chars:
                raise RequestFieldError(
                    f"mentions[{i}].text", f"at most {limits.max_text_chars} characters", f"{len(m.text)}"
                )
            if m.lang is not None and m.lang not in loaded.languages:
                raise RequestFieldError(
                    f"mentions[{i}].lang", f"a language of index {name} ({', '.join(sorted(loaded.languages))})",
                    _short(m.lang),
                )
        by_lang: dict[str | None, list[int]] = {}
        for i, m in enumerate(mentions):
            by_lang.setdefault(m.lang, []).append(i)
        candidates: list[list[dict]] = [[] for _ in mentions]
        for lang, rows in by_lang.items():
            try:
                results = loaded.batcher.link([mentions[i].text for i in rows], k=k, lang=lang)
            except UnknownNameError as exc:  # belt and braces: languages were checked above
                raise RequestFieldError("mentions.lang", f"one of {', '.join(exc.choices)}", repr(lang)) from None
            for i, result in zip(rows, results, strict=True):
                candidates[i] = [c.to_dict() for c in result.candidates]
        return {
            "index": name,
            "version": loaded.linker.version,
            "k": k,
            "results": [
                {"id": m.id, "text": m.text, "lang": m.lang, "candidates": c}
                for m, c in zip(mentions, candidates, strict=True)
            ],
        }

    return app
