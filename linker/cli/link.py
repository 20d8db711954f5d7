"""`linker link`: link mentions given on the command line or as JSONL."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import typer

from linker.cli.common import echo_json
from linker.cli.main import app
from linker.errors import InputFormatError, shorten
from linker.fileio import atomic_file, iter_lines
from linker.link import Linker, LinkResult

BATCH = 256  # JSONL lines linked per call: amortises the sparse product, bounds memory


def read_spans(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSONL file of {"text": ..., optional "id", "lang"}; blank lines skipped."""
    lines = ((n, line) for n, line in enumerate(sys.stdin, start=1)) if str(path) == "-" else iter_lines(path)
    where = "<stdin>" if str(path) == "-" else path
    for number, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFormatError(where, "a JSON object per line", f"invalid JSON ({exc.msg})", line=number) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise InputFormatError(where, 'an object with a non-empty "text"', shorten(line), line=number)
        lang = obj.get("lang")
        if lang is not None and not isinstance(lang, str):
            raise InputFormatError(where, '"lang" as a string such as "es"', shorten(repr(lang)), line=number)
        yield number, obj


def _link_jsonl(linker: Linker, source: Path, k: int, lang: str | None, write) -> int:
    count = 0
    pending: list[dict] = []

    def flush() -> None:
        by_lang: dict[str | None, list[dict]] = {}
        for obj in pending:
            by_lang.setdefault(obj.get("lang") or lang, []).append(obj)
        for group_lang, objs in by_lang.items():
            for obj, result in zip(objs, linker.link([o["text"] for o in objs], k=k, lang=group_lang)):
                obj["candidates"] = result.to_dict()["candidates"]
        for obj in pending:
            write(json.dumps(obj, ensure_ascii=False) + "\n")
        pending.clear()

    for _number, obj in read_spans(source):
        pending.append(obj)
        count += 1
        if len(pending) >= BATCH:
            flush()
    flush()
    return count


def _print(result: LinkResult) -> None:
    typer.echo(result.mention)
    if not result.candidates:
        typer.echo("  (no candidate)")
    for rank, c in enumerate(result.candidates, start=1):
        matched = "" if c.matched_name == c.preferred_name else f"  [matched {c.matched_name!r} {c.term_type} {c.lang}]"
        typer.echo(f"  {rank}. {c.concept_id}\t{c.score:.4f}\t{c.preferred_name}{matched}")
        for path in c.hierarchy:
            typer.echo(f"       {'primary ' if path.primary_soc else ''}SOC {path.soc_code} {path.soc_name}"
                       f" > HLGT {path.hlgt_code} > HLT {path.hlt_code} {path.hlt_name}")


@app.command("link")
def link_cli(
    mentions: list[str] = typer.Argument(None, help="Mention texts to link."),
    index: Path = typer.Option(..., "--index", "-i", help="Index folder from `linker index build`."),
    k: int = typer.Option(5, "--k", "-k", help="Concepts per mention."),
    lang: str = typer.Option(None, "--lang", help="Only names of this language (ISO 639-1); JSONL 'lang' overrides."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    input_path: Path = typer.Option(None, "--input", help='JSONL of {"text": ..., "id"?, "lang"?}; - for stdin.'),
    output: Path = typer.Option(None, "--output", help="JSONL with a 'candidates' list added; - for stdout."),
) -> None:
    """Link mentions to concepts: the top-k distinct concepts with scores and matched names."""
    if not mentions and input_path is None:
        raise InputFormatError("command line", "mention texts or --input FILE.jsonl", "neither")
    if mentions and input_path is not None:
        raise InputFormatError("command line", "mention texts or --input, not both", "both")
    linker = Linker.load(index)
    if input_path is not None:
        if output is None or str(output) == "-":
            count = _link_jsonl(linker, input_path, k, lang, sys.stdout.write)
        else:
            with atomic_file(output) as tmp, tmp.open("w", encoding="utf-8") as handle:
                count = _link_jsonl(linker, input_path, k, lang, handle.write)
            typer.echo(f"linked {count:,} mentions to {output}", err=True)
        return
    results = linker.link(mentions, k=k, lang=lang)
    if as_json:
        echo_json([r.to_dict() for r in results])
        return
    for result in results:
        _print(result)
