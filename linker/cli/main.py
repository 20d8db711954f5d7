"""The `linker` console script.

Every command calls a library function; `main` turns a `LinkerError` into one line on stderr
and exit code 1, so users never see a traceback for a problem in their input.
"""

from __future__ import annotations

import logging
import sys

import click
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


_register()


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=False)
    except LinkerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
