"""Helpers shared by CLI modules: option parsing and output."""

from __future__ import annotations

import json

import typer


def split_csv(values: list[str] | None) -> tuple[str, ...]:
    """Accept both `--lang en --lang es` and `--lang en,es`."""
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return tuple(out)


def echo_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False, indent=2, default=str))


def read_limits(max_line_bytes: int | None, max_document_bytes: int | None):
    """`ReadLimits` from the --max-line-bytes / --max-document-bytes options (None = the default)."""
    from linker.formats import ReadLimits

    given = {"max_line_bytes": max_line_bytes, "max_document_bytes": max_document_bytes}
    return ReadLimits(**{name: value for name, value in given.items() if value is not None})


MAX_LINE_HELP = "Longest input line accepted, in bytes (default 1 MiB); a longer line is an error, never read whole."
MAX_DOCUMENT_HELP = "Largest brat .ann/.txt or XML document accepted, in bytes (default 64 MiB)."
LENIENT_HELP = "brat: skip (and report) annotations whose offsets or text do not match the .txt, instead of failing."
