"""`linker eval`: Acc@k of an index on a test set, Full / Filtered / Filtered0.2, with a report (or ADE-Eval
measures of submission labels); `linker capabilities`: the capability suite of one or more indexes side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import (
    LENIENT_HELP, MAX_DOCUMENT_HELP, MAX_LINE_HELP, QUERY_PRECISION_HELP, check_datasets, check_file, check_index,
    check_linker_options, read_limits, rerank_k_option, rerank_option, split_csv,
)
from linker.errors import ConfigError
from linker.eval.capabilities import DEFAULT_SAMPLE, DEFAULT_SEED, capability_table, evaluate_capabilities
from linker.eval.report import evaluate, markdown_table, trust_markdown


@app.command("eval")
def eval_cli(
    index: list[Path] = typer.Option(None, "--index", "-i",
                                     help="Index folder from `linker index build`."),
    dataset: str = typer.Option(None, "--dataset", "-d",
                                help="Test set FORMAT:PATH, optionally #OPTIONS (#lang=es, #P); FORMAT: pubtator, brat, codiesp, biosyn, tsv, query."),
    train: list[str] = typer.Option(None, "--train", help="Training set spec(s), the reference of the train filters."),
    filter_: list[str] = typer.Option(["full"], "--filter", "-f",
                                      help="full, dict, dict0.2, train, train0.2 or all (repeat or comma-separate)."),
    k: str = typer.Option("1,5", "--k", help="Cut-offs for Acc@k, comma-separated."),
    report: Path = typer.Option(None, "--report", help="Write the report to PATH.md, PATH.json and PATH.png (e.g. eval/ncbi)."),
    mode: str = typer.Option("faithful", "--mode", help="Filter normalisation: faithful (lower/strip) or biosyn."),
    abbreviations: Path = typer.Option(None, "--abbreviations", help="biosyn mode: 'short<TAB>long' table to expand."),
    composite: str = typer.Option("all", "--composite", help="Composite mentions right when all parts (all) or any part (any) is found; several comma-separated (all,any) are scored from one linking pass."),
    gold_via_xref: str = typer.Option(None, "--gold-via-xref",
                                      help="Map predicted ids through this xref prefix (UMLS) before comparing with gold."),
    query_lang: bool = typer.Option(False, "--query-lang", help="Restrict candidates to names in each mention's language."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    nil_fraction: float = typer.Option(0.0, "--nil-fraction", help="Remove this share of the gold concepts from the dictionary and score 'no link' answers (needs `linker calibrate`)."),
    min_confidence: float = typer.Option(0.5, "--min-confidence", help="With --nil-fraction: 'no link' below this calibrated confidence."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing report files."),
    suite: str = typer.Option(None, "--suite", hidden=True, help="Moved: `linker capabilities`."),
    precision: str = typer.Option(None, "--precision", help=QUERY_PRECISION_HELP),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    max_document_bytes: int = typer.Option(None, "--max-document-bytes", help=MAX_DOCUMENT_HELP),
    submission: Path = typer.Option(None, "--submission", help="ADE Eval: submission labels (a TAC/ADE XML file or folder) scored against --dataset ade-xml:GOLD with the ADE-Eval measures; or a document-labels file (`annotate --format labels`) against --dataset doc-labels:GOLD. No --index."),
    missing: str = typer.Option("error", "--missing", help="--submission: a gold label without a submission is an error, skipped (skip) or scored as empty (empty)."),
) -> None:
    """Score an index on a test set, or score ADE-Eval submissions; prints the table (and writes a report with --report)."""
    if suite is not None:
        raise ConfigError(f"--suite {suite} is now its own command: linker capabilities --index FOLDER [--index ...]")
    if submission is not None and dataset is not None and dataset.startswith("doc-labels:"):
        _score_doc_labels(dataset, submission, index=index, report=report, overwrite=overwrite)
        return
    if submission is not None:
        _score_ade(dataset, submission, index=index, missing=missing, report=report, overwrite=overwrite,
                   limits=read_limits(max_line_bytes, max_document_bytes))
        return
    if not index:
        raise ConfigError("linker eval needs --index FOLDER (or --submission to score ADE-Eval labels)")
    # Options, dataset paths and the index folders' manifests are checked before an index loads (seconds).
    check_linker_options(rerank_k=rerank_k, min_confidence=min_confidence, precision=precision)
    if dataset is None:
        raise ConfigError("linker eval needs --dataset FORMAT:PATH (the capability suite: linker capabilities)")
    if len(index) != 1:
        raise ConfigError(f"--dataset scores one index at a time, found {len(index)} --index options")
    index = index[0]
    try:
        ks = tuple(int(x) for x in split_csv([k]))
    except ValueError:
        raise ConfigError(f"--k takes comma-separated integers, found {k!r}") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k: expected comma-separated integers >= 1, found {k!r}")
    if not 0.0 <= nil_fraction < 1.0:
        raise ConfigError(f"--nil-fraction is a share of the gold concepts from 0 to 1, found {nil_fraction}")
    check_datasets([dataset, *(train or ())])
    check_file(abbreviations, "--abbreviations")
    check_index(index, rerank)
    result = evaluate(
        index, dataset, train_spec=tuple(train or ()), filters=split_csv(filter_), ks=ks,
        report_dir=None if report is None else report.parent, name=None if report is None else report.name, mode=mode, composite=split_csv([composite]),
        gold_via_xref=gold_via_xref, query_lang=query_lang, abbreviations=abbreviations, lenient=lenient,
        rerank=rerank, rerank_k=rerank_k, nil_fraction=nil_fraction, min_confidence=min_confidence,
        overwrite=overwrite,
        precision=precision, limits=read_limits(max_line_bytes, max_document_bytes),
    )
    typer.echo(markdown_table([(Path(dataset.split(":", 1)[-1].split("#")[0]).name, result)], intervals=True))
    for line in trust_markdown(result):
        if line:
            typer.echo(line)
    typer.echo(f"{100 * result.reachable:.2f}% of mentions have a gold id in the dictionary; "
               f"{result.seconds['total']:.1f}s" + (f"; report: {', '.join(result.files)}" if result.files else ""))


@app.command("capabilities")
def capabilities_cli(
    index: list[Path] = typer.Option(..., "--index", "-i",
                                     help="Index folder from `linker index build` (repeat to compare side by side)."),
    dict_sample: int = typer.Option(DEFAULT_SAMPLE, "--dict-sample", help="Concepts drawn per capability."),
    seed: int = typer.Option(DEFAULT_SEED, "--seed", help="Seed of the case generator."),
    templates: list[Path] = typer.Option(None, "--templates", help="Your own templates (kind, capability, lang, template TSV)."),
    hierarchy: Path = typer.Option(None, "--hierarchy", help="OBO file whose is_a lines give the DIR cases."),
    report: Path = typer.Option(None, "--report", help="Write the report to PATH.md, PATH.json and PATH.png."),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing report files."),
) -> None:
    """CheckList-style capability suite: INV/MFT/DIR cases generated from each index's concept table, failure rates side by side."""
    check_linker_options(rerank_k=rerank_k)
    for path in templates or ():
        check_file(path, "--templates")
    check_file(hierarchy, "--hierarchy")
    for folder in index:
        check_index(folder, rerank)
    reports = evaluate_capabilities(index, sample=dict_sample, seed=seed, templates=tuple(templates or ()),
                                    hierarchy=hierarchy, report_dir=None if report is None else report.parent,
                                    name=None if report is None else report.name, rerank=rerank, rerank_k=rerank_k,
                                    overwrite=overwrite)
    typer.echo(capability_table(reports))
    if report is not None:
        # The chart is left out when it could not be drawn (a warning said so); the tables always are written.
        written = [f"{report}.{ext}" for ext in ("md", "json", "png") if Path(f"{report}.{ext}").is_file()]
        typer.echo(f"report: {', '.join(written)}")


def _score_doc_labels(dataset: str, submission: Path, *, index, report: Path | None, overwrite: bool) -> None:
    """`linker eval --dataset doc-labels:GOLD --submission SUB`: the document-label measures
    (`linker.formats.doc_labels.score_doc_labels`): exact-match accuracy, per-label P/R/F1, micro and macro F1."""
    import json

    from linker.fileio import Input, atomic_file, check_output
    from linker.formats.doc_labels import read_doc_labels, score_doc_labels

    if index:
        raise ConfigError("--submission scores labels against gold labels; it takes no --index")
    gold = Path(dataset.split(":", 1)[1])
    for path, option in ((gold, "--dataset"), (submission, "--submission")):
        if not path.is_file():
            raise ConfigError(f"{option} {path}: expected a document-labels file (doc<TAB>label...), found no such file")
    outputs = {ext: Path(f"{report}.{ext}") for ext in ("md", "json")} if report is not None else {}
    for path in outputs.values():
        check_output(path, inputs=[Input(gold, "--dataset"), Input(submission, "--submission")], overwrite=overwrite,
                     option="--report")
    result = score_doc_labels(read_doc_labels(gold), read_doc_labels(submission), where=str(submission))
    m = result["micro"]
    lines = ["| measure | value |", "|---|---|", f"| documents | {result['documents']:,} |",
             f"| labels | {result['labels']:,} |", f"| exact-match accuracy | {result['exact_match_accuracy']:.2f} |",
             f"| micro P / R / F1 | {m['precision']:.2f} / {m['recall']:.2f} / {m['f1']:.2f} |",
             f"| macro F1 | {result['macro_f1']:.2f} |", "", "| label | support | P | R | F1 |", "|---|---|---|---|---|",
             *(f"| {label} | {v['support']:,} | {v['precision']:.2f} | {v['recall']:.2f} | {v['f1']:.2f} |"
               for label, v in result["per_label"].items())]
    text = "\n".join(lines) + "\n"
    typer.echo(text, nl=False)
    if outputs:
        with atomic_file(outputs["json"]) as tmp:
            tmp.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        with atomic_file(outputs["md"]) as tmp:
            tmp.write_text(f"# Document labels: {submission.name} against {gold.name}\n\n{text}", encoding="utf-8")
        typer.echo(f"report: {outputs['md']}, {outputs['json']}")


def _score_ade(dataset: str | None, submission: Path, *, index, missing: str, report: Path | None, overwrite: bool,
               limits) -> None:
    """`linker eval --dataset ade-xml:GOLD --submission SUB`: the ADE-Eval measures (`linker.eval.ade_eval`) of
    submission labels against gold labels, a file against a file or a folder against a folder (paired by name)."""
    import json

    from linker.eval.ade_eval import score_folders, score_paths
    from linker.fileio import Input, atomic_file, check_output

    if index:
        raise ConfigError("--submission scores labels against gold labels; it takes no --index")
    if dataset is None or not dataset.startswith("ade-xml:"):
        raise ConfigError(f"--submission needs --dataset ade-xml:GOLD (a gold label file or folder), found {dataset!r}")
    gold = Path(dataset.split(":", 1)[1])
    if not gold.exists():
        raise ConfigError(f"--dataset {dataset}: expected a gold label file or folder, found no such path")
    if not submission.exists():
        raise ConfigError(f"--submission {submission}: expected a submission label file or folder, found no such path")
    if gold.is_dir() != submission.is_dir():
        raise ConfigError(f"--dataset {gold} and --submission {submission}: expected two files or two folders, "
                          "found one of each")
    outputs = {ext: Path(f"{report}.{ext}") for ext in ("md", "json")} if report is not None else {}
    for path in outputs.values():  # before any work: gold and submissions are inputs
        check_output(path, inputs=[Input(gold, "--dataset"), Input(submission, "--submission")], overwrite=overwrite,
                     option="--report")
    result = (score_folders(gold, submission, missing=missing, limits=limits) if gold.is_dir()
              else score_paths([gold], [submission], missing=missing, limits=limits))
    text = result.to_markdown()
    typer.echo(text, nl=False)
    if outputs:
        with atomic_file(outputs["json"]) as tmp:
            tmp.write_text(json.dumps(result.to_dict(), ensure_ascii=False, indent=2, default=str) + "\n",
                           encoding="utf-8")
        with atomic_file(outputs["md"]) as tmp:
            tmp.write_text(f"# ADE Eval: {submission.name} against {gold.name}\n\n{text}", encoding="utf-8")
        typer.echo(f"report: {outputs['md']}, {outputs['json']}")
