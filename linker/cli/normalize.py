"""`linker normalize`: link every span of a JSONL, brat or ADE-Eval/TAC-2017 XML input."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from linker.cli.common import (
    LENIENT_HELP, MAX_DOCUMENT_HELP, MAX_LINE_HELP, QUERY_PRECISION_HELP, min_confidence_option, read_limits,
    rerank_k_option, rerank_option,
)
from linker.cli.main import app
from linker.errors import ConfigError
from linker.link import Linker
from linker.normalize import FORMATS, check_paths, normalize_jsonl_stream, normalize_path


@app.command("normalize")
def normalize_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Index folder from `linker index build`."),
    input_path: str = typer.Option(..., "--input", help="Input file or folder; `-` = stdin (jsonl only)."),
    fmt: str = typer.Option(..., "--format", "-f", help=f"Input format: {', '.join(FORMATS)}."),
    output: str = typer.Option(..., "--output", "-o", help="Output file or folder (mirrors the input); `-` = stdout (jsonl only)."),
    k: int = typer.Option(1, "--k", "-k", help="Candidates per span (jsonl); brat and ade-xml write the best one."),
    lang: str = typer.Option(None, "--lang", help="Restrict candidates to names in this language (a JSONL span's own lang wins)."),
    db: str = typer.Option(None, "--db", help="brat: database name in `Reference T1 DB:ID` (default: the concept's source)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output file, or an output folder that linker wrote."),
    expand_abbreviations: bool = typer.Option(
        False, "--expand-abbreviations",
        help="brat, ade-xml: link an abbreviation defined in its document ('... syndrome (NMS)') as the long form."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    max_document_bytes: int = typer.Option(None, "--max-document-bytes", help=MAX_DOCUMENT_HELP),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    precision: str = typer.Option(None, "--precision", help=QUERY_PRECISION_HELP),
) -> None:
    """Normalise predicted spans: add ranked concepts (jsonl), brat normalisation lines, or TAC/ADE-Eval Reactions."""
    if (input_path == "-" or output == "-") and fmt != "jsonl":
        raise ConfigError(f"`-` (stdin/stdout) works with --format jsonl only, found --format {fmt}")
    limits = read_limits(max_line_bytes, max_document_bytes)
    check_paths(input_path, output, fmt=fmt, overwrite=overwrite)  # before the index is loaded
    started = time.perf_counter()
    linker = Linker.load(index, rerank=rerank, rerank_k=rerank_k, min_confidence=min_confidence, precision=precision)
    if input_path == "-" or output == "-":
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
