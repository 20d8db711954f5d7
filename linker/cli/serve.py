"""`linker serve`: the HTTP service (FastAPI + uvicorn) over one or more index folders.

FastAPI and uvicorn are imported inside the command so that other commands start without them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli.common import QUERY_PRECISION_HELP, min_confidence_option, rerank_k_option, rerank_option
from linker.cli.main import app


@app.command("serve")
def serve_cli(
    index: list[Path] = typer.Option(..., "--index", "-i", help="Index folder; repeat for several (the first is the default)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (127.0.0.1 = this machine only)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    max_text_chars: int = typer.Option(None, "--max-text-chars", help="Longest mention text accepted (default 500)."),
    max_mentions: int = typer.Option(None, "--max-mentions", help="Most mentions per request (default 1000)."),
    max_request_chars: int = typer.Option(
        None, "--max-request-chars", help="Most characters per request in all, after normalisation (default 100000)."),
    max_k: int = typer.Option(None, "--max-k", help="Largest k accepted (default 100)."),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    precision: str = typer.Option(None, "--precision", help=QUERY_PRECISION_HELP),
) -> None:
    """Serve POST /link, GET /health, GET /indexes and the OpenAPI docs at /docs."""
    import uvicorn

    from linker.service import ServiceLimits, create_app

    given = {"max_text_chars": max_text_chars, "max_mentions": max_mentions, "max_request_chars": max_request_chars,
             "max_k": max_k}
    limits = ServiceLimits(**{name: value for name, value in given.items() if value is not None})
    linker_options = {"rerank": rerank, "rerank_k": rerank_k, "min_confidence": min_confidence, "precision": precision}
    service = create_app(index, limits, linker_options=linker_options)  # loads every index now: a bad one fails before the port opens
    typer.echo(f"serving {', '.join(service.state.indexes)} on http://{host}:{port} (docs at /docs)", err=True)
    uvicorn.run(service, host=host, port=port, log_level="warning", access_log=False)
