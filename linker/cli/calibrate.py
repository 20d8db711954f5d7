"""`linker calibrate`: fit an index's confidence map on held-in mentions (stored in the index folder)."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli.common import echo_json, rerank_k_option, rerank_option
from linker.cli.main import app


@app.command("calibrate")
def calibrate_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Index folder to calibrate (calibration.json is added to it)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Held-in mentions with gold ids, FORMAT:PATH[#OPTIONS] as for `linker eval` (not the test set)."),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    composite: str = typer.Option("all", "--composite", help="Composite mentions right when all parts (all) or any part (any) is found."),
    gold_via_xref: str = typer.Option(None, "--gold-via-xref", help="Map predicted ids through this xref prefix (UMLS) before comparing with gold."),
    query_lang: bool = typer.Option(False, "--query-lang", help="Restrict candidates to names in each mention's language."),
) -> None:
    """Fit P(correct | score) (isotonic) on held-in mentions; every candidate then carries a confidence."""
    from linker.cli.common import check_datasets, check_index, check_linker_options
    from linker.eval.calibrate import calibrate

    # before the index loads (seconds): the options, the dataset's path, the index folder's manifest
    check_linker_options(rerank_k=rerank_k)
    check_datasets([dataset])
    check_index(index, rerank)

    echo_json(calibrate(index, dataset, rerank=rerank, rerank_k=rerank_k, composite=composite,
                        gold_via_xref=gold_via_xref, query_lang=query_lang))
