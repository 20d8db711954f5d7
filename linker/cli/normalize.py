"""`linker normalize`: link every span of a JSONL, brat or ADE-Eval/TAC-2017 XML input; `linker normalize-ray`: the
same for Parquet / JSONL shards on Ray Data. The options and checks every command that links shares (with `annotate`
and `annotate-ray` in `linker.cli.extract`) are declared once, in `linker.cli.common`."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import (
    LENIENT_HELP,
    QUERY_PRECISION_HELP,
    SHARDS_OUTPUT_HELP,
    address_option,
    check_coded_output,
    check_file,
    check_index,
    check_linker_options,
    check_ray_job,
    echo_ray_summary,
    index_option,
    lang_option,
    max_document_option,
    max_line_option,
    min_confidence_option,
    min_score_option,
    option_inputs,
    overwrite_option,
    read_limits,
    rerank_k_option,
    rerank_option,
    workers_option,
)
from linker.errors import ConfigError
from linker.fileio import STDIO
from linker.link import Linker
from linker.normalize import (
    BATCH,
    FORMATS,
    check_paths,
    normalize_jsonl_stream,
    normalize_path,
)


def precision_option():
    return typer.Option(None, "--precision", help=QUERY_PRECISION_HELP)


@app.command("normalize")
def normalize_cli(
    index: Path = index_option(),
    input_path: str = typer.Option(..., "--input", help="Input file or folder; `-` = stdin (jsonl only)."),
    fmt: str = typer.Option(None, "--format", "-f", help=f"Input format: {', '.join(FORMATS)}."),
    output: str = typer.Option(..., "--output", "-o", help="Output file or folder (mirrors the input); `-` = stdout (jsonl only)."),
    k: int = typer.Option(1, "--k", "-k", help="Candidates per span (jsonl); brat and ade-xml write the best one."),
    lang: str = lang_option(),
    db: str = typer.Option(None, "--db", help="brat: database name in `Reference T1 DB:ID` (default: the concept's source)."),
    overwrite: bool = overwrite_option(),
    expand_abbreviations: bool = typer.Option(
        False, "--expand-abbreviations",
        help="brat, ade-xml: link an abbreviation defined in its document ('... syndrome (NMS)') as the long form."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
    max_line_bytes: int = max_line_option(),
    max_document_bytes: int = max_document_option(),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    min_score: float = min_score_option(),
    precision: str = precision_option(),
    engine: str = typer.Option(None, "--engine", hidden=True, help="Moved: `linker normalize-ray`."),
) -> None:
    """Normalise predicted spans: add ranked concepts (jsonl), brat normalisation lines, or TAC/ADE-Eval Reactions."""
    if engine is not None:
        raise ConfigError(f"--engine {engine} is gone: `linker normalize` links here; on Ray: linker normalize-ray "
                          "--index FOLDER --input SHARDS --output FOLDER")
    # Options, paths and the index folder's manifest are checked before the index loads (seconds).
    check_linker_options(k=k, rerank_k=rerank_k, min_confidence=min_confidence, precision=precision,
                         min_score=min_score)
    if fmt is None:
        raise ConfigError(f"--format is required: one of {', '.join(FORMATS)}")
    FORMATS.get(fmt)  # an unknown format names the known ones, before any work
    check_coded_output(fmt, k, db)
    if expand_abbreviations and fmt == "jsonl":
        raise ConfigError("--expand-abbreviations needs the documents: use --format brat or ade-xml")
    if STDIO in (input_path, output) and fmt != "jsonl":
        raise ConfigError(f"`-` (stdin/stdout) works with --format jsonl only, found --format {fmt}")
    limits = read_limits(max_line_bytes, max_document_bytes)
    # before the index is loaded: the index and model folders are inputs too
    check_file(input_path, "--input")
    check_paths(input_path, output, fmt=fmt, overwrite=overwrite, inputs=option_inputs(index, rerank))
    check_index(index, rerank)
    started = time.perf_counter()
    linker = Linker.load(index, rerank=rerank, rerank_k=rerank_k, min_confidence=min_confidence, min_score=min_score,
                         precision=precision)
    if STDIO in (input_path, output):
        summary = normalize_jsonl_stream(linker, input_path, output, k=k, lang=lang, limits=limits, overwrite=overwrite)
    else:
        summary = normalize_path(linker, input_path, output, fmt=fmt, k=k, db=db, lang=lang, overwrite=overwrite,
                                 expand_abbreviations=expand_abbreviations, lenient=lenient, limits=limits)
    for message in summary.skipped:
        typer.echo(f"skipped {message}", err=True)
    typer.echo(
        f"normalised {summary.mentions:,} spans ({summary.linked:,} linked"
        + (f", {len(summary.skipped):,} skipped" if summary.skipped else "")
        + f") in {summary.documents:,} "
        f"document(s) -> {output} in {time.perf_counter() - started:.1f}s",
        err=True,
    )


@app.command("normalize-ray")
def normalize_ray_cli(
    index: Path = index_option(),
    input_spec: str = typer.Option(..., "--input", help="A folder, glob or file of .parquet / .jsonl(.gz) shards of spans."),
    output: str = typer.Option(..., "--output", "-o", help=SHARDS_OUTPUT_HELP),
    k: int = typer.Option(1, "--k", "-k", help="Candidates per span."),
    lang: str = lang_option(),
    overwrite: bool = overwrite_option("Replace an output folder that linker wrote."),
    workers: int = workers_option(),
    batch_size: int = typer.Option(BATCH, "--batch-size", help="Spans per link call."),
    address: str = address_option(),
    max_line_bytes: int = max_line_option(),
    max_document_bytes: int = max_document_option(),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    precision: str = precision_option(),
) -> None:
    """Normalise sharded spans on Ray Data (the ray extra): exactly-once and resumable, a local Ray or a cluster."""
    from linker.engine.ray import normalize_ray

    check_ray_job("normalize-ray", input_spec, output, k=k, rerank_k=rerank_k, min_confidence=min_confidence,
                  precision=precision)
    started = time.perf_counter()
    summary = normalize_ray(index, input_spec, output, k=k, lang=lang, overwrite=overwrite, workers=workers,
                            batch_size=batch_size, address=address,
                            limits=read_limits(max_line_bytes, max_document_bytes), rerank=rerank, rerank_k=rerank_k,
                            min_confidence=min_confidence, precision=precision)
    echo_ray_summary("normalised", summary, output, started)
