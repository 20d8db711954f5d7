"""`linker normalize`: link every span of a JSONL, brat or ADE-Eval/TAC-2017 XML input; `linker normalize-ray`: the
same for Parquet / JSONL shards on Ray Data. The options and checks every command that links shares (`annotate`,
`annotate-ray` in `linker.cli.extract`) are here, declared once."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from linker.cli.common import (
    LENIENT_HELP,
    MAX_DOCUMENT_HELP,
    MAX_LINE_HELP,
    QUERY_PRECISION_HELP,
    check_file,
    check_index,
    check_linker_options,
    min_confidence_option,
    option_inputs,
    read_limits,
    rerank_k_option,
    rerank_option,
)
from linker.cli.main import app
from linker.errors import ConfigError
from linker.formats import check_identifier
from linker.link import Linker
from linker.normalize import (
    BATCH,
    FORMATS,
    check_paths,
    normalize_jsonl_stream,
    normalize_path,
)

OVERWRITE_HELP = "Replace an existing output file, or an output folder that linker wrote."
SHARDS_OUTPUT_HELP = "Output folder: one Parquet shard per input shard, then _SUCCESS."


def index_option(help: str = "Index folder from `linker index build`."):
    return typer.Option(..., "--index", "-i", help=help)


def lang_option(help: str = "Restrict candidates to names in this language (a span's own lang wins)."):
    return typer.Option(None, "--lang", help=help)


def overwrite_option(help: str = OVERWRITE_HELP):
    return typer.Option(False, "--overwrite", help=help)


def max_line_option():
    return typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP)


def max_document_option():
    return typer.Option(None, "--max-document-bytes", help=MAX_DOCUMENT_HELP)


def precision_option():
    return typer.Option(None, "--precision", help=QUERY_PRECISION_HELP)


def workers_option():
    return typer.Option(2, "--workers", help="Ray actors, each loading the index (and tagger) once.")


def address_option():
    return typer.Option(None, "--address", help="An existing Ray cluster (`auto`, host:port); default: start a local Ray.")


def check_coded_output(fmt: str, k: int, db: str | None) -> None:
    """brat and ade-xml write one concept per span; a brat database name is an identifier without ':'."""
    if fmt in ("brat", "ade-xml") and k != 1:
        raise ConfigError(f"--format {fmt} writes the best concept of each span; use --k 1 (found --k {k})")
    if db is not None:  # checked where it enters, so a bad value is refused before any work, naming the option
        check_identifier(db, "--db", forbid=":")


def check_ray_job(command: str, input_spec: str, output: str, **linker_options) -> None:
    """The checks of a Ray command before any work: the linking options, no stdin/stdout, Ray installed."""
    from linker.engine.ray import import_ray

    check_linker_options(**linker_options)
    if "-" in (input_spec, output):
        raise ConfigError(f"{command} reads Parquet and JSONL shards into Parquet shards; `-` (stdin/stdout) works "
                          "with `linker normalize --format jsonl` only")
    import_ray()  # a missing Ray is one line before any work


def echo_ray_summary(verb: str, summary, output: str, started: float) -> None:
    m = summary.manifest
    typer.echo(
        f"{verb} {m['spans']:,} spans ({m['linked']:,} linked, {m['nil']:,} no link) in {m['shards']:,} shard(s), "
        f"{summary.linked_now:,} done now, {m['shards'] - summary.linked_now:,} done before -> {output} "
        f"in {time.perf_counter() - started:.1f}s",
        err=True,
    )


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
    precision: str = precision_option(),
    engine: str = typer.Option(None, "--engine", hidden=True, help="Moved: `linker normalize-ray`."),
) -> None:
    """Normalise predicted spans: add ranked concepts (jsonl), brat normalisation lines, or TAC/ADE-Eval Reactions."""
    if engine is not None:
        raise ConfigError(f"--engine {engine} is gone: `linker normalize` links here; on Ray: linker normalize-ray "
                          "--index FOLDER --input SHARDS --output FOLDER")
    # Options, paths and the index folder's manifest are checked before the index loads (seconds).
    check_linker_options(k=k, rerank_k=rerank_k, min_confidence=min_confidence, precision=precision)
    if fmt is None:
        raise ConfigError(f"--format is required: one of {', '.join(FORMATS)}")
    FORMATS.get(fmt)  # an unknown format names the known ones, before any work
    check_coded_output(fmt, k, db)
    if expand_abbreviations and fmt == "jsonl":
        raise ConfigError("--expand-abbreviations needs the documents: use --format brat or ade-xml")
    if (input_path == "-" or output == "-") and fmt != "jsonl":
        raise ConfigError(f"`-` (stdin/stdout) works with --format jsonl only, found --format {fmt}")
    limits = read_limits(max_line_bytes, max_document_bytes)
    # before the index is loaded: the index and model folders are inputs too
    check_file(input_path, "--input")
    check_paths(input_path, output, fmt=fmt, overwrite=overwrite, inputs=option_inputs(index, rerank))
    check_index(index, rerank)
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
