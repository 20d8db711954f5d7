"""The `linker` console script.

Every command calls a library function; `main` turns a `LinkerError` into one line on stderr
and exit code 1, so users never see a traceback for a problem in their input.
"""

from __future__ import annotations

import errno
import logging
import sys

import typer
try:
    from typer import _click as typer_click  # typer >= 0.26 vendors its own click
except ImportError:  # an older typer runs on the click package it depends on
    import click as typer_click
from typer.core import TyperArgument, TyperGroup, TyperOption

import linker
from linker import progress
from linker.errors import InputFormatError, LinkerError

# `linker --help` lists commands in the order a user runs them, not in registration order.
PIPELINE_ORDER = ("dict", "index", "link", "normalize", "serve", "eval", "train")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class PipelineOrderGroup(TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


app = typer.Typer(
    name="linker",
    cls=PipelineOrderGroup,
    help="Multilingual medical entity linking: dictionaries, indexes, linking, evaluation, training, service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def configure_logging(*, verbose: bool = False, quiet: bool = False) -> None:
    """linker's own INFO lines (one result per step, progress in logs) by default; other
    libraries' below WARNING (FAISS's AVX512 probing, sentence-transformers' device choice) only with -v."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING)
    logging.getLogger("linker").setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.INFO)
    progress.set_enabled(not quiet)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"linker {linker.__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log details, including other libraries' messages."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only log errors; no progress."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    configure_logging(verbose=verbose, quiet=quiet)


def _register() -> None:
    # Each group lives in its own module; importing it adds its commands to `app`.
    from linker.cli import calibrate as _calibrate  # noqa: F401
    from linker.cli import dict as _dict  # noqa: F401
    from linker.cli import eval as _eval  # noqa: F401
    from linker.cli import train as _train  # noqa: F401
    from linker.cli import normalize as _normalize, serve as _serve  # noqa: F401
    from linker.cli import index as _index, link as _link  # noqa: F401
    from linker.cli import recipe as _recipe  # noqa: F401


_register()


def _value_name(typed: str) -> str:
    """`<path>` -> PATH, `<str>` and `<list[str]>` (a repeatable option) -> TEXT: click's names."""
    name = typed.strip("<>").removeprefix("list[").removesuffix("]").upper()
    return {"STR": "TEXT", "INT": "INTEGER"}.get(name, name)


def _plain_help(command) -> object:
    """Drop typer's type placeholders from help: `<bool>` beside flags, `<path>`/`<int>` beside
    values, `{table}` in usage lines. Values show click's upper-case type name (`--k INTEGER`)."""
    help_option = command.get_help_option(typer_click.Context(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        # These attributes are typer's own (0.29); an older typer (0.27 lacks them) keeps its default help.
        if isinstance(param, TyperArgument) and hasattr(param, "display_name_raw"):
            name = param.display_name_raw.upper()
            shown = name if param.nargs == 1 else f"{name}..."
            param.metavar = name
            param._usage_display_name = lambda shown=shown, required=param.required: shown if required else f"[{shown}]"
            param.display_type_rich = lambda ctx: None
        elif isinstance(param, TyperOption) and hasattr(param, "display_type"):
            param.display_type_rich = (lambda ctx: None) if param.is_flag else (
                lambda ctx, typed=param.display_type: _value_name(typed(ctx)))
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)
    return command


def cli_command():
    """The click command behind `linker`, with plain help."""
    return _plain_help(typer.main.get_command(app))


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Typer's own handling covers usage errors (usage line, exit 2) and --help;
    a LinkerError from the library becomes one `error: ...` line on stderr and exit 1."""
    try:
        _check_arguments(sys.argv[1:] if argv is None else argv)
        cli_command()(args=argv, prog_name="linker")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        # Success returns normally, so tests and embedding code can call main([...]) in-process.
    except LinkerError as exc:
        _fail(str(exc))
    except OSError as exc:
        # What the checks before the work cannot see (a permission, a full disk, a folder that
        # vanished): still one line naming the file, never a traceback.
        # linker.fileio's atomic writes name their output on a full disk; "a file" is the last resort.
        where = exc.filename if exc.filename is not None else "a file"
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        _fail(f"{where}: {exc.strerror or exc}" + (f" (and {exc.filename2})" if exc.filename2 else "")
              + ("; free space there, or write elsewhere" if full else ""))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


def _fail(message: str) -> None:
    # One line, printable whatever bytes a path held (surrogate escapes of non-UTF-8 names).
    line = " ".join(message.splitlines())
    typer.echo(f"error: {line.encode('utf-8', 'backslashreplace').decode('utf-8')}", err=True)
    sys.exit(1)


def _check_arguments(argv: list[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python hands such bytes over as surrogate escapes)."""
    for position, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            byte = arg[exc.start].encode("utf-8", "surrogateescape")
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise InputFormatError(f"argument {position} {shown!r}", "UTF-8 text (file and folder names included)",
                                   f"the byte {byte!r}", fix="rename the file or folder") from None


if __name__ == "__main__":
    main()
