"""`linker calibrate`: fit an index's confidence map on held-in mentions (stored in the index folder)."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import echo_json, rerank_k_option, rerank_option


@app.command("calibrate")
def calibrate_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Index folder to calibrate (calibration.json is added to it)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Held-in mentions with gold ids, FORMAT:PATH[#OPTIONS] as for `linker eval` (not the test set)."),
    rerank: str = rerank_option(),
    rerank_k: int = rerank_k_option(),
    composite: str = typer.Option("all", "--composite", help="Composite mentions right when all parts (all) or any part (any) is found."),
    gold_via_xref: str = typer.Option(None, "--gold-via-xref", help="Map predicted ids through this xref prefix (UMLS) before comparing with gold."),
    query_lang: bool = typer.Option(False, "--query-lang", help="Restrict candidates to names in each mention's language."),
    exclude_names: list[Path] = typer.Option(None, "--exclude-names", help="TSV files of (concept_id, name) pairs masked out while linking, so that synonyms the index holds serve as held-out mentions (the default calibration: linker/data/lay/dev_names.tsv)."),
    origin: str = typer.Option("user", "--origin", help="Recorded in the manifest: user (your own held-in mentions) or default (the shipped default index's, fitted on synonyms held out of its dictionary)."),
) -> None:
    """Fit P(correct | score) (isotonic) on held-in mentions; every candidate then carries a confidence."""
    from linker.cli.common import check_datasets, check_index, check_linker_options
    from linker.eval.calibrate import calibrate

    # before the index loads (seconds): the options, the dataset's path, the index folder's manifest
    check_linker_options(rerank_k=rerank_k)
    if origin not in ("user", "default"):
        from linker.errors import UnknownNameError

        raise UnknownNameError("--origin", origin, ("user", "default"))
    check_datasets([dataset])
    for path in exclude_names or ():
        if not path.is_file():
            from linker.errors import MissingInputError

            raise MissingInputError(f"{path}: no such file (--exclude-names)")
    check_index(index, rerank)

    echo_json(calibrate(index, dataset, rerank=rerank, rerank_k=rerank_k, composite=composite,
                        gold_via_xref=gold_via_xref, query_lang=query_lang, origin=origin,
                        exclude_names=tuple(exclude_names or ())))
