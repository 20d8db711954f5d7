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
    auto_precision: float = typer.Option(0.95, "--auto-precision", help="Decision 'auto' (code without review) from this confidence: each such answer was at least this likely right on held-in data."),
    no_link_below: float = typer.Option(0.2, "--no-link-below", help="Decision 'no link' below this confidence (the best candidate right less often than this)."),
    dictionary_names: int = typer.Option(0, "--dictionary-names", min=0, help="Also fit on this many names of the index itself (seeded), each answered by its own concept: teaches the map what an exact match, and one shared by two concepts, is worth (the default calibration: 1000)."),
    origin: str = typer.Option("user", "--origin", help="Recorded in the manifest: user (your own held-in mentions) or default (the shipped default index's, fitted on synonyms held out of its dictionary)."),
) -> None:
    """Fit P(correct | score, margin) (isotonic) on held-in mentions; every candidate then carries a confidence and
    every mention a decision: auto, review or no link."""
    from linker.cli.common import check_datasets, check_index, check_linker_options
    from linker.eval.calibrate import calibrate

    # before the index loads (seconds): the options, the dataset's path, the index folder's manifest
    check_linker_options(rerank_k=rerank_k)
    for option, value in (("--auto-precision", auto_precision), ("--no-link-below", no_link_below)):
        if not 0.0 <= value <= 1.0:
            from linker.errors import ConfigError

            raise ConfigError(f"{option}: expected a probability from 0 to 1, found {value}")
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
                        exclude_names=tuple(exclude_names or ()), auto_precision=auto_precision,
                        no_link_below=no_link_below, dictionary_names=dictionary_names))
