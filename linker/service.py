"""HTTP service over the same `Linker` as the CLI: POST /link, POST /annotate, GET /health, GET /indexes, /docs.

Needs the `service` extra (fastapi, uvicorn, fastapi-offline); without FastAPI, importing this module is one
ConfigError naming it. /docs is Swagger UI with its files served by the app itself (fastapi-offline ships them),
not from a CDN, so it works offline.

    app = create_app(["indexes/default"])       # indexes load here, once, before serving
    uvicorn.run(app, host="127.0.0.1", port=8000)

Every answer other than 200 has one JSON body, ``{"error": "...", "field": "..."}``, whose error
names the field (``mentions[3].text``), what was expected and what was found (field is null where
no field applies). The service never answers 5xx: bad input is 400/404/405/413/415/422, a full
queue 429, and an unexpected exception (a bug) 422 "internal error" with its traceback in the log.

Limits (`ServiceLimits`) bound what one request can cost, and each is checked before linking: the
body while it streams in (chunked or not), its JSON shape before it is parsed (`scan_json`: items per
array, fields per object, nesting depth and tokens, so a 4 MiB body of 1.4M tiny items is refused
after reading ~1,000 of them instead of becoming 1.4M Python objects and validation errors on the
event loop), the mention length as sent and after NFKC normalisation (which expands some characters
18-fold), the mentions (or /annotate texts) and characters per request, the mentions waiting per index
and the /annotate characters waiting for the tagger.

Concurrency: linking is CPU-bound and runs on one worker thread per index (`MentionBatcher`), which
links an equal share of every waiting request per call, so concurrent small requests share the work
and a large request cannot hold the others up. /annotate tags on a worker thread of its own (`Tagger`),
a slice of one request at a time, then links its adverse events through the same batcher as any
/link request. Requests await those workers without holding a thread; the event loop stays free for
/health and for reading other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import re
import reprlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from linker.extras import check as _check_extra

_check_extra(("fastapi",), extra="service", what="linker's HTTP service")  # one line, not an ImportError, without it

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.openapi.docs import get_swagger_ui_html  # noqa: E402
from fastapi.responses import HTMLResponse, JSONResponse, Response  # noqa: E402
from fastapi.routing import APIRoute  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402

import linker  # noqa: E402
from linker.errors import ConfigError, LinkerError  # noqa: E402
from linker.extras import available, install_hint  # noqa: E402
from linker.index.manifest import public_manifest  # noqa: E402
from linker.link import Linker, MeddraPath  # noqa: E402
from linker.text import normalize  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceLimits:
    """Request limits; each bounds the work (and memory) that one request can ask for."""

    # A mention is a phrase; 500 characters is ~10x the longest in the eval corpora. Checked as sent
    # and again after NFKC normalisation, which expands some characters up to 18-fold (U+FDFA).
    max_text_chars: int = 500
    max_mentions: int = 1000  # ~3 s of tf-idf linking on one core, shared fairly with other requests
    # Linking work of one request, in characters after normalisation: 1,000 mentions of 100 characters.
    max_request_chars: int = 100_000
    max_k: int = 100
    default_k: int = 5
    # Upper bound of a valid body: max_mentions * (max_text_chars * 4 UTF-8 bytes + ~100 bytes of
    # JSON and id) ~ 2.1 MB at the defaults; 4 MiB leaves room. Counted as the body streams in.
    max_body_bytes: int = 4 * 1024 * 1024
    # Mentions admitted but not yet linked, per index: beyond this a request is answered 429 at once
    # instead of queueing, which bounds the memory held by waiting requests. Default: 20 maximal requests.
    max_pending_mentions: int | None = None
    # Documents per /annotate request; their characters count against max_request_chars: 100,000 are 11-25 s
    # of tagging at the 4,000-9,000 characters/s the tagger was measured at on 2 shared cores.
    max_texts: int = 100
    # /annotate characters admitted but not yet tagged (one tagger for every index): beyond this, 429 at once.
    # Default: 2 maximal requests, one tagged and one waiting, which bounds how long an admitted request waits.
    max_pending_chars: int | None = None

    def __post_init__(self) -> None:
        if self.max_pending_mentions is None:
            object.__setattr__(self, "max_pending_mentions", 20 * self.max_mentions)
        if self.max_pending_chars is None:
            object.__setattr__(self, "max_pending_chars", 2 * self.max_request_chars)
        for name, value in asdict(self).items():
            if value < 1:
                raise ConfigError(f"service limit {name} must be >= 1, found {value}")
        if self.default_k > self.max_k:
            raise ConfigError(f"default_k {self.default_k} is above max_k {self.max_k}")
        if self.max_pending_mentions < self.max_mentions:
            raise ConfigError(f"max_pending_mentions {self.max_pending_mentions} is below max_mentions "
                              f"{self.max_mentions}: a maximal request could never be admitted")
        if self.max_pending_chars < self.max_request_chars:
            raise ConfigError(f"max_pending_chars {self.max_pending_chars} is below max_request_chars "
                              f"{self.max_request_chars}: a maximal /annotate request could never be admitted")


# ----------------------------------------------------------------------------- request / response


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


IndexName = Annotated[str | None, Field(description="Index name (GET /indexes); default: the first one loaded.")]


class _TextIn(_Strict):
    """What a span (/link) and a document (/annotate) share. A subclass redefines `text` with its own description;
    the field keeps its place, first, in the schema and in the order of validation errors."""

    text: str
    lang: str | None = Field(None, description="Restrict candidates to names in this language (ISO 639-1).")
    id: str | int | None = Field(None, description="Echoed back unchanged.")


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

    def __init__(self, field: str, expected: str, found: str, status: int = 422,
                 headers: dict[str, str] | None = None) -> None:
        self.field = field
        self.status = status
        self.headers = headers
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


# reprlib bounds depth and length: a client's value may be nested 10,000 deep or be megabytes long.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 60, 60


def _short(value: object, limit: int = 60) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _printable(text: str) -> str:
    """`text` with lone surrogates (which UTF-8 cannot encode) written as \\udXXX escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error(status: int, message: str, field: str | None, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    """The one error body of the service: {"error": "...", "field": "..." or null}."""
    body = {"error": _printable(message), "field": None if field is None else _printable(field), **extra}
    return JSONResponse(body, status_code=status, headers=headers)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(text: str) -> int | None:
    """Position of the first lone surrogate in `text` (JSON's "\\ud800" escape decodes to one), or None.
    A regex, not a Python loop: `text` may be megabytes long (lengths are checked after this)."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class BodyLimit:
    """ASGI middleware: reads each request body as it streams in, chunked or not, and answers 413
    at the first chunk past `max_bytes`; the app then gets the buffered body. A body is therefore
    never held beyond the limit, whatever Content-Length says or omits."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            text = length.decode("latin-1").strip()
            if not (text.isascii() and text.isdigit()):
                await _error(400, f"Content-Length: expected a number, found {_short(text)}",
                             "Content-Length")(scope, receive, send)
                return
            if len(text) > 18 or int(text) > self.max_bytes:
                await self._too_large(f"{text} bytes", scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(f"more (read {size} so far)", scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, found: str, scope: dict, receive: Any, send: Any) -> None:
        # The server discards the rest of the body without keeping it.
        response = _error(413, f"body: expected at most {self.max_bytes} bytes, found {found}", "body",
                          headers={"Connection": "close"})
        await response(scope, receive, send)


# ----------------------------------------------------------------------------- the JSON shape, before parsing

# A valid request nests 3 deep ({"mentions": [{"text": ...}]}) and its objects have at most 3 fields. The
# scan allows a little more, so that a near-miss (a list where a string belongs, a misspelt field) still
# reaches the schema and gets its precise message, while a body that is no request at all is refused
# after a bounded amount of work.
SCAN_MAX_DEPTH = 6
SCAN_MAX_ITEMS = 32  # per array or object other than the request's list (`mentions` of /link, `texts` of /annotate)


def scan_max_tokens(max_items: int) -> int:
    """Tokens (strings, numbers, brackets, commas, colons) in a body: a maximal valid request has ~14 an item
    (a mention or a text: its text, lang and id)."""
    return 16 * max_items + 256


# One JSON token of a UTF-8 body, after the white space before it (group 1): a whole string, escapes included
# (matched in C whatever its length, so brackets and commas inside strings are not structure); a structural
# character; a run of anything else (a number, true/false/null, garbage for the parser to refuse); a '"' alone,
# which opens a string that never closes (the parser refuses the body there, so the scan stops); or nothing, at
# the end. Possessive quantifiers never backtrack: 4 MiB of spaces or of escapes take ~10-35 ms.
_TOKEN = re.compile(rb'\s*+("[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{},:]|[^\s\[\]{},:"]++|"|)', re.DOTALL)
_LBRACE, _LBRACKET, _RBRACE, _RBRACKET, _COMMA, _QUOTE = b'{[}],"'  # bytes unpack to ints


class _Frame:
    """An open array or object of the scan: its field name, items so far (commas) and limit."""

    __slots__ = ("is_object", "path", "commas", "cap", "key", "expect_key")

    def __init__(self, is_object: bool, path: str, cap: int) -> None:
        self.is_object, self.path, self.cap = is_object, path, cap
        self.commas = 0
        self.key = ""
        self.expect_key = is_object

    def child(self) -> str:
        """The field name of the value now being read in this container, e.g. mentions[3] or mentions[3].id."""
        if self.is_object:
            return f"{self.path}.{self.key}" if self.path else self.key
        return f"{self.path}[{self.commas}]"


def _key(raw: bytes) -> str:
    """An object key for error messages and for finding `mentions` (JSON-decoded when short)."""
    if len(raw) > 64:
        return _short(raw[:64].decode("utf-8", "replace"))
    try:
        return json.loads(raw) if b"\\" in raw else raw[1:-1].decode("utf-8")
    except ValueError:  # invalid escapes or UTF-8: the parser will refuse the body
        return _short(raw.decode("utf-8", "replace"))


def scan_json(body: bytes, max_items: int, items: str = "mentions") -> None:
    """Refuse a request body whose JSON shape no request can have, before it is parsed (RequestFieldError).

    Parsing first would build every item of a 4 MiB body of 1.4 million `1`s or `{}`s as a Python object
    and pydantic would then make 1.4 million errors: 10-30 s of CPU on the event loop and gigabytes.
    This scan reads tokens with one regex (strings whole, in C) and stops at the first limit passed: more
    than `max_items` in the request's list `items` (413), more than SCAN_MAX_ITEMS in any other array or object,
    nesting deeper than SCAN_MAX_DEPTH, or a top-level array (422); more than scan_max_tokens (413). Its
    work is therefore bounded by those limits, not by the body's size. It checks only what it counts:
    invalid JSON passes here and is refused by the parser, which then reads a body of bounded shape.
    """
    encoding = json.detect_encoding(body)
    if not encoding.startswith("utf-8"):  # a byte scan of UTF-16/32 cannot tell structure from text
        raise RequestFieldError("body", "JSON in UTF-8", f"{encoding.upper()} (judged by its first bytes)", 400)
    max_tokens = scan_max_tokens(max_items)
    stack: list[_Frame] = []
    for count, token in enumerate(_TOKEN.finditer(body), 1):
        start, end = token.span(1)
        if start == end:  # the end of the body
            return
        if count > max_tokens:
            raise RequestFieldError("body", f"at most {max_tokens} JSON tokens for {max_items} {items}",
                                    "more", 413)
        char = body[start]
        top = stack[-1] if stack else None
        if char == _LBRACE or char == _LBRACKET:
            if top is None:
                if char == _LBRACKET:
                    raise RequestFieldError("body", f'a JSON object such as {{"{items}": [{{"text": "hair loss"}}]}}',
                                            "an array")
                stack.append(_Frame(True, "", SCAN_MAX_ITEMS))
                continue
            path = top.child()
            if len(stack) >= SCAN_MAX_DEPTH:
                raise RequestFieldError(path, f"JSON nested at most {SCAN_MAX_DEPTH} levels deep",
                                        f"level {len(stack) + 1}")
            listed = char == _LBRACKET and path == items
            stack.append(_Frame(char == _LBRACE, path, max_items if listed else SCAN_MAX_ITEMS))
        elif char == _RBRACE or char == _RBRACKET:
            if stack:  # a mismatched bracket is the parser's to refuse
                stack.pop()
        elif char == _COMMA:
            if top is not None:
                top.commas += 1
                top.expect_key = top.is_object
                if top.commas >= top.cap:  # commas + 1 items: more than the cap
                    if top.path == items and not top.is_object:
                        raise RequestFieldError(items, f"at most {max_items} {items}", f"more than {max_items}", 413)
                    what = "an object of at most {} fields" if top.is_object else "an array of at most {} items"
                    raise RequestFieldError(top.path or "body", what.format(top.cap), f"more than {top.cap}")
        elif char == _QUOTE:
            if end - start == 1:  # a string that never closes
                return
            if top is not None and top.expect_key:
                top.key = _key(token.group(1))
                top.expect_key = False


class ScannedJSONRoute(APIRoute):
    """A route whose request body, when it has one, passes `scan_json` before FastAPI parses and validates it.
    Set as the app's route class, so every endpoint that takes a body gets the scan."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def scanned(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            # every application/* type: a superset of what FastAPI parses as JSON (no type, application/json,
            # application/*+json); other types reach the schema as bytes and get a 415
            if content_type is None or content_type.strip().lower().startswith("application/"):
                limits = request.app.state.limits
                if self.path == "/annotate":
                    scan_json(await request.body(), limits.max_texts, "texts")
                else:
                    scan_json(await request.body(), limits.max_mentions)
            return await handler(request)  # FastAPI reads the body cached by request.body()

        return scanned


# ----------------------------------------------------------------------------- fair batching


@dataclass(eq=False)
class _Job:
    """One request's mentions; the worker links them a share at a time, interleaved with others."""

    texts: list[str]
    langs: list[str | None]
    k: int
    on_done: Callable[[_Job], None]
    results: list = field(default_factory=list)
    next: int = 0  # first mention not yet handed to the linker
    error: BaseException | None = None
    finished: bool = False


class BusyError(Exception):
    """A queue is full: an index's mentions waiting (`max_pending_mentions`) or the tagger's characters
    (`max_pending_chars`)."""


async def _completion(submit: Callable[[Callable[[Any], None]], object]) -> Any:
    """The job that `submit(on_done)` queues on a worker thread, once the worker calls `on_done(job)`; awaited
    without holding a thread (the threadpool stays free for the others). Raises job.error if it failed."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def resolve(job: Any) -> None:
        if not future.done():
            if job.error is not None:
                future.set_exception(job.error)
            else:
                future.set_result(job)

    def done(job: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
            loop.call_soon_threadsafe(resolve, job)

    submit(done)
    return await future


class MentionBatcher:
    """Links the mentions of concurrent requests together, fairly, on one worker thread per index.

    Each round the worker takes an equal share of one call's worth of mentions from every waiting
    request (at least one each, oldest first, the rest next round) and links them in one call per
    (k, lang). A call is sized to take about `CALL_SECONDS`, from the measured cost per mention
    (it differs by index kind, text length and the machine's load): a sparse product or an encoder
    pass over dozens of queries costs little more than over one, so small concurrent requests share
    work, and a request of 1,000 long mentions is cut into slices, so a one-mention request that
    arrives behind it waits for about two calls, not for all of it. That worker is the only thread
    that touches its `Linker`, which keeps the Linker's lazy caches safe.
    """

    CALL_SECONDS = 0.2  # per Linker.link call: ~10% of it is per-call overhead at tf-idf's ~3 ms a mention
    # At most 256 mentions a call; at least 16, which keeps the per-call overhead (~8 mentions' worth for tf-idf)
    # at most about a third of a call even when the machine is so loaded that 16 take longer than CALL_SECONDS.
    MIN_BATCH, MAX_BATCH = 16, 256

    def __init__(self, linker: Linker, name: str, max_pending: int = 20_000) -> None:
        self.linker = linker
        self.max_pending = max_pending
        self._pending = 0  # mentions admitted and not yet finished
        self._seconds_per_mention = 0.003  # running estimate, updated after every call
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"linker-batcher-{name}", daemon=True).start()

    def batch_size(self) -> int:
        """Mentions in the next call: as many as take about CALL_SECONDS at the measured cost."""
        return max(self.MIN_BATCH, min(self.MAX_BATCH, int(self.CALL_SECONDS / max(self._seconds_per_mention, 1e-6))))

    def submit(self, texts: list[str], langs: list[str | None], k: int, on_done: Callable[[_Job], None]) -> _Job:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        with self._lock:
            if self._pending + len(texts) > self.max_pending:
                raise BusyError(f"{self._pending} mentions are waiting")
            self._pending += len(texts)
        job = _Job(texts, langs, k, on_done, [None] * len(texts))
        self._queue.put(job)
        return job

    async def link(self, texts: list[str], langs: list[str | None], k: int) -> list:
        """The LinkResults of `texts`, awaited without holding a thread."""
        job = await _completion(lambda done: self.submit(texts, langs, k, done))
        return job.results

    def _run(self) -> None:
        active: deque[_Job] = deque()
        while True:
            if not active:
                active.append(self._queue.get())
            while True:
                try:
                    active.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch = self.batch_size()
            share = max(1, batch // len(active))
            round_: list[tuple[_Job, int, int]] = []
            size = 0
            for _ in range(len(active)):
                if size >= batch:
                    break
                job = active.popleft()
                stop = min(job.next + share, len(job.texts), job.next + batch - size)
                round_.append((job, job.next, stop))
                size += stop - job.next
                job.next = stop
                if stop < len(job.texts):
                    active.append(job)  # back of the line: the others get their share first
            self._link_round(round_)
            for job, _start, _stop in round_:
                if not job.finished and (job.error is not None or job.next == len(job.texts)):
                    self._finish(job)
            if any(job.finished for job in active):
                active = deque(job for job in active if not job.finished)

    def _link_round(self, round_: list[tuple[_Job, int, int]]) -> None:
        groups: dict[tuple[int, str | None], list[tuple[_Job, int]]] = {}
        for job, start, stop in round_:
            for i in range(start, stop):
                groups.setdefault((job.k, job.langs[i]), []).append((job, i))
        for (k, lang), items in groups.items():
            self._link_items(items, k, lang)

    def _link_items(self, items: list[tuple[_Job, int]], k: int, lang: str | None) -> None:
        started = time.perf_counter()
        try:
            results = self.linker.link([job.texts[i] for job, i in items], k=k, lang=lang)
            # a moving average: follows a change of load within a few calls, ignores one slow call
            cost = (time.perf_counter() - started) / len(items)
            self._seconds_per_mention = 0.7 * self._seconds_per_mention + 0.3 * cost
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
            jobs = list(dict.fromkeys(job for job, _ in items))
            if len(jobs) > 1:  # one request's input must not fail the others: retry each alone
                for job in jobs:
                    self._link_items([(j, i) for j, i in items if j is job], k, lang)
            else:
                jobs[0].error = exc
            return
        for (job, i), result in zip(items, results, strict=True):
            job.results[i] = result

    def _finish(self, job: _Job) -> None:
        job.finished = True
        with self._lock:
            self._pending -= len(job.texts)
        try:
            job.on_done(job)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the worker
            log.exception("linker batcher: a request's completion callback failed")


@dataclass(eq=False)
class _TagJob:
    """One /annotate request's texts; the tagger's worker tags them a slice at a time, interleaved with others."""

    texts: list[str]
    threshold: float | None
    style: str
    on_done: Callable[[_TagJob], None]
    results: list = field(default_factory=list)  # the spans of each text tagged so far
    model: str = ""  # the tagger's revision
    next: int = 0  # first text not yet tagged
    error: BaseException | None = None


def _load_tagger() -> Any:
    from linker.extract import load_extractor  # torch: imported on the first /annotate, not at start-up

    return load_extractor()


class Tagger:
    """Runs the /annotate tagger (linker-ae) on one worker thread of its own, behind a queue bounded in characters.

    Its own thread, not the shared threadpool: the tagger is one torch model behind a lock, so from the threadpool
    40 waiting /annotate requests held all 40 threads and /link waited for one (48 texts of 8,000 characters at
    once: /link up to 7.5 s, the last /annotate 43.6 s, no 429). Here a waiting request is a queued job that holds
    no thread, and one that would take the characters waiting past `max_pending` is refused at once (BusyError).
    Each turn tags the next slice of one request (its next texts up to SLICE_CHARS, at least one) and sends it to
    the back of the line, so a short document is not held behind a long one. The tagger loads on the worker at
    the first request: a service never asked to annotate never imports torch.
    """

    SLICE_CHARS = 2_000  # ~0.2-0.5 s of tagging on 2 shared cores; a text is never cut (the tagger windows it)

    def __init__(self, max_pending: int, load: Callable[[], Any] = _load_tagger) -> None:
        self.max_pending = max_pending
        self._load = load
        self._pending = 0  # characters admitted and not yet finished
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_TagJob] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="linker-tagger", daemon=True).start()

    def submit(self, texts: list[str], threshold: float | None, style: str,
               on_done: Callable[[_TagJob], None]) -> _TagJob:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        chars = sum(map(len, texts))
        with self._lock:
            if self._pending + chars > self.max_pending:
                raise BusyError(f"{self._pending} characters are waiting")
            self._pending += chars
        job = _TagJob(texts, threshold, style, on_done)
        self._queue.put(job)
        return job

    async def extract(self, texts: list[str], *, threshold: float | None, style: str) -> _TagJob:
        """The tagged job (spans of each text in job.results, the tagger's revision in job.model), awaited without
        holding a thread."""
        return await _completion(lambda done: self.submit(texts, threshold, style, done))

    def _run(self) -> None:
        active: deque[_TagJob] = deque()
        while True:
            if not active:
                active.append(self._queue.get())
            job = active.popleft()
            try:
                self._tag_slice(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
                job.error = exc
            while True:  # requests that came during this slice go before its next one
                try:
                    active.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if job.error is None and job.next < len(job.texts):
                active.append(job)  # back of the line: the others get their slice first
            else:
                self._finish(job)

    def _tag_slice(self, job: _TagJob) -> None:
        extractor = self._load()
        stop, size = job.next + 1, len(job.texts[job.next])
        while stop < len(job.texts) and size + len(job.texts[stop]) <= self.SLICE_CHARS:
            size += len(job.texts[stop])
            stop += 1
        job.results += extractor.extract(job.texts[job.next:stop], threshold=job.threshold, style=job.style)
        job.model, job.next = extractor.revision, stop

    def _finish(self, job: _TagJob) -> None:
        with self._lock:
            self._pending -= sum(map(len, job.texts))
        try:
            job.on_done(job)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the worker
            log.exception("linker tagger: a request's completion callback failed")


@dataclass
class _Loaded:
    name: str
    linker: Linker
    batcher: MentionBatcher
    languages: frozenset[str]


def load_indexes(index_dirs: Sequence[str | Path], max_pending: int = 20_000,
                 linker_options: dict | None = None) -> dict[str, _Loaded]:
    """Load each index folder once; its name is the folder name (which must be unique).

    `linker_options`: keyword arguments of `Linker.load` (rerank, rerank_k, min_confidence) for every index.
    """
    if not index_dirs:
        raise ConfigError("no index given; pass --index DIR (one or more)")
    loaded: dict[str, _Loaded] = {}
    for folder in index_dirs:
        name = Path(folder).resolve().name
        if name in loaded:
            raise ConfigError(f"two indexes named {name!r}; index folders must have distinct names")
        lk = Linker.load(folder, **(linker_options or {}))
        loaded[name] = _Loaded(name, lk, MentionBatcher(lk, name, max_pending), frozenset(lk.languages))
        log.info("loaded index %s (%s)", name, lk.version)
    return loaded


def _check_request(request: LinkRequest, indexes: dict[str, _Loaded], default: str, limits: ServiceLimits
                   ) -> tuple[_Loaded, int]:
    """The index and k of a request, after every check that linking needs (RequestFieldError if one fails)."""
    if request.index is not None and (at := _surrogate(request.index)) is not None:
        raise RequestFieldError("index", "Unicode text", f"a lone surrogate at character {at}")
    name = request.index or default
    if name not in indexes:
        raise RequestFieldError("index", f"one of {', '.join(indexes)}", _short(name))
    loaded = indexes[name]
    k = limits.default_k if request.k is None else request.k
    if not 1 <= k <= limits.max_k:
        raise RequestFieldError("k", f"an integer from 1 to {limits.max_k}", _short(k))
    mentions = request.mentions
    if not mentions:
        raise RequestFieldError("mentions", "at least one mention", "an empty list")
    if len(mentions) > limits.max_mentions:
        raise RequestFieldError("mentions", f"at most {limits.max_mentions} mentions", f"{len(mentions)}", 413)
    work = 0
    for i, m in enumerate(mentions):
        for name_, value in (("text", m.text), ("id", m.id), ("lang", m.lang)):
            if isinstance(value, str) and (at := _surrogate(value)) is not None:
                raise RequestFieldError(f"mentions[{i}].{name_}", "Unicode text",
                                        f"a lone surrogate at character {at}")
        if len(m.text) > limits.max_text_chars:
            raise RequestFieldError(
                f"mentions[{i}].text", f"at most {limits.max_text_chars} characters", f"{len(m.text)}"
            )
        normalized = len(normalize(m.text))
        if normalized > limits.max_text_chars:
            raise RequestFieldError(
                f"mentions[{i}].text", f"at most {limits.max_text_chars} characters after NFKC normalisation",
                f"{normalized} (from {len(m.text)})",
            )
        if not normalized:
            raise RequestFieldError(f"mentions[{i}].text", "a non-empty text", _short(m.text))
        work += normalized
        if work > limits.max_request_chars:
            raise RequestFieldError(
                "mentions", f"at most {limits.max_request_chars} characters in all after normalisation",
                f"more ({work} up to mentions[{i}])", 413,
            )
        if m.lang is not None and m.lang not in loaded.languages:
            raise RequestFieldError(
                f"mentions[{i}].lang", f"a language of index {name} ({', '.join(sorted(loaded.languages))})",
                _short(m.lang),
            )
    return loaded, k


# ----------------------------------------------------------------------------- POST /annotate

class TextIn(_TextIn):
    """One document to annotate."""

    text: str = Field(description="The document text, e.g. a case report or a drug-label section.")


class AnnotateRequest(_Strict):
    texts: list[TextIn]
    k: int | None = Field(None, description="Candidates kept per adverse event (default 1); the code is the best.")
    index: IndexName = None
    threshold: float | None = Field(None, description="In-span probability a word piece needs (default: the tagger's).")
    review_below: float | None = Field(None, description="Decision 'review' below this span or link confidence (default 0.5).")
    style: str | None = Field(None, description="AdverseEvent spans as 'terms' (TAC 2017's convention), 'phrases' "
                                                "(PHEE's) or 'auto' (default: terms, and phrases where no term was found).")


class SpanOut(BaseModel):
    start: int
    end: int
    text: str
    label: str = Field(description="AdverseEvent, Drug or TherapeuticEffect.")
    status: str = Field(description="positive, negated or hypothetical.")
    confidence: float = Field(description="The tagger's: mean in-span probability of the span's word pieces.")
    code: str | None = None
    name: str | None = None
    link_confidence: float | None = None
    decision: str | None = Field(None, description="coded, review, no link, not coded (negated or hypothetical); "
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


def _check_annotate(request: AnnotateRequest, indexes: dict, default: str, limits: ServiceLimits) -> tuple:
    """The index, k, threshold and review_below of an /annotate request (RequestFieldError if a check fails)."""
    if request.index is not None and (at := _surrogate(request.index)) is not None:
        raise RequestFieldError("index", "Unicode text", f"a lone surrogate at character {at}")
    name = request.index or default
    if name not in indexes:
        raise RequestFieldError("index", f"one of {', '.join(indexes)}", _short(name))
    loaded = indexes[name]
    k = 1 if request.k is None else request.k
    if not 1 <= k <= limits.max_k:
        raise RequestFieldError("k", f"an integer from 1 to {limits.max_k}", _short(k))
    threshold = request.threshold
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise RequestFieldError("threshold", "a probability between 0 and 1", _short(threshold))
    review_below = 0.5 if request.review_below is None else request.review_below
    if not 0.0 <= review_below <= 1.0:
        raise RequestFieldError("review_below", "a probability from 0 to 1", _short(review_below))
    if request.style is not None and request.style not in ("auto", "terms", "phrases"):
        raise RequestFieldError("style", "auto, terms or phrases", _short(request.style))
    if not request.texts:
        raise RequestFieldError("texts", "at least one text", "an empty list")
    if len(request.texts) > limits.max_texts:
        raise RequestFieldError("texts", f"at most {limits.max_texts} texts", f"{len(request.texts)}", 413)
    work = 0
    for i, t in enumerate(request.texts):
        for name_, value in (("text", t.text), ("id", t.id), ("lang", t.lang)):
            if isinstance(value, str) and (at := _surrogate(value)) is not None:
                raise RequestFieldError(f"texts[{i}].{name_}", "Unicode text", f"a lone surrogate at character {at}")
        if not t.text.strip():
            raise RequestFieldError(f"texts[{i}].text", "a non-empty text", _short(t.text))
        work += len(t.text)
        if work > limits.max_request_chars:
            raise RequestFieldError("texts", f"at most {limits.max_request_chars} characters in all",
                                    f"more ({work} up to texts[{i}])", 413)
        if t.lang is not None and t.lang not in loaded.languages:
            raise RequestFieldError(f"texts[{i}].lang",
                                    f"a language of index {name} ({', '.join(sorted(loaded.languages))})",
                                    _short(t.lang))
    return loaded, k, threshold, review_below


def _busy(field_: str, queue_: str, exc: BusyError) -> RequestFieldError:
    """The 429 of a full queue; a client may retry after a second."""
    return RequestFieldError(field_, f"room in {queue_} (retry shortly)", str(exc), 429, headers={"Retry-After": "1"})


def _render_annotation(loaded: _Loaded, k: int, request: AnnotateRequest, tagged: _TagJob, wanted: list,
                       results: list, review_below: float) -> bytes:
    """The AnnotateResponse as JSON bytes: each span with its code and decision."""
    from linker.extract import decide

    rows = decide(tagged.results, dict(zip(wanted, results, strict=True)), review_below=review_below)
    out = []
    for t, doc_rows in zip(request.texts, rows, strict=True):
        item: dict[str, Any] = {"id": t.id} if t.id is not None else {}
        item["spans"] = [{key: value for key, value in row.items() if not key.startswith("_")} for row in doc_rows]
        out.append(item)
    body = {"index": loaded.name, "version": loaded.linker.version, "model": tagged.model, "k": k, "results": out}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _render(loaded: _Loaded, k: int, mentions: list[MentionIn], results: list) -> bytes:
    """The LinkResponse as JSON bytes (built directly: 1,000 x k=100 candidates is too many to validate)."""
    out = []
    for m, result in zip(mentions, results, strict=True):
        item: dict[str, Any] = {"id": m.id} if m.id is not None else {}
        item["text"] = m.text
        if m.lang is not None:
            item["lang"] = m.lang
        item["candidates"] = [c.to_dict() for c in result.candidates]
        item["nil"] = result.nil
        out.append(item)
    body = {"index": loaded.name, "version": loaded.linker.version, "k": k, "results": out}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# Swagger UI's files, served by the service itself (FastAPI's default /docs loads them from a CDN: a blank page
# offline). They come from the fastapi-offline package (the `service` extra), which ships them; only its files are used.
DOCS_FILES_URL = "/docs-files"


def swagger_files() -> Path | None:
    """The folder of swagger-ui-bundle.js, swagger-ui.css and favicon.png, or None when fastapi-offline is absent."""
    import importlib.util

    if not available("fastapi_offline"):
        return None
    folder = Path(importlib.util.find_spec("fastapi_offline").origin).parent / "static"
    needed = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")
    return folder if all((folder / name).is_file() for name in needed) else None


def _add_docs(app: FastAPI) -> None:
    """GET /docs: Swagger UI from local files; without them, a page saying what to install (the schema is at
    /openapi.json either way)."""
    folder = swagger_files()
    if folder is not None:
        app.mount(DOCS_FILES_URL, StaticFiles(directory=folder), name="docs-files")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        if folder is None:
            return HTMLResponse(
                "<!DOCTYPE html><html><head><title>linker - API docs</title></head><body>"
                "<p>Swagger UI's files are not installed here: <code>" + install_hint("service") + "</code>. "
                f'The OpenAPI schema is at <a href="{root}{app.openapi_url}">{root}{app.openapi_url}</a>.</p>'
                "</body></html>")
        files = f"{root}{DOCS_FILES_URL}"
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title="linker - API docs",
                                   swagger_js_url=f"{files}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{files}/swagger-ui.css",
                                   swagger_favicon_url=f"{files}/favicon.png")


def create_app(index_dirs: Sequence[str | Path], limits: ServiceLimits = ServiceLimits(), *,
               linker_options: dict | None = None) -> FastAPI:
    """The FastAPI app with `index_dirs` loaded (LinkerError here, before serving, if one is bad)."""
    indexes = load_indexes(index_dirs, limits.max_pending_mentions, linker_options)
    default = next(iter(indexes))
    app = FastAPI(
        title="linker",
        version=linker.__version__,
        description="Multilingual medical entity linking: spans in, ranked concepts out.",
        docs_url=None,  # _add_docs: the same page, its files served from here instead of a CDN
        redoc_url=None,
    )
    _add_docs(app)
    app.state.indexes = indexes
    app.state.limits = limits
    app.state.tagger = tagger = Tagger(limits.max_pending_chars)  # /annotate's, shared by every index
    app.state.internal_errors = 0  # requests answered by the catch-all below; tests assert it stays 0
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.router.route_class = ScannedJSONRoute  # every route below that takes a body is scanned before parsing

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type")
        if content_type is not None and not _is_json(content_type):
            return _error(415, f"Content-Type: expected application/json, found {_short(content_type)}",
                          "Content-Type")
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request", "type": "invalid"}
        if first.get("type") == "json_invalid":
            return _error(400, f"body: expected JSON, found invalid JSON ({first.get('msg')})", "body")
        details = [
            {"field": _printable(_field_name(e.get("loc", ()))), "message": _printable(str(e.get("msg"))),
             "type": str(e.get("type"))}
            for e in errors[:20]
        ]
        field_ = details[0]["field"]
        message = f"{field_}: {details[0]['message']}"
        if first.get("type") != "missing":
            message += f", found {_short(first.get('input', None))}"
        return _error(422, message, field_, errors=details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing (404, 405) and FastAPI's body parser (400) raise these; they get the same body shape.
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            routes = "POST /link, POST /annotate, GET /health, GET /indexes, GET /docs"
            return _error(404, f"path: expected one of {routes}, found {_short(where)}", "path")
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return _error(405, f"method: expected {allowed} for {request.url.path}, found {request.method}",
                          "method", headers=exc.headers)
        cause = exc.__cause__
        if exc.status_code == 400 and cause is not None:  # json.loads failed other than by syntax
            reason = str(cause).split(";")[0][:120]  # drop Python's advice on sys.set_int_max_str_digits
            return _error(400, f"body: expected JSON that can be parsed, found {type(cause).__name__}: {reason}",
                          "body")
        return _error(exc.status_code, f"{where}: {exc.detail}", None, headers=exc.headers)

    @app.exception_handler(RequestFieldError)
    async def field_error(_request: Request, exc: RequestFieldError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.field, headers=exc.headers)

    @app.exception_handler(LinkerError)
    async def linker_error(_request: Request, exc: LinkerError) -> JSONResponse:
        return _error(422, str(exc), getattr(exc, "where", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input. The contract is "never 5xx": the client gets the usual error body
        # (422: the same request will fail the same way) and the traceback goes to the server log.
        app.state.internal_errors += 1
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(422, "internal error: the service failed on this request; the traceback is in the "
                           "server log (please report it)", None)

    # /health and /indexes are async: they run on the event loop, so they answer at once even
    # while every threadpool worker is busy waiting for its index's batcher.
    @app.get("/health")
    async def health() -> dict:
        """Liveness: the service is up and its indexes are loaded."""
        return {"status": "ok", "version": linker.__version__, "indexes": list(indexes)}

    @app.get("/indexes")
    async def list_indexes() -> dict:
        """The loaded indexes by name with their versions, languages and build manifests (without server paths)."""
        return {
            "default": default,
            "indexes": [
                {"name": i.name, "version": i.linker.version, "languages": sorted(i.languages),
                 "manifest": public_manifest(i.linker.manifest)}
                for i in indexes.values()
            ],
        }

    @app.post(
        "/link",
        response_model=LinkResponse,
        response_model_exclude_none=True,
        responses={status: {"model": ErrorOut} for status in (400, 404, 405, 413, 415, 422, 429)},
    )
    async def link(request: LinkRequest) -> Response:
        """Link mentions to ranked concepts (score desc, concept_id) with the matched dictionary name."""
        loaded, k = _check_request(request, indexes, default, limits)
        mentions = request.mentions
        try:
            results = await loaded.batcher.link([m.text for m in mentions], [m.lang for m in mentions], k)
        except BusyError as exc:
            raise _busy("mentions", f"the queue of index {loaded.name}", exc) from None
        body = await run_in_threadpool(_render, loaded, k, mentions, results)
        return Response(body, media_type="application/json")

    @app.post(
        "/annotate",
        response_model=AnnotateResponse,
        response_model_exclude_none=True,
        responses={status: {"model": ErrorOut} for status in (400, 404, 405, 413, 415, 422, 429)},
    )
    async def annotate(request: AnnotateRequest) -> Response:
        """Extract adverse events, drugs and effects from texts (linker-ae) and code each positive adverse event with
        the index: code, confidence, and the decision (coded, review, no link, not coded)."""
        from linker.extract import events_to_link, link_text

        loaded, k, threshold, review_below = _check_annotate(request, indexes, default, limits)
        try:
            tagged = await tagger.extract([t.text for t in request.texts], threshold=threshold,
                                          style=request.style or "auto")
        except BusyError as exc:
            raise _busy("texts", "the tagger's queue", exc) from None
        spans = tagged.results
        wanted = events_to_link(spans)
        try:  # the index's batcher, where this request gets the same share as any /link request
            results = await loaded.batcher.link([link_text(spans[t][i]) for t, i in wanted],
                                                [request.texts[t].lang for t, _ in wanted], k) if wanted else []
        except BusyError as exc:
            raise _busy("texts", f"the queue of index {loaded.name}", exc) from None
        body = await run_in_threadpool(_render_annotation, loaded, k, request, tagged, wanted, results, review_below)
        return Response(body, media_type="application/json")

    return app
