"""`create_app`: the FastAPI app, its routes, its error handlers (every refusal is the one 4xx body of `guards`) and
/docs from local files. The routes are thin: check (`guards`), queue on a worker (`batcher`), render (`schemas`)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

import linker
from linker.errors import LinkerError
from linker.extras import available, install_hint
from linker.index.manifest import public_manifest
from linker.service.batcher import BusyError, InferencePool, LoadedIndex, Tagger, load_indexes
from linker.service.guards import (
    BodyLimit, RequestFieldError, ScannedJSONRoute, ServiceLimits, busy, check_annotate, check_link,
    error_response, field_name, is_json, printable, short,
)
from linker.service.schemas import (
    AnnotateRequest, AnnotateResponse, ErrorOut, LinkRequest, LinkResponse, annotate_body, link_body,
)

log = logging.getLogger(__name__)

ERROR_STATUSES = (400, 404, 405, 413, 415, 422, 429)
# A /link answer of at most this many candidates (mentions x k) is rendered on the event loop, a larger one on the
# threadpool: 48 candidates took ~2 ms on 2 loaded cores, less than a round trip through a thread there (each
# wake-up waits for a core); 1,000 x k=100 take ~1 s, which would hold every other request up.
INLINE_CANDIDATES = 50


def create_app(index_dirs: Sequence[str | Path], limits: ServiceLimits = ServiceLimits(), *,
               linker_options: dict | None = None) -> FastAPI:
    """The FastAPI app with `index_dirs` loaded (LinkerError here, before serving, if one is bad)."""
    pool = InferencePool()  # every model call of this app: a thread per index and the tagger, the cores shared
    indexes = load_indexes(index_dirs, limits.max_pending_mentions, linker_options, pool)
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
    app.state.pool = pool
    app.state.tagger = Tagger(limits.max_pending_chars, pool=pool)  # /annotate's, shared by every index
    app.state.internal_errors = 0  # requests answered by `internal_error`; tests assert it stays 0
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.router.route_class = ScannedJSONRoute  # every route added below that takes a body is scanned before parsing
    for exc_class, handler in ERROR_HANDLERS:
        app.add_exception_handler(exc_class, handler)
    _add_routes(app, indexes, next(iter(indexes)), limits, app.state.tagger)
    return app


# ----------------------------------------------------------------------------- routes


def _add_routes(app: FastAPI, indexes: dict[str, LoadedIndex], default: str, limits: ServiceLimits,
                tagger: Tagger) -> None:
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

    errors = {status: {"model": ErrorOut} for status in ERROR_STATUSES}

    @app.post("/link", response_model=LinkResponse, response_model_exclude_none=True, responses=errors)
    async def link(request: LinkRequest) -> Response:
        """Link mentions to ranked concepts (score desc, concept_id) with the matched dictionary name."""
        loaded, k = check_link(request, indexes, default, limits)
        mentions = request.mentions
        try:
            results = await loaded.batcher.link([m.text for m in mentions], [m.lang for m in mentions], k)
        except BusyError as exc:
            raise busy("mentions", f"the queue of index {loaded.name}", exc) from None
        if len(mentions) * k <= INLINE_CANDIDATES:
            body = link_body(loaded, k, mentions, results)
        else:
            body = await run_in_threadpool(link_body, loaded, k, mentions, results)
        return Response(body, media_type="application/json")

    @app.post("/annotate", response_model=AnnotateResponse, response_model_exclude_none=True, responses=errors)
    async def annotate(request: AnnotateRequest) -> Response:
        """Extract adverse events, drugs and effects from texts (each text's tagger by its lang, given or detected:
        linker-ae for English, linker-ae-multi for others) and code each positive adverse event with
        the index: code, confidence, and the decision (auto, review, no link, not coded)."""
        return await _annotate(request, *check_annotate(request, indexes, default, limits), tagger)


async def _annotate(request: AnnotateRequest, loaded: LoadedIndex, k: int, threshold: float | None,
                    review_below: float, tagger: Tagger) -> Response:
    """/annotate after its checks: the steps of `linker.extract.annotate_documents`, each on the service's own
    worker: tag on the tagger's, then link the positive adverse events (`EventLinks`) through the index's batcher,
    where this request gets the same share as any /link request, and decide."""
    from linker.extract import EventLinks, lexicon_of

    try:
        # the index's names as the tagger's evidence, as `annotate` gives them (built once per index, off the loop)
        lexicon = await run_in_threadpool(lexicon_of, loaded.linker)
        tagged = await tagger.extract([t.text for t in request.texts], threshold=threshold,
                                      style=request.style or "auto", lexicon=lexicon,
                                      langs=[t.lang for t in request.texts])
    except BusyError as exc:
        raise busy("texts", "the tagger's queue", exc) from None
    events = EventLinks.of(tagged.results, langs=[t.lang for t in request.texts])
    try:
        results = await loaded.batcher.link(events.mentions, events.langs, k) if events.mentions else []
    except BusyError as exc:
        raise busy("texts", f"the queue of index {loaded.name}", exc) from None
    body = await run_in_threadpool(annotate_body, loaded, k, request, tagged.model, events, results, review_below)
    return Response(body, media_type="application/json")


# ----------------------------------------------------------------------------- error handlers: one 4xx body each


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    content_type = request.headers.get("content-type")
    if content_type is not None and not is_json(content_type):
        return error_response(415, f"Content-Type: expected application/json, found {short(content_type)}",
                              "Content-Type")
    errors = exc.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request", "type": "invalid"}
    if first.get("type") == "json_invalid":
        return error_response(400, f"body: expected JSON, found invalid JSON ({first.get('msg')})", "body")
    details = [
        {"field": printable(field_name(e.get("loc", ()))), "message": printable(str(e.get("msg"))),
         "type": str(e.get("type"))}
        for e in errors[:20]
    ]
    field_ = details[0]["field"]
    message = f"{field_}: {details[0]['message']}"
    if first.get("type") != "missing":
        message += f", found {short(first.get('input', None))}"
    return error_response(422, message, field_, errors=details)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # Routing (404, 405) and FastAPI's body parser (400) raise these; they get the same body shape.
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        routes = "POST /link, POST /annotate, GET /health, GET /indexes, GET /docs"
        return error_response(404, f"path: expected one of {routes}, found {short(where)}", "path")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return error_response(405, f"method: expected {allowed} for {request.url.path}, found {request.method}",
                              "method", headers=exc.headers)
    cause = exc.__cause__
    if exc.status_code == 400 and cause is not None:  # json.loads failed other than by syntax
        reason = str(cause).split(";")[0][:120]  # drop Python's advice on sys.set_int_max_str_digits
        return error_response(400, f"body: expected JSON that can be parsed, found {type(cause).__name__}: {reason}",
                              "body")
    return error_response(exc.status_code, f"{where}: {exc.detail}", None, headers=exc.headers)


async def field_error(_request: Request, exc: RequestFieldError) -> JSONResponse:
    return error_response(exc.status, str(exc), exc.field, headers=exc.headers)


async def linker_error(_request: Request, exc: LinkerError) -> JSONResponse:
    return error_response(422, str(exc), getattr(exc, "where", None))


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    # A bug, not bad input. The contract is "never 5xx": the client gets the usual error body
    # (422: the same request will fail the same way) and the traceback goes to the server log.
    request.app.state.internal_errors += 1
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(422, "internal error: the service failed on this request; the traceback is in the "
                               "server log (please report it)", None)


ERROR_HANDLERS = ((RequestValidationError, validation_error), (StarletteHTTPException, http_error),
                  (RequestFieldError, field_error), (LinkerError, linker_error), (Exception, internal_error))


# ----------------------------------------------------------------------------- GET /docs from local files

# Swagger UI's files, served by the service itself (FastAPI's default /docs loads them from a CDN: a blank page
# offline). They come from the fastapi-offline package (the `service` extra), which ships them; only its files are used.
DOCS_FILES_URL = "/docs-files"


def swagger_files() -> Path | None:
    """The folder of swagger-ui-bundle.js, swagger-ui.css and favicon.png, or None when fastapi-offline is absent."""
    if not available("fastapi_offline"):
        return None
    folder = Path(importlib.util.find_spec("fastapi_offline").origin).parent / "static"
    needed = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")
    return folder if all((folder / name).is_file() for name in needed) else None


def _add_docs(app: FastAPI) -> None:
    """GET /docs: Swagger UI from local files; without them, a page saying what to install (the schema is at
    /openapi.json either way)."""
    from linker import service  # the package's name, looked up now: the one a user or a test replaces

    folder = service.swagger_files()
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
