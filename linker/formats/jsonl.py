"""JSONL spans: one JSON object per line, ``{"text": ..., "id"?: ..., "lang"?: ...}``; other fields are kept.

The writer adds ``candidates`` to the object as read. A record must round-trip through UTF-8
JSON, so strings holding a lone surrogate (``"\\ud800"`` escaped in the input) and objects nested
deeper than `MAX_DEPTH` are refused here, with the line, instead of failing when the output is written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from linker.errors import InputFormatError, MissingInputError, shorten
from linker.fileio import STDIO, describe_path, iter_handle_lines, iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits

# Spans carry flat metadata; 32 levels leave room for any real record and keep json.dumps far
# from Python's recursion limit.
MAX_DEPTH = 32


@dataclass(frozen=True)
class Span:
    """One JSONL input line: its fields as given, plus the validated text and language."""

    line: int
    record: dict
    text: str
    lang: str | None


def _check_structure(record: dict, where: str, number: int | None) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings (keys or values) that are not valid Unicode text."""
    stack: list[tuple[object, int, str]] = [(record, 1, "")]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_DEPTH:
            raise InputFormatError(where, f"JSON nested at most {MAX_DEPTH} levels deep", f"deeper nesting at {field!r}",
                                   line=number)
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, where, number, f"{field}.{key}" if field else key)
                stack.append((item, depth + 1, f"{field}.{key}" if field else key))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, f"{field}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, where, number, field)


def _check_text(value: str, where: str, number: int | None, field: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputFormatError(where, f"field {field!r} as Unicode text",
                               f"a lone surrogate {value[exc.start]!r} at character {exc.start}", line=number) from None


def read_jsonl(lines: Iterable[tuple[int, str]], where: str) -> Iterator[Span]:
    """Validate and yield spans; blank lines are skipped, anything else malformed raises."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFormatError(where, "a JSON object", f"invalid JSON ({exc.msg})", line=number) from None
        except RecursionError:
            raise InputFormatError(where, f"JSON nested at most {MAX_DEPTH} levels deep",
                                   "nesting too deep to parse", line=number) from None
        if not isinstance(record, dict):
            raise InputFormatError(where, "a JSON object", f"{type(record).__name__} {shorten(line)}", line=number)
        _check_structure(record, where, number)
        text = record.get("text")
        if not isinstance(text, str):
            found = "no field 'text'" if "text" not in record else f"text of type {type(text).__name__}"
            raise InputFormatError(where, 'a string field "text"', found, line=number)
        if not text.strip():
            raise InputFormatError(where, "a non-empty text", f"text {text!r}", line=number)
        lang = record.get("lang")
        if lang is not None and (not isinstance(lang, str) or not lang.strip()):
            raise InputFormatError(where, '"lang" as a language code such as "en"', f"lang {lang!r}", line=number)
        span_id = record.get("id")
        if span_id is not None and (isinstance(span_id, bool) or not isinstance(span_id, (str, int))):
            raise InputFormatError(where, '"id" as a string or integer', f"id {span_id!r}", line=number)
        yield Span(number, record, text, lang.strip() if lang else None)


def jsonl_source(
    input_path: str, limits: ReadLimits = DEFAULT_LIMITS
) -> tuple[Callable[[], Iterable[tuple[int, str]]], str]:
    """(factory of numbered lines, name for messages) of a file or `-` (stdin).

    A file is streamed afresh by each call, so callers can validate in one pass and work in a
    second at constant memory; stdin cannot be read twice and is held (its lines capped).
    """
    if input_path == STDIO:
        lines, held = [], 0
        for number, line in iter_handle_lines(sys.stdin.buffer, "<stdin>", max_line_bytes=limits.max_line_bytes):
            held += len(line)
            if held > limits.max_document_bytes:  # held whole, so capped whole (characters, a lower bound of bytes)
                raise InputFormatError("<stdin>", f"at most {limits.max_document_bytes:,} bytes of spans on stdin",
                                       "more", line=number, fix="pass the spans as a file, or raise --max-document-bytes")
            lines.append((number, line))
        return (lambda: lines), "<stdin>"
    path = Path(input_path)
    if not path.is_file():
        found = describe_path(path)  # /dev/zero exists: say what it is, not that it is missing
        raise MissingInputError(f"{input_path}: {found}" if found == "no such file"
                                else f"{input_path}: expected a file, found {found}")
    return (lambda: iter_lines(path, max_line_bytes=limits.max_line_bytes)), input_path


def write_jsonl(out: TextIO, record: dict) -> None:
    """One output line: the record as JSON, non-ASCII kept as is.

    JSON escapes every control character and line separator, so what it cannot hold is only what
    `read_jsonl` refuses: a lone surrogate (no UTF-8) and nesting deeper than `MAX_DEPTH`. Such a
    record is refused here with its field, before a half line is written.
    """
    span_id = record.get("id")
    _check_structure(record, "output record" + (f" {shorten(str(span_id), 40)}" if span_id is not None else ""), None)
    out.write(json.dumps(record, ensure_ascii=False) + "\n")


__all__ = ["MAX_DEPTH", "Span", "jsonl_source", "read_jsonl", "write_jsonl"]
