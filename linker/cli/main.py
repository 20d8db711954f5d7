"""The `linker` console script.

Every command calls a library function. Whatever goes wrong is one line on stderr, ``error: ...``, never a
traceback or a box, and the exit code says which kind:

- 1: a `LinkerError` from the library (a bad input file, a missing index, an option out of range, a missing extra)
  or an OS error (a permission, a full disk);
- 2: a usage error found while parsing the command line (click's convention): a misspelt command or option, a
  missing option, a value of the wrong type; the line names the command, what was expected and what was found,
  e.g. ``error: linker link: no such option --kk; did you mean --k?``;
- 130: interrupted (Ctrl-C).

Arguments and input paths are checked before anything slow is loaded (an index, a model). Logging: warnings and
errors only, plus progress lines (`linker.progress`) where stderr is not a terminal; ``-v`` adds linker's INFO
lines (and other libraries'), ``-vv`` DEBUG; ``-q`` keeps errors only and shows no progress.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import logging
import re
import sys

import typer
try:
    from typer import _click as typer_click  # typer >= 0.26 vendors its own click
except ImportError:  # an older typer runs on the click package it depends on
    import click as typer_click
from typer.core import TyperArgument, TyperOption

import linker
from linker import progress
from linker.cli._app import app
from linker.errors import InputFormatError, LinkerError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ShortDigests(logging.Formatter):
    """Log lines with each sha256 (64 hex digits) cut to its first 12, as `Linker.version` shows them."""

    DIGEST = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{52}\b")

    def format(self, record: logging.LogRecord) -> str:
        return self.DIGEST.sub(r"\1", super().format(record))


def configure_logging(*, verbose: bool | int = False, quiet: bool = False) -> None:
    """Warnings and errors by default, and `linker.progress`'s lines (progress where no bar is drawn, notes of slow
    steps); verbose=1 (-v) adds INFO lines, linker's and other libraries' (FAISS's AVX512 probing,
    sentence-transformers' device choice); verbose=2 (-vv) DEBUG; quiet (-q) errors only, no progress."""
    level = (logging.ERROR if quiet else logging.WARNING if not verbose else logging.INFO if verbose == 1
             else logging.DEBUG)
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(ShortDigests(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    # linker's loggers follow the root's level (no level of their own), so a caller that lowers the root's
    # level later (a test's caplog, an embedding application) sees their INFO lines again.
    logging.getLogger("linker").setLevel(logging.NOTSET)
    logging.getLogger("linker.progress").setLevel(logging.ERROR if quiet else min(level, logging.INFO))
    progress.set_enabled(not quiet)


@contextlib.contextmanager
def _settings_restored():
    """`configure_logging`'s settings last as long as the command: a caller of `main([...])` in the same process (a
    test, an application embedding the CLI) gets its logging levels, handlers and progress switch back, so one
    `-q` call does not silence the warnings of everything run after it."""
    root, ours, bars = logging.getLogger(), logging.getLogger("linker"), logging.getLogger("linker.progress")
    saved = root.level, list(root.handlers), ours.level, bars.level, progress.enabled()
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        ours.setLevel(saved[2])
        bars.setLevel(saved[3])
        progress.set_enabled(saved[4])


def _version(value: bool) -> None:
    if value:
        typer.echo(f"linker {linker.__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="Log INFO lines, linker's and other libraries' (-vv: DEBUG)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only log errors; no progress."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    configure_logging(verbose=verbose, quiet=quiet)


def _register() -> None:
    # Each group lives in its own module; importing it adds its commands to `app` (`linker.cli._app`, which no
    # command module needs this one for).
    from linker.cli import calibrate as _calibrate  # noqa: F401
    from linker.cli import dict as _dict  # noqa: F401
    from linker.cli import eval as _eval  # noqa: F401
    from linker.cli import train as _train  # noqa: F401
    from linker.cli import normalize as _normalize, serve as _serve  # noqa: F401
    from linker.cli import index as _index, link as _link  # noqa: F401
    from linker.cli import recipe as _recipe  # noqa: F401
    from linker.cli import extract as _extract  # noqa: F401


_register()


def _value_name(typed: str) -> str:
    """`<path>` -> PATH, `<str>` and `<list[str]>` (a repeatable option) -> TEXT: click's names."""
    name = typed.strip("<>").removeprefix("list[").removesuffix("]").upper()
    return {"STR": "TEXT", "INT": "INTEGER"}.get(name, name)


# click >= 8.3 tells a parameter left out by its default UNSET; typer < 0.17 gives required ones a default of None,
# which click then takes as given (`linker link a` would run without --index). typer >= 0.26 vendors its own click.
_CLICK_UNSET = getattr(getattr(typer_click, "_utils", None), "UNSET", None)


def _plain_help(command) -> object:
    """Drop typer's type placeholders from help: `<bool>` beside flags, `<path>`/`<int>` beside
    values, `{table}` in usage lines. Values show click's upper-case type name (`--k INTEGER`)."""
    help_option = command.get_help_option(typer_click.Context(command))
    for param in command.params:
        if _CLICK_UNSET is not None and param.required and param.default is None:
            param.default = _CLICK_UNSET  # an older typer on click >= 8.3: a required value left out is missing
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
    """Run the CLI (module docstring: one `error: ...` line and exit 1 for a LinkerError, 2 for a usage error).
    Success returns normally, so tests and embedding code can call main([...]) in-process."""
    args = sys.argv[1:] if argv is None else list(argv)
    with _settings_restored():
        _run(args)


def _run(args: list[str]) -> None:
    try:
        _check_arguments(args)
        # standalone_mode=False: click's usage errors come here instead of being drawn in typer's box
        code = cli_command().main(args=args, prog_name="linker", standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into Exit(130)
            raise KeyboardInterrupt
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            sys.exit(code)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    except typer_click.exceptions.ClickException as exc:
        no_args_help = getattr(typer_click.exceptions, "NoArgsIsHelpError", None)
        if no_args_help is not None and isinstance(exc, no_args_help):
            typer.echo(exc.format_message())  # `linker`, `linker index`: the help, as `--help` shows it
            sys.exit(exc.exit_code)
        _fail(usage_line(exc, args), exc.exit_code)
    except typer.Abort:  # EOF or Ctrl-C where typer turns it into Abort (older typers)
        typer.echo("interrupted", err=True)
        sys.exit(130)
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


def _fail(message: str, code: int = 1) -> None:
    # One line, printable whatever bytes a path held (surrogate escapes of non-UTF-8 names).
    line = " ".join(message.splitlines())
    typer.echo(f"error: {line.encode('utf-8', 'backslashreplace').decode('utf-8')}", err=True)
    sys.exit(code)


def _param_name(param) -> str:
    """--index for an option (its long name), TABLE for an argument."""
    opts = getattr(param, "opts", None) or []
    if getattr(param, "param_type_name", "") == "option" and opts:
        return max(opts, key=len)
    return (getattr(param, "human_readable_name", None) or param.name or "argument").upper()


def _given(args: list[str], param) -> str | None:
    """The value the command line gave an option (`--k x`, `--k=x`), for 'found ...'."""
    for i, arg in enumerate(args):
        for opt in getattr(param, "opts", None) or []:
            if arg == opt and i + 1 < len(args):
                return args[i + 1]
            if opt.startswith("--") and arg.startswith(opt + "="):
                return arg[len(opt) + 1:]
    return None


def _sentence(text: str) -> str:
    """click's message as a clause: one line, lower-case start, no final full stop, '; did you mean'."""
    text = " ".join(text.split()).rstrip(".")
    text = re.sub(r"\.\s+(Did you mean)", lambda m: "; did you mean", text)
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _command_path(args: list[str]) -> str:
    """`linker link` from the leading command names of `args` (for an error click raised without a context)."""
    path, command = ["linker"], cli_command()
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        path.append(arg)
        command = sub
    return " ".join(path)


def usage_line(exc, args: list[str]) -> str:
    """One line for a click usage error: the command, what was wrong, what was expected or meant."""
    exceptions = typer_click.exceptions
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else _command_path(args)
    param = getattr(exc, "param", None)
    if isinstance(exc, exceptions.NoSuchOption):
        message = f"no such option {exc.option_name}"
        if exc.possibilities:
            message += f"; did you mean {' or '.join(sorted(exc.possibilities))}?"
        else:
            message += f" (`{where} --help` lists the options)"
    elif isinstance(exc, exceptions.MissingParameter) and param is not None:
        kind = "option" if getattr(param, "param_type_name", "") == "option" else "argument"
        message = f"missing {kind} {_param_name(param)}"
    elif isinstance(exc, exceptions.BadParameter) and param is not None:
        message = f"invalid value for {_param_name(param)}: {_sentence(exc.message)}"
        value = _given(args, param)
        if value is not None and repr(value) not in message:
            message += f", found {value!r}"
    else:
        message = _sentence(exc.format_message())
        command = re.match(r"no such command '(.*)'$", message)
        group = getattr(ctx, "command", None)
        if command and hasattr(group, "list_commands"):
            names = group.list_commands(ctx)
            close = difflib.get_close_matches(command.group(1), names, n=1)
            message += f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(names)}"
    return f"{where}: {message}"


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
