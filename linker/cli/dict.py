"""`linker dict build|info|merge`: concept tables from terminology distributions."""

from __future__ import annotations

from pathlib import Path

import typer

from linker.cli._app import app
from linker.cli.common import MAX_DOCUMENT_HELP, MAX_LINE_HELP, echo_json, read_limits, split_csv
from linker.dictionary import SourceSpec, build_dictionary, describe, merge_tables
from linker.sources import SourceOptions, available_sources

dict_app = typer.Typer(help="Build and inspect concept tables.", no_args_is_help=True)
app.add_typer(dict_app, name="dict")


@dict_app.command("build")
def build_cli(
    paths: list[Path] = typer.Argument(None, help="Files or folders of the source (none for `default`, and for `icd10` to read ICD-10-CM from simple-icd-10-cm)."),
    source: str = typer.Option(..., "--source", "-s", help="Source format: one of the names listed by `linker dict sources`."),
    out: Path = typer.Option(..., "--out", "-o", help="Output concept table (.parquet)."),
    lang: list[str] = typer.Option(None, "--lang", help="Keep these languages (ISO 639-1, e.g. en,es); files that do not say their language (tsv, icdo, icd10 TSV) take the first one."),
    sab: list[str] = typer.Option(None, "--sab", help="UMLS: keep these source vocabularies (e.g. MDR,MSH)."),
    sty: list[str] = typer.Option(None, "--sty", help="UMLS: keep these semantic types (TUI or name)."),
    group: list[str] = typer.Option(None, "--group", help="UMLS: keep these semantic groups (e.g. DISO)."),
    current_only: bool = typer.Option(False, "--current-only", help="Drop non-current LLTs and other retired names."),
    include_suppressed: bool = typer.Option(False, "--include-suppressed", help="UMLS: keep suppressible rows."),
    synonyms: list[str] = typer.Option(["EXACT"], "--synonyms", help="OBO: synonym scopes to read (EXACT,RELATED,NARROW,BROAD)."),
    meddra_target: str = typer.Option("pt", "--meddra-target", help="MedDRA: link names to their PT (pt) or to the LLT (llt)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it exists."),
    exclude_names: list[Path] = typer.Option(None, "--exclude-names", help="default: TSV files of (concept_id, name) pairs to leave out, e.g. the lay test set's held-out names (linker/data/lay/heldout_names.tsv)."),
    max_line_bytes: int = typer.Option(None, "--max-line-bytes", help=MAX_LINE_HELP),
    max_document_bytes: int = typer.Option(None, "--max-document-bytes", help="Largest ClaML element or XML file accepted, in bytes (default 64 MiB)."),
) -> None:
    """Read a terminology distribution into a concept table."""
    options = SourceOptions(
        limits=read_limits(max_line_bytes, max_document_bytes),
        exclude_names=tuple(str(p) for p in exclude_names or ()),
        langs=split_csv(lang),
        vocabularies=split_csv(sab),
        semantic_types=split_csv(sty),
        semantic_groups=split_csv(group),
        current_only=current_only,
        include_suppressed=include_suppressed,
        synonym_scopes=tuple(s.upper() for s in split_csv(synonyms)),
        meddra_target=meddra_target,
    )
    summary = build_dictionary([SourceSpec(source, tuple(paths or ()))], out, options=options, overwrite=overwrite)
    typer.echo(
        f"wrote {summary.out}: {summary.rows:,} names of {summary.concepts:,} concepts "
        f"({summary.duplicates_dropped:,} duplicates dropped, {summary.filtered_out:,} filtered out"
        + (f", {summary.hierarchy_rows:,} hierarchy rows" if summary.hierarchy_rows else "")
        + f") in {summary.seconds:.1f}s"
    )


@dict_app.command("merge")
def merge_cli(
    tables: list[Path] = typer.Argument(..., help="Concept tables to merge, first one wins on duplicates."),
    out: Path = typer.Option(..., "--out", "-o", help="Output concept table (.parquet)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it exists."),
) -> None:
    """Merge concept tables (e.g. HPO with its translations plus Disease Ontology)."""
    summary = merge_tables(tables, out, overwrite=overwrite)
    typer.echo(f"wrote {summary.out}: {summary.rows:,} names of {summary.concepts:,} concepts")


@dict_app.command("sources")
def sources_cli() -> None:
    """List the source formats `dict build --source` accepts."""
    for name in available_sources():
        typer.echo(name)


@dict_app.command("info")
def info_cli(
    table: Path = typer.Argument(..., help="A concept table (.parquet)."),
    samples: int = typer.Option(5, "--samples", help="Sample rows to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Concepts and names per source, language and term type, and sample rows."""
    info = describe(table, samples=samples)
    if as_json:
        echo_json(info)
        return
    typer.echo(f"{info['path']}: {info['names']:,} names, {info['concepts']:,} concepts, "
               f"{info['non_current_names']:,} non-current names, {info['hierarchy_rows']:,} hierarchy rows")
    # One width for all three tables, wide enough for the longest value (e.g. SY_EXACT/allelic_requirement).
    width = max([22] + [len(str(v)) + 1 for key in ("by_source", "by_lang", "by_term_type") for v in info[key]])
    for title, key in (("source", "by_source"), ("language", "by_lang"), ("term type", "by_term_type")):
        typer.echo(f"\n{'by ' + title:<{width + 2}}{'names':>12}{'concepts':>12}")
        for value, c in info[key].items():
            typer.echo(f"  {value:<{width}}{c['names']:>12,}{c['concepts']:>12,}")
    if info["samples"]:
        typer.echo("\nsample rows")
    for row in info["samples"]:
        typer.echo(f"  {row['concept_id']}\t{row['lang']}\t{row['term_type']}\t{row['name']}")
