"""What one request may cost, checked before the work it bounds: `ServiceLimits`, the body read as it streams in
(`BodyLimit`), the JSON shape before parsing (`scan_json`), the fields after validation (`check_link`,
`check_annotate`), and the one error body every refusal gets."""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from linker.errors import ConfigError
from linker.text import normalize

if TYPE_CHECKING:
    from linker.service.batcher import BusyError, LoadedIndex
    from linker.service.schemas import AnnotateRequest, LinkRequest


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


# ----------------------------------------------------------------------------- the one error body


class RequestFieldError(Exception):
    """A request field that failed a check the schema cannot express (limits, index names)."""

    def __init__(self, field: str, expected: str, found: str, status: int = 422,
                 headers: dict[str, str] | None = None) -> None:
        self.field = field
        self.status = status
        self.headers = headers
        super().__init__(f"{field}: expected {expected}, found {found}")


def busy(field_: str, queue_: str, exc: BusyError) -> RequestFieldError:
    """The 429 of a full queue; a client may retry after a second."""
    return RequestFieldError(field_, f"room in {queue_} (retry shortly)", str(exc), 429, headers={"Retry-After": "1"})


# pydantic appends the tried member of a union (`id: str | int`) to an error's location;
# no request field has these names, so they are dropped to name the field itself.
_UNION_TAGS = frozenset({"str", "int"})


def field_name(loc: Sequence[Any]) -> str:
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


def short(value: object, limit: int = 60) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str) -> str:
    """`text` with lone surrogates (which UTF-8 cannot encode) written as \\udXXX escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, message: str, field: str | None, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    """The one error body of the service: {"error": "...", "field": "..." or null}."""
    body = {"error": printable(message), "field": None if field is None else printable(field), **extra}
    return JSONResponse(body, status_code=status, headers=headers)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(text: str) -> int | None:
    """Position of the first lone surrogate in `text` (JSON's "\\ud800" escape decodes to one), or None.
    A regex, not a Python loop: `text` may be megabytes long (lengths are checked after this)."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# ----------------------------------------------------------------------------- the body, as it streams in


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
                await error_response(400, f"Content-Length: expected a number, found {short(text)}",
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
        response = error_response(413, f"body: expected at most {self.max_bytes} bytes, found {found}", "body",
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

    __slots__ = ("is_object", "path", "commas", "cap", "key", "expect_key", "root")

    def __init__(self, is_object: bool, path: str, cap: int, root: bool = False) -> None:
        self.is_object, self.path, self.cap, self.root = is_object, path, cap, root
        self.commas = 0
        self.key = ""
        self.expect_key = is_object

    def child(self) -> str:
        """The field name of the value now being read in this container, e.g. mentions[3] or mentions[3].id; only
        the body's own fields have no dot (an object under the key "" is not the body: its "mentions" is ".mentions")."""
        if self.is_object:
            return self.key if self.root else f"{self.path}.{self.key}"
        return f"{self.path}[{self.commas}]"


def _key(raw: bytes) -> str:
    """An object key for error messages and for finding `mentions` (JSON-decoded when short)."""
    if len(raw) > 64:
        return short(raw[:64].decode("utf-8", "replace"))
    try:
        return json.loads(raw) if b"\\" in raw else raw[1:-1].decode("utf-8")
    except ValueError:  # invalid escapes or UTF-8: the parser will refuse the body
        return short(raw.decode("utf-8", "replace"))


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
            _open(stack, top, char, max_items, items)
        elif char == _RBRACE or char == _RBRACKET:
            if stack:  # a mismatched bracket is the parser's to refuse
                stack.pop()
        elif char == _COMMA:
            if top is not None:
                _comma(top, max_items, items)
        elif char == _QUOTE:
            if end - start == 1:  # a string that never closes
                return
            if top is not None and top.expect_key:
                top.key = _key(token.group(1))
                top.expect_key = False


def _open(stack: list[_Frame], top: _Frame | None, char: int, max_items: int, items: str) -> None:
    """A '{' or '[' of the scan: the body itself (an object), or a container nested in `top`."""
    if top is None:
        if char == _LBRACKET:
            raise RequestFieldError("body", f'a JSON object such as {{"{items}": [{{"text": "hair loss"}}]}}',
                                    "an array")
        stack.append(_Frame(True, "", SCAN_MAX_ITEMS, root=True))
        return
    path = top.child()
    if len(stack) >= SCAN_MAX_DEPTH:
        raise RequestFieldError(path, f"JSON nested at most {SCAN_MAX_DEPTH} levels deep", f"level {len(stack) + 1}")
    listed = char == _LBRACKET and path == items
    stack.append(_Frame(char == _LBRACE, path, max_items if listed else SCAN_MAX_ITEMS))


def _comma(top: _Frame, max_items: int, items: str) -> None:
    """A ',' of the scan: one more item in `top`, refused past its cap."""
    top.commas += 1
    top.expect_key = top.is_object
    if top.commas >= top.cap:  # commas + 1 items: more than the cap
        if top.path == items and not top.is_object:
            raise RequestFieldError(items, f"at most {max_items} {items}", f"more than {max_items}", 413)
        what = "an object of at most {} fields" if top.is_object else "an array of at most {} items"
        raise RequestFieldError(top.path or "body", what.format(top.cap), f"more than {top.cap}")


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


# ----------------------------------------------------------------------------- the fields, after validation


def _index_and_k(request: LinkRequest | AnnotateRequest, indexes: dict[str, LoadedIndex], default: str,
                 limits: ServiceLimits, default_k: int) -> tuple[LoadedIndex, int]:
    """The index a request names (or the default) and its k, checked."""
    if request.index is not None and (at := _surrogate(request.index)) is not None:
        raise RequestFieldError("index", "Unicode text", f"a lone surrogate at character {at}")
    name = request.index or default
    if name not in indexes:
        raise RequestFieldError("index", f"one of {', '.join(indexes)}", short(name))
    k = default_k if request.k is None else request.k
    if not 1 <= k <= limits.max_k:
        raise RequestFieldError("k", f"an integer from 1 to {limits.max_k}", short(k))
    return indexes[name], k


def _check_item(field_: str, i: int, item: Any) -> None:
    """An item's strings (text, id, lang) are Unicode text: no lone surrogate."""
    for name, value in (("text", item.text), ("id", item.id), ("lang", item.lang)):
        if isinstance(value, str) and (at := _surrogate(value)) is not None:
            raise RequestFieldError(f"{field_}[{i}].{name}", "Unicode text", f"a lone surrogate at character {at}")


def _check_lang(field_: str, i: int, lang: str | None, loaded: LoadedIndex) -> None:
    """A language the index has names in, or none."""
    if lang is not None and lang not in loaded.languages:
        raise RequestFieldError(f"{field_}[{i}].lang",
                                f"a language of index {loaded.name} ({', '.join(sorted(loaded.languages))})",
                                short(lang))


def check_link(request: LinkRequest, indexes: dict[str, LoadedIndex], default: str, limits: ServiceLimits
               ) -> tuple[LoadedIndex, int]:
    """The index and k of a request, after every check that linking needs (RequestFieldError if one fails)."""
    loaded, k = _index_and_k(request, indexes, default, limits, limits.default_k)
    mentions = request.mentions
    if not mentions:
        raise RequestFieldError("mentions", "at least one mention", "an empty list")
    if len(mentions) > limits.max_mentions:
        raise RequestFieldError("mentions", f"at most {limits.max_mentions} mentions", f"{len(mentions)}", 413)
    work = 0
    for i, m in enumerate(mentions):
        _check_item("mentions", i, m)
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
            raise RequestFieldError(f"mentions[{i}].text", "a non-empty text", short(m.text))
        work += normalized
        if work > limits.max_request_chars:
            raise RequestFieldError(
                "mentions", f"at most {limits.max_request_chars} characters in all after normalisation",
                f"more ({work} up to mentions[{i}])", 413,
            )
        _check_lang("mentions", i, m.lang, loaded)
    return loaded, k


def check_annotate(request: AnnotateRequest, indexes: dict[str, LoadedIndex], default: str, limits: ServiceLimits
                   ) -> tuple[LoadedIndex, int, float | None, float]:
    """The index, k, threshold and review_below of an /annotate request (RequestFieldError if a check fails)."""
    loaded, k = _index_and_k(request, indexes, default, limits, 1)
    threshold = request.threshold
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise RequestFieldError("threshold", "a probability between 0 and 1", short(threshold))
    review_below = 0.5 if request.review_below is None else request.review_below
    if not 0.0 <= review_below <= 1.0:
        raise RequestFieldError("review_below", "a probability from 0 to 1", short(review_below))
    if request.style is not None and request.style not in ("auto", "terms", "phrases"):
        raise RequestFieldError("style", "auto, terms or phrases", short(request.style))
    if not request.texts:
        raise RequestFieldError("texts", "at least one text", "an empty list")
    if len(request.texts) > limits.max_texts:
        raise RequestFieldError("texts", f"at most {limits.max_texts} texts", f"{len(request.texts)}", 413)
    work = 0
    for i, t in enumerate(request.texts):
        _check_item("texts", i, t)
        if not t.text.strip():
            raise RequestFieldError(f"texts[{i}].text", "a non-empty text", short(t.text))
        work += len(t.text)
        if work > limits.max_request_chars:
            raise RequestFieldError("texts", f"at most {limits.max_request_chars} characters in all",
                                    f"more ({work} up to texts[{i}])", 413)
        _check_lang("texts", i, t.lang, loaded)
    return loaded, k, threshold, review_below
