"""`linker extract`: adverse-event, drug and effect spans of texts; `linker annotate`: the same, each adverse event
coded with an index (extract, then link)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from linker.cli.common import (
    MAX_DOCUMENT_HELP,
    MAX_LINE_HELP,
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

_INPUT_HELP = ("A .txt, a .jsonl of documents {\"text\", \"id\"?}, a TAC 2017 / ADE Eval .xml label, or a folder of "
               ".txt (a brat folder) or .xml files.")
_FORMAT_HELP = "Output: jsonl (a file, one span a line), brat (a folder of .txt/.ann) or ade-xml (a folder of labels)."
_MODEL_HELP = "Tagger: the shipped linker-ae, or a release folder from `linker train extractor`."
_THRESHOLD_HELP = "In-span probability a word piece needs (default: the tagger's, chosen on dev data)."
_OUTPUT_FORMATS = ("brat", "jsonl", "ade-xml")
_STYLE_HELP = ("AdverseEvent spans as terms (TAC 2017's convention, 'nausea', 'rash': learnt from drug labels), "
               "phrases (PHEE's, 'severe rash and nausea': from case reports) or auto (terms, and phrases where no "
               "term was found).")


def _check_style(style: str) -> None:
    if style not in ("auto", "terms", "phrases"):
        raise ConfigError(f"--style: expected auto, terms or phrases, found {style!r}")


def _check_common(input_path: Path, output: Path, fmt: str, overwrite: bool, threshold: float | None,
                  model: str, extra_inputs: list) -> None:
    from linker.extract.extractor import release_path
    from linker.fileio import Input, check_inputs, check_output

    if fmt not in _OUTPUT_FORMATS:
        raise ConfigError(f"--format: expected one of {', '.join(_OUTPUT_FORMATS)}, found {fmt!r}")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ConfigError(f"--threshold: expected a probability between 0 and 1, found {threshold}")
    check_file(input_path, "--input")
    check_inputs(input_path, option="--input")
    folder = release_path(model)
    if not (folder / "manifest.json").is_file():
        raise ConfigError(f"--model {model}: no tagger release there (no {folder / 'manifest.json'}); pass linker-ae "
                          "or a folder written by `linker train extractor`")
    inputs = [Input(input_path, "--input"), Input(folder, "--model"), *extra_inputs]
    check_output(output, inputs=inputs, overwrite=overwrite, folder=fmt != "jsonl")


def _read(input_path: Path, max_line_bytes, max_document_bytes):
    from linker.extract.io import read_inputs

    return read_inputs(input_path, read_limits(max_line_bytes, max_document_bytes))


@app.command("extract")
def extract_cli(
    input_path: Path = typer.Option(..., "--input", help=_INPUT_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Output file (jsonl) or folder (brat, ade-xml)."),
    fmt: str = typer.Option("jsonl", "--format", "-f", help=_FORMAT_HELP),
    model: str = typer.Option("linker-ae", "--model", help=_MODEL_HELP),
    threshold: float = typer.Option(None, "--threshold", help=_THRESHOLD_HELP),
    style: str = typer.Option("auto", "--style", help=_STYLE_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output file, or an output folder that linker wrote."),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    max_document_bytes: int = typer.Option(None, "--max-document-bytes", help=MAX_DOCUMENT_HELP),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
) -> None:
    """Find adverse events, drugs and therapeutic effects in texts (negated and hypothetical events tagged)."""
    from linker.extract.io import write_output

    _check_style(style)
    _check_common(input_path, output, fmt, overwrite, threshold, model, [])
    docs = _read(input_path, max_line_bytes, max_document_bytes)  # every input checked before the model loads
    started = time.perf_counter()
    from linker.extract import load_extractor

    extractor = load_extractor(model, threads=threads)
    for doc in docs:
        doc.spans = extractor.extract([text for _, text in doc.sections], threshold=threshold, style=style)
    written = write_output(docs, output, fmt)
    typer.echo(f"extracted {written:,} spans from {len(docs):,} document(s) -> {output} in "
               f"{time.perf_counter() - started:.1f}s", err=True)


@app.command("annotate")
def annotate_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Index folder from `linker index build` (a MedDRA one for ade-xml)."),
    input_path: Path = typer.Option(..., "--input", help=_INPUT_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Output file (jsonl) or folder (brat, ade-xml)."),
    fmt: str = typer.Option("jsonl", "--format", "-f", help=_FORMAT_HELP),
    k: int = typer.Option(1, "--k", "-k", help="Candidates kept per adverse event (jsonl); the code is the best."),
    lang: str = typer.Option(None, "--lang", help="Restrict candidates to names in this language."),
    db: str = typer.Option("MedDRA", "--db", help="brat: database name in `Reference T1 DB:ID`."),
    model: str = typer.Option("linker-ae", "--model", help=_MODEL_HELP),
    threshold: float = typer.Option(None, "--threshold", help=_THRESHOLD_HELP),
    style: str = typer.Option("auto", "--style", help=_STYLE_HELP),
    review_below: float = typer.Option(0.5, "--review-below", help="Decision 'review' when the span's or the link's confidence is below this."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output file, or an output folder that linker wrote."),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    max_document_bytes: int = typer.Option(None, "--max-document-bytes", help=MAX_DOCUMENT_HELP),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
) -> None:
    """Extract adverse events and code each with the index: code, confidence, and the decision (coded, review,
    no link, or not coded for a negated / hypothetical event)."""
    from linker.extract import annotate_spans, load_extractor
    from linker.extract.io import write_output
    from linker.formats import check_identifier
    from linker.link import Linker

    check_linker_options(k=k, rerank_k=rerank_k, min_confidence=min_confidence)
    if not 0.0 <= review_below <= 1.0:
        raise ConfigError(f"--review-below: expected a probability from 0 to 1, found {review_below}")
    if fmt != "jsonl" and k != 1:
        raise ConfigError(f"--format {fmt} writes the best concept of each span; use --k 1 (found --k {k})")
    check_identifier(db, "--db", forbid=":")
    _check_style(style)
    _check_common(input_path, output, fmt, overwrite, threshold, model, option_inputs(index, rerank))
    check_index(index, rerank)
    docs = _read(input_path, max_line_bytes, max_document_bytes)
    started = time.perf_counter()
    linker = Linker.load(index, rerank=rerank, rerank_k=rerank_k, min_confidence=min_confidence)
    if fmt == "ade-xml":
        from linker.normalize import _check_meddra

        _check_meddra(linker)  # ade-xml writes meddra_pt_id: a MedDRA index only, as `linker normalize` requires
    extractor = load_extractor(model, threads=threads)
    counts = dict.fromkeys(("coded", "review", "no link", "not coded"), 0)
    for doc in docs:
        texts = [text for _, text in doc.sections]
        doc.spans = annotate_spans(linker, texts, extractor.extract(texts, threshold=threshold, style=style), k=k,
                                   lang=lang,
                                   review_below=review_below)
        for rows in doc.spans:
            for row in rows:
                if row["decision"] in counts:
                    counts[row["decision"]] += 1
    written = write_output(docs, output, fmt, db=db, coded=True)
    typer.echo(f"annotated {written:,} spans from {len(docs):,} document(s) ("
               + ", ".join(f"{n:,} {name}" for name, n in counts.items())
               + f" adverse events) -> {output} in {time.perf_counter() - started:.1f}s", err=True)
