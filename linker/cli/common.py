"""Helpers shared by CLI modules: option parsing and output."""

from __future__ import annotations

import json
import os
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
                         precision: str | None = None) -> None:
    """The options of link, normalize, serve, eval and calibrate, checked before anything is loaded."""
    from linker.errors import ConfigError
    from linker.precision import check_precision

    if k is not None and k < 1:
        raise ConfigError(f"--k: expected an integer >= 1, found {k}")
    if rerank_k is not None and rerank_k < 1:
        raise ConfigError(f"--rerank-k: expected an integer >= 1, found {rerank_k}")
    if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
        raise ConfigError(f"--min-confidence: expected a probability from 0 to 1, found {min_confidence}")
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
    from linker.eval.datasets import parse_spec

    for spec in specs:
        parsed = parse_spec(spec)
        if not parsed.path.exists():
            raise MissingInputError(f"{parsed.path}: no such file or folder (dataset {spec})")


def check_file(path: str | Path | None, option: str) -> None:
    """An input file or folder an option names exists (None: not given; `-`: stdin)."""
    from linker.errors import MissingInputError

    if path is not None and str(path) != "-" and not os.path.lexists(path):
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
RERANK_K_HELP = "Retrieved concepts the re-ranker re-scores per mention."
MIN_CONFIDENCE_HELP = "'No link' when the best candidate's calibrated confidence is below this (needs `linker calibrate`)."


def rerank_option():
    return typer.Option(None, "--rerank", help=RERANK_HELP)


def rerank_k_option():
    from linker.rerank import DEFAULT_RERANK_K

    return typer.Option(DEFAULT_RERANK_K, "--rerank-k", help=RERANK_K_HELP)


def min_confidence_option():
    return typer.Option(None, "--min-confidence", help=MIN_CONFIDENCE_HELP)
