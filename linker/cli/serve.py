"""`linker serve`: the HTTP service (FastAPI + uvicorn) over one or more index folders.

FastAPI and uvicorn (the `service` extra) are imported inside the command so that other commands start, and
the light install works, without them; without them `serve` is one error line naming the extra.
"""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import (
    QUERY_PRECISION_HELP, check_linker_options, min_confidence_option, min_score_option, rerank_k_option,
    rerank_option,
)
from linker.errors import ConfigError


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:  # socket.bind raises OverflowError for these, a traceback
        raise ConfigError(f"--port: expected a TCP port from 0 to 65535 (0: any free port), found {port}")


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port, as uvicorn binds one, or ConfigError in one line: a port out of range,
    one in use or not allowed, a host this machine does not have or cannot resolve."""
    check_port(port)
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on a connection whose socket says TCP
    # (`asyncio.base_events._set_nodelay`), and the connections accepted here inherit it. Without it a response's
    # second write (its body after its headers) waited for the client's delayed ACK: +40 ms on every request of a
    # kept-alive connection (GET /health 44 ms, now 4 ms).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError, UnicodeError) as exc:
        sock.close()
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"--host {host} --port {port}: expected an address this machine can listen on, "
                          f"found {reason}") from None
    # Listening now, before "serving … on" is printed, so a client that connects on that line is queued in the
    # backlog until uvicorn accepts rather than refused (uvicorn's own listen() on this socket is harmless).
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


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
    min_score: float = min_score_option(),
    precision: str = typer.Option(None, "--precision", help=QUERY_PRECISION_HELP),
) -> None:
    """Serve POST /link, POST /annotate, GET /health, GET /indexes and the OpenAPI docs at /docs."""
    from linker.extras import check

    check(("fastapi", "uvicorn"), extra="service", what="linker serve")  # one line, before any work
    check_port(port)  # before the indexes load, which may take minutes
    check_linker_options(rerank_k=rerank_k, min_confidence=min_confidence, precision=precision, min_score=min_score)
    import uvicorn

    from linker.service import ServiceLimits, create_app

    given = {"max_text_chars": max_text_chars, "max_mentions": max_mentions, "max_request_chars": max_request_chars,
             "max_k": max_k}
    limits = ServiceLimits(**{name: value for name, value in given.items() if value is not None})
    linker_options = {"rerank": rerank, "rerank_k": rerank_k, "min_confidence": min_confidence, "min_score": min_score,
                      "precision": precision}
    service = create_app(index, limits, linker_options=linker_options)  # loads every index now: a bad one fails before the port opens
    sock = listen_socket(host, port)  # bound here, not by uvicorn, so that a failure is one error line
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"serving {', '.join(service.state.indexes)} on http://{shown}:{sock.getsockname()[1]} (docs at /docs)",
               err=True)
    config = uvicorn.Config(service, host=host, port=port, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
