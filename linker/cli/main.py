"""The `linker` console script.

Every command calls a library function; `main` turns a `LinkerError` into one line on stderr
and exit code 1, so users never see a traceback for a problem in their input.
"""

from __future__ import annotations

import logging
import sys

import typer

from linker.errors import LinkerError

app = typer.Typer(
    name="linker",
    help="Multilingual medical entity linking: dictionaries, indexes, linking, evaluation, training, service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only log errors."),
) -> None:
    level = logging.DEBUG if verbose else logging.ERROR if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _register() -> None:
    # Each group lives in its own module; importing it adds its commands to `app`.
    from linker.cli import dict as _dict  # noqa: F401
    from linker.cli import eval as _eval  # noqa: F401
    from linker.cli import train as _train  # noqa: F401
    from linker.cli import normalize as _normalize, serve as _serve  # noqa: F401
    from linker.cli import index as _index, link as _link  # noqa: F401


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Typer's own handling covers usage errors (usage line, exit 2) and --help;
    a LinkerError from the library becomes one `error: ...` line on stderr and exit 1."""
    try:
        app(args=argv, prog_name="linker")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        # Success returns normally, so tests and embedding code can call main([...]) in-process.
    except LinkerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
