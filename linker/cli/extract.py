"""`linker extract`: adverse-event, drug and effect spans of texts; `linker annotate`: the same, each adverse event
coded with an index (extract, then link); `linker annotate-ray`: annotate on Ray, shards of documents in, shards of
coded spans out. The linking options and checks are `linker.cli.common`'s, shared with `linker normalize`."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import (
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

_INPUT_HELP = ("A .txt, a .jsonl of documents {\"text\", \"id\"?}, a TAC 2017 / ADE Eval .xml label, or a folder of "
               ".txt (a brat folder) or .xml files.")
_FORMAT_HELP = ("Output: jsonl (a file, one span a line), brat (a folder of .txt/.ann), ade-xml (a folder of labels) "
                "or, for annotate, labels (a file: one row per document, 0/1 per concept of --labels).")
_MODEL_HELP = ("Tagger: auto (each document's by its language, its own lang or --lang or else detected: linker-ae "
               "for English, linker-ae-multi for es, fr, de, nl, ja and the rest), linker-ae, linker-ae-multi, or a "
               "release folder from `linker train extractor`.")
_THRESHOLD_HELP = "In-span probability a word piece needs (default: the tagger's, chosen on dev data)."
# Names that say "a file": a folder format given one would write a folder called c.jsonl.
_FILE_SUFFIXES = (".jsonl", ".json", ".txt", ".ann", ".xml", ".csv", ".tsv", ".gz", ".zip", ".parquet")
_STYLE_HELP = ("AdverseEvent spans as terms (TAC 2017's convention, 'nausea', 'rash': learnt from drug labels), "
               "phrases (PHEE's, 'severe rash and nausea': from case reports) or auto (terms, and phrases where no "
               "term was found).")
_MAX_DOCUMENT_HELP = ("Largest document accepted, in bytes of text (default 5,000,000: what the tagger holds in some "
                      "100 MB); a larger one is refused, naming its file (and line).")
_DB_HELP = ("brat: database name in `Reference T1 DB:ID` (default: each code's source: MedDRA for a MedDRA code, "
            "else the source's name, such as hpo or icd10cm).")
_ASSERTION_HELP = ("Who marks an event negated or hypothetical: rules (the tagger's status, then NegEx-style cues "
                   "for the events it calls positive) or model (the tagger's status alone).")


def model_option():
    return typer.Option("auto", "--model", help=_MODEL_HELP)


def threshold_option():
    return typer.Option(None, "--threshold", help=_THRESHOLD_HELP)


def style_option():
    return typer.Option("auto", "--style", help=_STYLE_HELP)


def assertion_option():
    return typer.Option("rules", "--assertion", help=_ASSERTION_HELP)


def max_text_option():
    return typer.Option(None, "--max-document-bytes", help=_MAX_DOCUMENT_HELP)


def _check_tagger(style: str, assertion: str, threshold: float | None, model: str) -> list[Path]:
    """The tagger's options, its packages (the dense extra) and its release folders (both shipped ones for
    "auto"), before anything loads."""
    from linker.extract.extractor import ASSERTIONS, MODULES, STYLES, release_paths
    from linker.extras import check

    check(MODULES, extra="dense", what="the adverse-event tagger")
    if style not in STYLES:
        raise ConfigError(f"--style: expected {', '.join(STYLES)}, found {style!r}")
    if assertion not in ASSERTIONS:
        raise ConfigError(f"--assertion: expected {', '.join(ASSERTIONS)}, found {assertion!r}")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ConfigError(f"--threshold: expected a probability between 0 and 1, found {threshold}")
    folders = release_paths(model)
    for folder in folders:
        if not (folder / "manifest.json").is_file():
            raise ConfigError(f"--model {model}: no tagger release there (no {folder / 'manifest.json'}); pass auto, "
                              "linker-ae, linker-ae-multi or a folder written by `linker train extractor`")
    return folders


def _check_common(input_path: Path, output: Path, fmt: str, overwrite: bool, threshold: float | None,
                  model: str, extra_inputs: list, style: str, assertion: str) -> None:
    from linker.extract.io import check_format
    from linker.fileio import STDIO, Input, check_inputs, check_output
    from linker.formats.writers import WRITERS

    check_format(fmt)
    folder_format = WRITERS.get(fmt).folder
    if str(input_path) == STDIO:  # the documents are read twice (checked whole before any work), a pipe only once
        raise ConfigError("--input -: extract and annotate read a file or folder, not standard input; save the "
                          "documents to a file (e.g. docs.jsonl) and name it (`linker normalize --format jsonl` reads -)")
    if str(output) == STDIO and fmt != "jsonl":
        raise ConfigError(f"--output -: standard output takes --format jsonl only, found --format {fmt}")
    if folder_format and output.suffix.lower() in _FILE_SUFFIXES and not output.is_dir():
        raise ConfigError(f"--output {output}: --format {fmt} writes a folder, found a file name ending in "
                          f"{output.suffix}; name a folder (such as {output.with_suffix('')}), or pass --format jsonl")
    folders = _check_tagger(style, assertion, threshold, model)
    check_file(input_path, "--input")
    check_inputs(input_path, option="--input")
    inputs = [Input(input_path, "--input"), *(Input(folder, "--model") for folder in folders), *extra_inputs]
    if str(output) != STDIO:
        check_output(output, inputs=inputs, overwrite=overwrite, folder=folder_format)


def _write(docs, output: Path, fmt: str, **options) -> int:
    """`write_output`, or the JSONL lines on standard output for `--output -`."""
    from linker.extract.io import write_output
    from linker.fileio import STDIO

    if str(output) == STDIO:
        import sys

        from linker.extract.io import write_jsonl_lines

        return write_jsonl_lines(docs, sys.stdout)
    return write_output(docs, output, fmt, **options)


def _label_list(fmt: str, labels: Path | None) -> list[str] | None:
    """The concept ids of --labels (`linker.formats.doc_labels.read_label_list`), which goes with --format labels."""
    if (fmt == "labels") != (labels is not None):
        raise ConfigError("--format labels and --labels LIST go together" + (
            f": pass --format labels to write the columns of {labels}" if labels is not None else ""))
    if labels is None:
        return None
    from linker.formats.doc_labels import read_label_list

    check_file(labels, "--labels")
    return read_label_list(labels)


def _read(input_path: Path, fmt: str, max_line_bytes, max_document_bytes):
    """The input's documents, every one read and checked (and let go) before any model loads; streamed after."""
    from linker.extract.io import MAX_TEXT_BYTES, stream_inputs

    limits = read_limits(max_line_bytes, MAX_TEXT_BYTES if max_document_bytes is None else max_document_bytes)
    return stream_inputs(input_path, limits, fmt=fmt)


@app.command("extract")
def extract_cli(
    input_path: Path = typer.Option(..., "--input", help=_INPUT_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Output file (jsonl; - for standard output) or folder (brat, ade-xml)."),
    fmt: str = typer.Option("jsonl", "--format", "-f", help=_FORMAT_HELP),
    model: str = model_option(),
    lang: str = typer.Option(None, "--lang", help="The documents' language (a JSONL document's own lang wins): picks the tagger and the cues; without it each document's is detected."),
    threshold: float = threshold_option(),
    style: str = style_option(),
    assertion: str = assertion_option(),
    overwrite: bool = overwrite_option(),
    max_line_bytes: int = max_line_option(),
    max_document_bytes: int = max_text_option(),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
) -> None:
    """Find adverse events, drugs and therapeutic effects in texts (negated and hypothetical events tagged), each
    document with the tagger and cues of its language."""
    from linker.extract import load_extractor
    from linker.extract.io import tag_documents

    if fmt == "labels":
        raise ConfigError("--format labels writes the codes of each document: run `linker annotate --labels LIST`")
    _check_common(input_path, output, fmt, overwrite, threshold, model, [], style, assertion)
    docs = _read(input_path, fmt, max_line_bytes, max_document_bytes)  # inputs and file names checked before the model
    started = time.perf_counter()
    extractor = load_extractor(model, threads=threads)
    tagged = tag_documents(docs, extractor, threshold=threshold, style=style, assertion=assertion, lang=lang)
    written = _write(tagged, output, fmt)  # read, tagged and written a batch at a time
    typer.echo(f"extracted {written:,} spans from {len(docs):,} document(s) -> {output} in "
               f"{time.perf_counter() - started:.1f}s", err=True)


@app.command("annotate")
def annotate_cli(
    index: Path = index_option("Index folder from `linker index build` (a MedDRA one for ade-xml)."),
    input_path: Path = typer.Option(..., "--input", help=_INPUT_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Output file (jsonl; - for standard output) or folder (brat, ade-xml)."),
    fmt: str = typer.Option("jsonl", "--format", "-f", help=_FORMAT_HELP),
    k: int = typer.Option(1, "--k", "-k", help="Candidates kept per adverse event (jsonl); the code is the best."),
    lang: str = lang_option("The documents' language (a JSONL document's own lang wins): picks the tagger and the cues, and restricts candidates to names in it; without it each document's is detected, for the tagger and cues only."),
    db: str = typer.Option(None, "--db", help=_DB_HELP),
    model: str = model_option(),
    threshold: float = threshold_option(),
    style: str = style_option(),
    assertion: str = assertion_option(),
    review_below: float = typer.Option(0.5, "--review-below", help="Decision 'review' instead of 'auto' when the tagger's confidence in the span is below this (the link's decision comes from the index's calibration)."),
    overwrite: bool = overwrite_option(),
    max_line_bytes: int = max_line_option(),
    max_document_bytes: int = max_text_option(),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
    min_score: float = min_score_option(),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads."),
    labels: Path = typer.Option(None, "--labels", help="--format labels: a file of concept ids (one a line, optionally a tab and a name): the columns."),
) -> None:
    """Extract adverse events and code each with the index: code, confidence, and the decision (auto, review,
    no link, or not coded for a negated / hypothetical event)."""
    from linker.extract import load_extractor
    from linker.extract.io import tag_documents
    from linker.link import Linker

    check_linker_options(k=k, rerank_k=rerank_k, min_confidence=min_confidence, min_score=min_score)
    if not 0.0 <= review_below <= 1.0:
        raise ConfigError(f"--review-below: expected a probability from 0 to 1, found {review_below}")
    check_coded_output(fmt, k, db)
    from linker.fileio import Input

    label_list = _label_list(fmt, labels)
    extra = [*option_inputs(index, rerank), *([Input(labels, "--labels")] if labels is not None else [])]
    _check_common(input_path, output, fmt, overwrite, threshold, model, extra, style, assertion)
    check_index(index, rerank)
    docs = _read(input_path, fmt, max_line_bytes, max_document_bytes)
    started = time.perf_counter()
    linker = Linker.load(index, rerank=rerank, rerank_k=rerank_k, min_confidence=min_confidence, min_score=min_score)
    if fmt == "ade-xml":
        from linker.normalize import require_meddra

        require_meddra(linker)  # ade-xml writes meddra_pt_id: a MedDRA index only, as `linker normalize` requires
    extractor = load_extractor(model, threads=threads)
    from linker.extract import DECISIONS as annotate_decisions

    counts = dict.fromkeys(annotate_decisions, 0)

    def counted(annotated):
        for doc in annotated:
            for row in (row for rows in doc.spans for row in rows):
                if row["decision"] in counts:
                    counts[row["decision"]] += 1
            yield doc

    annotated = tag_documents(docs, extractor, threshold=threshold, style=style, assertion=assertion, linker=linker,
                              k=k, lang=lang, review_below=review_below)
    written = _write(counted(annotated), output, fmt, db=db, coded=True, labels=label_list)
    typer.echo(f"annotated {written:,} spans from {len(docs):,} document(s) ("
               + ", ".join(f"{n:,} {name}" for name, n in counts.items())
               + f" adverse events) -> {output} in {time.perf_counter() - started:.1f}s", err=True)


@app.command("annotate-ray")
def annotate_ray_cli(
    index: Path = index_option(),
    input_spec: str = typer.Option(..., "--input", help="A folder, glob or file of .parquet / .jsonl(.gz) shards of "
                                   "documents {\"text\", \"id\"?, \"lang\"?}."),
    output: str = typer.Option(..., "--output", "-o", help=SHARDS_OUTPUT_HELP),
    lang: str = lang_option("Restrict candidates to names in this language (a document's own lang wins)."),
    model: str = model_option(),
    threshold: float = threshold_option(),
    style: str = style_option(),
    assertion: str = assertion_option(),
    overwrite: bool = overwrite_option("Replace an output folder that linker wrote."),
    workers: int = workers_option(),
    batch_size: int = typer.Option(64, "--batch-size", help="Documents per extract-and-link call."),
    address: str = address_option(),
    max_line_bytes: int = max_line_option(),
    max_document_bytes: int = max_document_option(),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    min_confidence: float = min_confidence_option(),
) -> None:
    """Annotate sharded documents on Ray (the ray extra): one row per span with its code and decision, as
    `linker annotate` writes them; exactly-once and resumable, a local Ray or a cluster."""
    from linker.engine.ray import annotate_ray

    check_ray_job("annotate-ray", input_spec, output, rerank_k=rerank_k, min_confidence=min_confidence)
    _check_tagger(style, assertion, threshold, model)
    started = time.perf_counter()
    summary = annotate_ray(index, input_spec, output, model=model, style=style, assertion=assertion,
                           threshold=threshold, lang=lang, overwrite=overwrite, workers=workers, batch_size=batch_size,
                           address=address, limits=read_limits(max_line_bytes, max_document_bytes), rerank=rerank,
                           rerank_k=rerank_k, min_confidence=min_confidence)
    echo_ray_summary("annotated", summary, output, started)
