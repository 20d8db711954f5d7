"""Helpers shared by CLI modules: option parsing and output."""

from __future__ import annotations

import json
import sys

import typer


def split_csv(values: list[str] | None) -> tuple[str, ...]:
    """Accept both `--lang en --lang es` and `--lang en,es`."""
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return tuple(out)


def progress_enabled() -> bool:
    """Progress bars on for a terminal, off for pipes, files and tests."""
    return sys.stderr.isatty()


def echo_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False, indent=2, default=str))
