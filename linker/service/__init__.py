"""HTTP service over the same `Linker` as the CLI: POST /link, POST /annotate, GET /health, GET /indexes, /docs.

Needs the `service` extra (fastapi, uvicorn, fastapi-offline); without FastAPI, importing this package is one
ConfigError naming it. /docs is Swagger UI with its files served by the app itself (fastapi-offline ships them),
not from a CDN, so it works offline.

    app = create_app(["indexes/default"])       # indexes load here, once, before serving
    uvicorn.run(app, host="127.0.0.1", port=8000)

The package, by role:

- `app`: `create_app`, the routes (thin: check, queue on a worker, render) and the error handlers.
- `schemas`: the request and response bodies (pydantic models, the OpenAPI schema).
- `guards`: `ServiceLimits` and every check before the work it bounds: the body as it streams in (`BodyLimit`),
  the JSON shape before parsing (`scan_json`), the fields after validation, and the one error body.
- `batcher`: the workers, `MentionBatcher` (one per index) and `Tagger` (one for /annotate).

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

Concurrency: every model call runs on one `InferencePool`, a thread per index and one for the tagger, at most
one per core, each call's math on the cores divided among them. Linking goes through a `MentionBatcher` per index:
concurrent requests share `Linker.link` calls (dynamic batching: a slice of every waiting request per call, a call
waiting briefly for the requests its last call answered), and a large request is cut into slices so that it cannot
hold the others up. /annotate tags through the `Tagger`, a slice of one request at a time, then links its adverse
events in the same calls as /link requests. Requests await those workers without holding a thread; the event loop
stays free for /health and for reading other requests.
"""

from linker.extras import check as _check_extra

_check_extra(("fastapi",), extra="service", what="linker's HTTP service")  # one line, not an ImportError, without it

from linker.service.app import DOCS_FILES_URL, create_app, swagger_files  # noqa: E402
from linker.service.batcher import (  # noqa: E402
    BusyError, CallCost, InferencePool, LoadedIndex, MentionBatcher, Tagger, load_indexes,
)
from linker.service.guards import (  # noqa: E402
    SCAN_MAX_DEPTH, SCAN_MAX_ITEMS, BodyLimit, RequestFieldError, ScannedJSONRoute, ServiceLimits,
    scan_json, scan_max_tokens,
)
from linker.service.schemas import (  # noqa: E402
    AnnotateRequest, AnnotateResponse, CandidateOut, DocumentOut, ErrorOut, LinkRequest, LinkResponse, MentionIn,
    MentionOut, SpanOut, TextIn,
)

__all__ = [
    "DOCS_FILES_URL", "SCAN_MAX_DEPTH", "SCAN_MAX_ITEMS", "AnnotateRequest", "AnnotateResponse", "BodyLimit",
    "BusyError", "CallCost", "CandidateOut", "DocumentOut", "ErrorOut", "InferencePool", "LinkRequest",
    "LinkResponse", "LoadedIndex", "MentionBatcher", "MentionIn", "MentionOut", "RequestFieldError",
    "ScannedJSONRoute", "ServiceLimits", "SpanOut", "Tagger", "TextIn", "create_app", "load_indexes", "scan_json",
    "scan_max_tokens", "swagger_files",
]
