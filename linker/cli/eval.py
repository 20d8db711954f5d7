"""`linker eval`: Acc@k of an index on a test set, Full / Filtered / Filtered0.2, with a report."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli.common import LENIENT_HELP, rerank_k_option, rerank_option, split_csv
from linker.cli.main import app
from linker.errors import ConfigError
from linker.eval.report import evaluate, markdown_table, trust_markdown


@app.command("eval")
def eval_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Index folder from `linker index build`."),
    dataset: str = typer.Option(..., "--dataset", "-d",
                                help="Test set FORMAT:PATH, optionally #OPTIONS (#lang=es, #P); FORMAT: pubtator, brat, codiesp, biosyn, tsv, query."),
    train: list[str] = typer.Option(None, "--train", help="Training set spec(s), the reference of the train filters."),
    filter_: list[str] = typer.Option(["full"], "--filter", "-f",
                                      help="full, dict, dict0.2, train, train0.2 or all (repeat or comma-separate)."),
    k: str = typer.Option("1,5", "--k", help="Cut-offs for Acc@k, comma-separated."),
    report: Path = typer.Option(None, "--report", help="Write the report to PATH.md, PATH.json and PATH.png (e.g. eval/ncbi)."),
    mode: str = typer.Option("faithful", "--mode", help="Filter normalisation: faithful (lower/strip) or biosyn."),
    abbreviations: Path = typer.Option(None, "--abbreviations", help="biosyn mode: 'short<TAB>long' table to expand."),
    composite: str = typer.Option("all", "--composite", help="Composite mentions right when all parts (all) or any part (any) is found."),
    gold_via_xref: str = typer.Option(None, "--gold-via-xref",
                                      help="Map predicted ids through this xref prefix (UMLS) before comparing with gold."),
    same_as: Path = typer.Option(None, "--same-as", help="File of id groups 'ID|ID...' (e.g. MEDIC) that name one concept."),
    query_lang: bool = typer.Option(False, "--query-lang", help="Restrict candidates to names in each mention's language."),
    lenient: bool = typer.Option(False, "--lenient", help=LENIENT_HELP),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    nil_fraction: float = typer.Option(0.0, "--nil-fraction", help="Remove this share of the gold concepts from the dictionary and score 'no link' answers (needs `linker calibrate`)."),
    min_confidence: float = typer.Option(0.5, "--min-confidence", help="With --nil-fraction: 'no link' below this calibrated confidence."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing report files."),
) -> None:
    """Score an index on a test set; prints the table (and writes a report with --report)."""
    try:
        ks = tuple(int(x) for x in split_csv([k]))
    except ValueError:
        raise ConfigError(f"--k takes comma-separated integers, found {k!r}") from None
    result = evaluate(
        index, dataset, train_spec=tuple(train or ()), filters=split_csv(filter_), ks=ks,
        report_dir=None if report is None else report.parent, name=None if report is None else report.name, mode=mode, composite=composite,
        gold_via_xref=gold_via_xref, same_as=same_as, query_lang=query_lang, abbreviations=abbreviations, lenient=lenient,
        rerank=rerank, rerank_k=rerank_k, nil_fraction=nil_fraction, min_confidence=min_confidence,
        overwrite=overwrite,
    )
    typer.echo(markdown_table([(Path(dataset.split(":", 1)[-1].split("#")[0]).name, result)], intervals=True))
    for line in trust_markdown(result):
        if line:
            typer.echo(line)
    typer.echo(f"{100 * result.reachable:.2f}% of mentions have a gold id in the dictionary; "
               f"{result.seconds['total']:.1f}s" + (f"; report: {', '.join(result.files)}" if result.files else ""))
