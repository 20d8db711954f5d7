"""`linker link`: link mentions given on the command line or as JSONL."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import (
    MAX_LINE_HELP, QUERY_PRECISION_HELP, check_file, check_index, check_linker_options, echo_json, min_confidence_option,
    min_score_option, option_inputs, read_limits, rerank_k_option, rerank_option,
)
from linker.errors import InputFormatError
from linker.fileio import STDIO
from linker.link import Linker, LinkResult
from linker.normalize import check_paths, normalize_jsonl_stream


EXPLAINED_NGRAMS = 12  # shared n-grams printed per candidate by --explain (the JSON has all)


def _print(result: LinkResult, linker: Linker | None = None) -> None:
    # the decision (auto, review, no link) beside the mention when the index is calibrated
    typer.echo(result.mention if result.decision is None else f"{result.mention}\t{result.decision}")
    if not result.candidates:
        typer.echo("  (no link)")
    for rank, c in enumerate(result.candidates, start=1):
        matched = "" if c.matched_name == c.preferred_name else f"  [matched {c.matched_name!r} {c.term_type} {c.lang}]"
        confidence = "" if c.confidence is None else f"\tconfidence {c.confidence:.3f}"
        typer.echo(f"  {rank}. {c.concept_id}\t{c.score:.4f}{confidence}\t{c.preferred_name}{matched}")
        if linker is not None:
            shared = linker.explain(result.mention, c)
            more = f" and {len(shared) - EXPLAINED_NGRAMS} more" if len(shared) > EXPLAINED_NGRAMS else ""
            typer.echo("       shared n-grams (mention weight x name weight): "
                       + ", ".join(f"{s.ngram!r} {s.mention_weight:.3f}x{s.name_weight:.3f}"
                                   for s in shared[:EXPLAINED_NGRAMS]) + more)
        for path in c.hierarchy:
            typer.echo(f"       {'primary ' if path.primary_soc else ''}SOC {path.soc_code} {path.soc_name}"
                       f" > HLGT {path.hlgt_code} > HLT {path.hlt_code} {path.hlt_name}")


@app.command("link")
def link_cli(
    mentions: list[str] = typer.Argument(None, help="Mention texts to link."),
    index: Path = typer.Option(..., "--index", "-i", help="Index folder from `linker index build`."),
    k: int = typer.Option(5, "--k", "-k", help="Concepts per mention."),
    lang: str = typer.Option(None, "--lang", help="Only names of this language (ISO 639-1); JSONL 'lang' overrides."),
    as_json: bool = typer.Option(False, "--json", help='Print JSON: a list of {"text", "candidates", "nil", "decision"}, as the JSONL and HTTP results.'),
    input_path: Path = typer.Option(None, "--input", help='JSONL of {"text": ..., "id"?, "lang"?}; - for stdin.'),
    output: Path = typer.Option(None, "--output", help="JSONL with a 'candidates' list added; - for stdout."),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    min_score: float = min_score_option(),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --output when it exists."),
    explain: bool = typer.Option(False, "--explain", help="Show the n-grams each mention shares with each matched name, with their tf-idf weights."),
    precision: str = typer.Option(None, "--precision", help=QUERY_PRECISION_HELP),
) -> None:
    """Link mentions to concepts: the top-k distinct concepts with scores and matched names."""
    if not mentions and input_path is None:
        raise InputFormatError("command line", "mention texts or --input FILE.jsonl", "neither")
    if mentions and input_path is not None:
        raise InputFormatError("command line", "mention texts or --input, not both", "both")
    if explain and input_path is not None:
        raise InputFormatError("command line", "--explain with mention texts on the command line", "--input")
    # Everything below is checked before the index loads (seconds): options, then the input and output paths
    # (the index and model folders are inputs too), then the index folder's manifest.
    check_linker_options(k=k, rerank_k=rerank_k, min_confidence=min_confidence, precision=precision,
                         min_score=min_score)
    limits = read_limits(max_line_bytes, None)
    if input_path is not None:
        check_file(input_path, "--input")
        check_paths(str(input_path), str(output or STDIO), fmt="jsonl", overwrite=overwrite,
                    inputs=option_inputs(index, rerank))
    check_index(index, rerank)
    linker = Linker.load(index, rerank=rerank, rerank_k=rerank_k, min_confidence=min_confidence, min_score=min_score,
                         precision=precision)
    if input_path is not None:
        summary = normalize_jsonl_stream(linker, str(input_path), str(output or STDIO), k=k, lang=lang,
                                         limits=limits, overwrite=overwrite)
        if output is not None and str(output) != STDIO:
            typer.echo(f"linked {summary.mentions:,} mentions to {output}", err=True)
        return
    results = linker.link(mentions, k=k, lang=lang)
    if as_json:
        # "text", as in the JSONL of --input/normalize and the HTTP service's results
        records = [{"text": record.pop("mention"), **record} for record in (r.to_dict() for r in results)]
        if explain:
            for record, result in zip(records, results):
                for out, candidate in zip(record["candidates"], result.candidates):
                    out["shared_ngrams"] = [asdict(s) for s in linker.explain(result.mention, candidate)]
        echo_json(records)
        return
    for result in results:
        _print(result, linker if explain else None)
