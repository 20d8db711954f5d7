"""Write docs/cli.md, the CLI reference, from the `--help` of every `linker` command.

    python docs/gen_cli.py           # rewrite docs/cli.md
    python docs/gen_cli.py --check   # exit 1 when docs/cli.md differs from what the code's --help says

The commands are walked as tests/test_docs.py's command_paths does; each one's help is click's plain text at a
fixed width (no terminal colours or boxes), so the page depends on the code, not on the terminal it is made in.
`make docs` and tests/test_docs.py run the check, so a changed option fails CI until the page is regenerated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import typer

try:
    from typer import _click as click  # typer >= 0.26 vendors its own click
except ImportError:  # an older typer runs on the click package
    import click

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
WIDTH = 100

INTRO = """\
# CLI reference

Generated from each command's `--help` by `python docs/gen_cli.py` (do not edit by hand: `make docs` and
`tests/test_docs.py` fail when this page differs from the code). Run `linker COMMAND --help` for the same text.

## Behaviour shared by every command

- **Outputs never destroy inputs.** Every command that writes refuses, before any work, an output that is, contains
  or lies inside one of its inputs (symlinks resolved). An existing output file is replaced only with `--overwrite`;
  an existing output folder only with `--overwrite` and only when linker wrote it (it carries a `.linker-output`
  marker); anything else is left alone.
- **Crash-safe writes.** Outputs are written to `.NAME.linker-tmp-PID-*` beside them and renamed into place, so a
  killed run leaves the previous output intact; the next run removes such temporaries once their process is gone.
  Each hostile case, before and after, is in
  [eval/reliability/reliability.md](../eval/reliability/reliability.md).
- **Errors** are one line on stderr, `error: ...`, never a traceback, and the exit code says which kind:
  **1** for an error in the work (a bad input file, named with its line or field, what was expected and what was
  found; a missing index or extra; an option out of range; a permission or a full disk), **2** for a usage error
  found while parsing the command line (a misspelt command or option, a missing option, a value of the wrong type,
  e.g. `error: linker link: no such option --kk; did you mean --k?`), **130** when interrupted (Ctrl-C).
- **Global options** (before the command): `-v/--verbose` (also other libraries' messages), `-q/--quiet` (errors
  only, no progress), `--version`. Long steps show a progress bar with rate and ETA on a terminal, a log line every
  30 s otherwise.
- **Dataset specs** (`--dataset`, `--train`): `FORMAT:PATH[#OPTIONS]`, see [File formats](formats.md#dataset-specs).

## Commands

"""


def commands() -> list[tuple[list[str], str, str]]:
    """(path, one-line summary, plain --help text) for the root, every group and every command, in `--help` order."""
    from linker.cli.main import app

    out = []

    def walk(command, path: list[str], parent) -> None:
        ctx = click.Context(command, info_name=path[-1] if path else "linker", parent=parent,
                            terminal_width=WIDTH, max_content_width=WIDTH)
        command.rich_markup_mode = None  # click's plain formatter instead of typer's boxes
        summary = " ".join((command.help or "").split("\n\n")[0].split())  # the help's first paragraph
        out.append((path, summary, command.get_help(ctx)))
        if hasattr(command, "commands"):  # a group
            for name in command.list_commands(ctx):
                walk(command.commands[name], [*path, name], ctx)

    walk(typer.main.get_command(app), [], None)
    return out


def anchor(path: list[str]) -> str:
    return "-".join(["linker", *path])


def render() -> str:
    entries = commands()
    lines = [INTRO.rstrip("\n"), "", "| command | what it does |", "|---|---|"]
    for path, summary, _ in entries[1:]:
        summary = summary.replace("|", "\\|")
        lines.append(f"| [`linker {' '.join(path)}`](#{anchor(path)}) | {summary} |")
    for path, _, text in entries:
        lines += ["", f"## linker {' '.join(path)}".rstrip(), "", "```text", *(line.rstrip() for line in
                  text.rstrip("\n").splitlines()), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is not up to date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `python docs/gen_cli.py` and commit it", file=sys.stderr)
            return 1
        print(f"{PAGE.relative_to(ROOT)} is up to date")
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
