"""Helpers shared by CLI modules: option parsing and output."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer


QUERY_PRECISION_HELP = ("How a dense index encodes mentions: auto, fp32, bf16 or int8 "
                        "(default: the precision its names were encoded in).")


def split_csv(values: list[str] | None) -> tuple[str, ...]:
    """Accept both `--lang en --lang es` and `--lang en,es`."""
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return tuple(out)


# --- checks before any work: an index or a model takes seconds to load, a wrong option should not wait for it


def check_linker_options(*, k: int | None = None, rerank_k: int | None = None, min_confidence: float | None = None,
                         precision: str | None = None, min_score: float | None = None) -> None:
    """The options of link, normalize, serve, eval and calibrate, checked before anything is loaded."""
    from linker.errors import ConfigError
    from linker.precision import check_precision

    if k is not None and k < 1:
        raise ConfigError(f"--k: expected an integer >= 1, found {k}")
    if rerank_k is not None and rerank_k < 1:
        raise ConfigError(f"--rerank-k: expected an integer >= 1, found {rerank_k}")
    if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
        raise ConfigError(f"--min-confidence: expected a probability from 0 to 1, found {min_confidence}")
    if min_score is not None and not -1.0 <= min_score <= 1.0:
        raise ConfigError(f"--min-score: expected a score from -1 to 1 (a cosine), found {min_score}")
    check_precision(precision)


DENSE_MODULES = ("torch", "sentence_transformers", "faiss")


def check_index(index: Path, rerank: str | None = None) -> dict:
    """The index folder's manifest, read (cheap) before the index is loaded (seconds): a missing folder, a concept
    table given as an index, or a dense index without the `dense` extra is one line at once. Its manifest."""
    from linker.extras import check
    from linker.index.manifest import read_manifest

    manifest = read_manifest(index)
    kind = manifest.get("kind")
    if kind in ("dense", "hybrid"):
        check(DENSE_MODULES, extra="dense", what=f"{index} (a {kind} index)")
    if rerank is not None and rerank != "none":
        check(("torch", "transformers"), extra="dense", what="--rerank (a cross-encoder)")
    return manifest


def check_datasets(specs, option: str = "--dataset") -> None:
    """Each dataset spec (FORMAT:PATH[#OPTIONS]) parses and names a file or folder that exists, before the index
    loads; the same message as when the dataset is read."""
    from linker.errors import MissingInputError
    from linker.datasets import parse_spec

    for spec in specs:
        parsed = parse_spec(spec)
        if not parsed.path.exists():
            raise MissingInputError(f"{parsed.path}: no such file or folder (dataset {spec})")


def check_file(path: str | Path | None, option: str) -> None:
    """An input file or folder an option names exists (None: not given; `-`: stdin)."""
    from linker.errors import MissingInputError

    from linker.fileio import STDIO

    if path is not None and str(path) != STDIO and not os.path.lexists(path):
        raise MissingInputError(f"{path}: no such file or folder ({option})")


def echo_json(obj) -> None:
    typer.echo(json.dumps(obj, ensure_ascii=False, indent=2, default=str))


def option_inputs(index: Path | None = None, rerank: str | None = None, encoder: str | None = None) -> list:
    """The folders the --index, --rerank and --encoder options name, as inputs that no output may touch
    (`linker.fileio.check_output`); a hub name or alias names none."""
    from linker.fileio import Input, model_inputs

    return [*([Input(Path(index), "--index")] if index is not None else []), *model_inputs(rerank, "--rerank"),
            *model_inputs(encoder, "--encoder")]


def read_limits(max_line_bytes: int | None, max_document_bytes: int | None):
    """`ReadLimits` from the --max-line-bytes / --max-document-bytes options (None = the default)."""
    from linker.formats import ReadLimits

    given = {"max_line_bytes": max_line_bytes, "max_document_bytes": max_document_bytes}
    return ReadLimits(**{name: value for name, value in given.items() if value is not None})


MAX_LINE_HELP = "Longest input line accepted, in bytes (default 1 MiB); a longer line is an error, never read whole."
MAX_DOCUMENT_HELP = ("Largest brat .ann/.txt or XML document (normalize-ray: Parquet row group or batch of spans) "
                     "accepted, in bytes (default 64 MiB).")
LENIENT_HELP = "brat: skip (and report) annotations whose offsets or text do not match the .txt, instead of failing."


# Options shared by link, normalize, serve and eval (one definition, one help text).
RERANK_HELP = "Re-ranker folder (`linker train rerank`) or hub name; default: the index's bound one; 'none' = off."
RERANK_K_HELP = ("Retrieved concepts the re-ranker re-scores per mention, at least: k when larger, and 5 with a "
                 "calibration that reads the margin (default: as the index was calibrated, else 32).")
MIN_CONFIDENCE_HELP = "'No link' when the best candidate's calibrated confidence is below this (needs `linker calibrate`)."


def rerank_option():
    return typer.Option(None, "--rerank", help=RERANK_HELP)


def rerank_k_option():
    return typer.Option(None, "--rerank-k", help=RERANK_K_HELP)


def min_confidence_option():
    return typer.Option(None, "--min-confidence", help=MIN_CONFIDENCE_HELP)


MIN_SCORE_HELP = ("'No link' when the best candidate's score is below this: for an index without calibration; its "
                  "scale is the index's (a cosine, 1 for an exact name), so choose it on your development data.")


def min_score_option():
    return typer.Option(None, "--min-score", help=MIN_SCORE_HELP)


# --- options and checks of every command that links spans: normalize, normalize-ray, annotate, annotate-ray

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


def workers_option():
    return typer.Option(2, "--workers", help="Ray actors, each loading the index (and tagger) once.")


def address_option():
    return typer.Option(None, "--address", help="An existing Ray cluster (`auto`, host:port); default: start a local Ray.")


def check_coded_output(fmt: str, k: int, db: str | None) -> None:
    """brat and ade-xml write one concept per span; a brat database name is an identifier without ':'."""
    from linker.errors import ConfigError
    from linker.formats import check_identifier

    if fmt in ("brat", "ade-xml") and k != 1:
        raise ConfigError(f"--format {fmt} writes the best concept of each span; use --k 1 (found --k {k})")
    if db is not None:  # checked where it enters, so a bad value is refused before any work, naming the option
        check_identifier(db, "--db", forbid=":")


def check_ray_job(command: str, input_spec: str, output: str, **linker_options) -> None:
    """The checks of a Ray command before any work: the linking options, no stdin/stdout, Ray installed."""
    from linker.engine.ray import import_ray
    from linker.errors import ConfigError

    check_linker_options(**linker_options)
    from linker.fileio import STDIO

    if STDIO in (input_spec, output):
        raise ConfigError(f"{command} reads Parquet and JSONL shards into Parquet shards; `-` (stdin/stdout) works "
                          "with `linker normalize --format jsonl`, and `-` for stdout with `extract` and `annotate`")
    import_ray()  # a missing Ray is one line before any work


def echo_ray_summary(verb: str, summary, output: str, started: float) -> None:
    m = summary.manifest
    typer.echo(
        f"{verb} {m['spans']:,} spans ({m['linked']:,} linked, {m['nil']:,} no link) in {m['shards']:,} shard(s), "
        f"{summary.linked_now:,} done now, {m['shards'] - summary.linked_now:,} done before -> {output} "
        f"in {time.perf_counter() - started:.1f}s",
        err=True,
    )
