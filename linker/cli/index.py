"""`linker index build|info|kinds|tune`: index folders over concept tables."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from linker.cli._app import app
from linker.cli.common import echo_json
from linker.errors import ConfigError
from linker.index import available_kinds, get_kind
from linker.index.dense import DenseConfig
from linker.index.manifest import read_manifest, verify
from linker.index.options import build_options, config_fields
from linker.index.tfidf_config import TfidfConfig, get_preset

index_app = typer.Typer(help="Build and inspect index folders.", no_args_is_help=True)
app.add_typer(index_app, name="index")


def _parameters(config_type: type, parts: dict[type, Callable[[], Any]], own: dict) -> dict:
    """A kind's parameters, as its manifest records them, from the command line: a kind whose config is one
    of `parts` (tfidf, dense) takes that part's options; a kind made of parts (hybrid) takes each part's,
    field by field, and its `own` options, the rest at their defaults. `IndexKind.config_from_dict` reads them."""
    if config_type in parts:
        return dataclasses.asdict(parts[config_type]())
    default = config_type()
    params = {}
    for field in dataclasses.fields(default):
        value = getattr(default, field.name)
        params[field.name] = dataclasses.asdict(parts[type(value)]()) if type(value) in parts else value
    return {**params, **own}


_SHAPE = ("analyzer", "ngram_min", "ngram_max", "normalization")  # the fields a --preset sets


def _tfidf_config(options: dict[str, Any]) -> TfidfConfig:
    fields = config_fields(TfidfConfig, options)
    preset = fields.pop("preset", None)
    shaped = [key for key in fields if key in _SHAPE]
    if preset is not None and shaped:
        raise ConfigError(f"--preset {preset} sets the analyzer, n-gram range and normalisation; "
                          f"found also {', '.join(dict.fromkeys('--' + key.split('_')[0] for key in shaped))}")
    return dataclasses.replace(get_preset(preset) if preset is not None else TfidfConfig(), **fields)


def _dense_config(options: dict[str, Any]) -> DenseConfig:
    from linker.encoders import check_encoder_name

    if options.get("encoder") is not None:
        check_encoder_name(options["encoder"])  # before the concept table is read
    return DenseConfig(**config_fields(DenseConfig, options))


# The parts every kind's config is made of (a hybrid holds one of each), and how each is made from its options.
_PARTS: dict[type, Callable[[dict[str, Any]], Any]] = {TfidfConfig: _tfidf_config, DenseConfig: _dense_config}


def _part_options() -> list[inspect.Parameter]:
    """The generated options of `build_cli`: each part's fields that declare one (`linker.index.options`), in
    field order, tf-idf's then the encoder's; a flag two parts share (--threads) once, with the first one's help."""
    params: dict[str, inspect.Parameter] = {}
    for config_type in _PARTS:
        for _, option_type, opt in build_options(config_type):
            if opt.name not in params:
                info = typer.Option(opt.default, opt.flag, help=opt.help)
                params[opt.name] = inspect.Parameter(opt.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                                     annotation=option_type)
    return list(params.values())


def _build_head(
    dict_path: Path = typer.Option(..., "--dict", "-d", help="Concept table (.parquet) from `linker dict build`."),
    kind: str = typer.Option("tfidf", "--kind", "-k", help=f"Index kind: {', '.join(available_kinds())}."),
    out: Path = typer.Option(..., "--out", "-o", help="Index folder to write; an existing one only with --overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is an index folder that linker wrote."),
) -> None:
    """`build_cli`'s own options before the generated ones."""


def _build_tail(
    sparse_weight: str = typer.Option(None, "--sparse-weight", help="hybrid: weight of the tf-idf score: a number (default 1), learned (BioSyn's, from the encoder folder's biosyn.json) or tuned (on --dev by `linker index tune`'s grid)."),
    dev: str = typer.Option(None, "--dev", help="hybrid with --sparse-weight tuned: dev mentions FORMAT:PATH[#OPTIONS] to tune on."),
    reranker: Path = typer.Option(None, "--reranker", help="Re-ranker to bind, copied in and used by default: a folder (`linker train rerank`) or a shipped re-ranker's name."),
    prior: list[str] = typer.Option(None, "--prior", help="Labelled training data FORMAT:PATH[#OPTIONS] (repeatable): among concepts tied at equal scores, the one most often gold there for the matched name ranks first, then the one most often gold overall."),
) -> None:
    """`build_cli`'s own options after the generated ones: --sparse-weight takes words (learned, tuned) that are
    no value of the hybrid's field, --dev is no field at all, --reranker and --prior are the build's, not a kind's."""


def _own(template: Callable[..., None]) -> list[inspect.Parameter]:
    """A template's typer options as keyword-only parameters of `build_cli`'s generated signature."""
    hints = typing.get_type_hints(template)
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
            for p in inspect.signature(template).parameters.values()]


def build_cli(*, dict_path: Path, kind: str, out: Path, overwrite: bool, sparse_weight: str | None, dev: str | None,
              reranker: Path | None, prior: list[str] | None, **options: Any) -> None:
    """Build an index folder (tfidf, dense or hybrid) over a concept table."""
    spec = get_kind(kind)
    kind_parts = {spec.config_type} if spec.config_type in _PARTS else {
        type(getattr(spec.config_type(), f.name)) for f in dataclasses.fields(spec.config_type)} & _PARTS.keys()
    if DenseConfig not in kind_parts:
        shared = {opt.flag for _, _, opt in build_options(TfidfConfig)}
        given = [opt.flag for _, _, opt in build_options(DenseConfig)
                 if opt.flag not in shared and opt.default is None and options.get(opt.name) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: options of dense and hybrid indexes; --kind {kind} encodes nothing")
    else:  # dense and hybrid encode names
        from linker.extras import check

        check(("torch", "sentence_transformers", "faiss"), extra="dense", what=f"a {kind} index")  # before --dict is read
    own = {}  # options of a kind's own config (the hybrid's weights), not of one of its parts
    weighted = "sparse_weight" in {f.name for f in dataclasses.fields(spec.config_type)}
    if weighted:
        own = {} if sparse_weight in (None, "tuned") else {
            "sparse_weight": _sparse_weight(sparse_weight, options.get("encoder"))}
        if (sparse_weight == "tuned") != (dev is not None):
            raise ConfigError("--sparse-weight tuned needs --dev SPEC (the dev mentions to tune on), and --dev needs it")
    parts = {part: (lambda make=make: make(options)) for part, make in _PARTS.items()}
    config = spec.config_from_dict(_parameters(spec.config_type, parts, own))
    tune_on = dev if weighted and sparse_weight == "tuned" else None
    from linker.eval.tune import build_index  # the index build, then the tuning when asked

    manifest = build_index(dict_path, kind=kind, out=out, config=config, reranker=reranker, prior=prior or (),
                           overwrite=overwrite, tune_on=tune_on)
    counts = manifest["counts"]
    typer.echo(f"wrote {out}: {kind} index of {counts['names']:,} names of {counts['concepts']:,} concepts "
               f"in {manifest['build_seconds']:.1f}s")
    if manifest.get("prior"):
        _echo_prior(manifest["prior"])
    if "sparse_weight_tuning" in manifest:
        chosen = manifest["sparse_weight_tuning"]["chosen"]
        typer.echo(f"tuned on {dev}: sparse_weight {chosen['sparse_weight']:g}, dense_weight "
                   f"{chosen['dense_weight']:g} (dev Acc@1 {100 * chosen['acc1']:.2f})")


# 24 options, over the house's 15: one command builds every kind, and each option maps onto one field of a kind's
# config (generated from the dataclasses above), so splitting it per kind would repeat the shared ones.
build_cli.__signature__ = inspect.Signature([*_own(_build_head), *_part_options(), *_own(_build_tail)])
index_app.command("build")(build_cli)


def _sparse_weight(value: str, encoder: str | None) -> float:
    """--sparse-weight FLOAT, or ``learned``: the weight BioSyn training stored beside the encoder."""
    if value == "learned":
        from linker.train.biosyn import SPARSE_WEIGHT_FILE

        path = Path(encoder or "") / SPARSE_WEIGHT_FILE
        if encoder is None or not path.is_file():
            raise ConfigError(f"--sparse-weight learned reads {SPARSE_WEIGHT_FILE} from the --encoder folder that "
                              f"`linker train biosyn` wrote; found none at {path}")
        try:
            return max(float(json.loads(path.read_text(encoding="utf-8"))["sparse_weight"]), 0.0)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: expected JSON with a number 'sparse_weight' ({exc})") from None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"--sparse-weight takes learned, tuned or a number, found {value!r}") from None


@index_app.command("tune")
def tune_cli(
    index: Path = typer.Option(..., "--index", "-i", help="Hybrid index folder (its manifest gets the chosen weights)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dev mentions FORMAT:PATH[#OPTIONS] as for `linker eval` (not the test set)."),
    grid: str = typer.Option(None, "--grid", help="tf-idf shares a to try (sparse_weight a, dense_weight 1 - a); default 0,0.1,...,1."),
    composite: str = typer.Option("all", "--composite", help="Composite mentions right when all parts (all) or any part (any) is found."),
    gold_via_xref: str = typer.Option(None, "--gold-via-xref", help="Map predicted ids through this xref prefix (UMLS) before comparing with gold."),
    query_lang: bool = typer.Option(False, "--query-lang", help="Restrict candidates to names in each mention's language."),
) -> None:
    """Choose a hybrid index's sparse/dense weights on dev mentions by a grid; store them and the dev scores in its manifest."""
    from linker.datasets import spec_inputs
    from linker.eval.tune import DEFAULT_GRID, parse_grid, tune_sparse_weight
    from linker.fileio import check_output
    from linker.index.manifest import MANIFEST

    # tune rewrites the index's manifest (its job); the dev mentions may not be that file
    check_output(index / MANIFEST, inputs=spec_inputs(dataset, "--dataset"), overwrite=True,
                 option=f"--index {index}: its manifest")
    echo_json(tune_sparse_weight(index, dataset, grid=DEFAULT_GRID if grid is None else parse_grid(grid),
                                 composite=composite, gold_via_xref=gold_via_xref, query_lang=query_lang))


@index_app.command("info")
def info_cli(
    folder: Path = typer.Argument(..., help="An index folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    no_check: bool = typer.Option(False, "--no-check", help="Do not verify the files against the manifest."),
) -> None:
    """Show an index folder's manifest and check its files."""
    manifest = read_manifest(folder)
    if not no_check:
        verify(folder, manifest, trust_stamp=False)  # the explicit check: every file hashed again
    if as_json:
        echo_json(manifest)
        return
    counts, concepts = manifest["counts"], manifest["concepts"]
    typer.echo(f"{folder}: {manifest['kind']} index, {counts['names']:,} names of {counts['concepts']:,} concepts")
    typer.echo(f"  built {manifest['built_at']} by linker {manifest['library_version']} in {manifest['build_seconds']}s")
    typer.echo(f"  concept table {concepts['source_path']} (sha256 {concepts['sha256'][:12]})")
    if manifest.get("encoder"):
        typer.echo(f"  encoder {manifest['encoder']}")
    if manifest.get("reranker"):
        typer.echo(f"  re-ranker {manifest['reranker']['name']} (sha256 {manifest['reranker']['sha256'][:12]})")
    if manifest.get("prior"):
        _echo_prior(manifest["prior"])
    if manifest.get("calibration"):
        cal = manifest["calibration"]
        shipped = (" (the default calibration: synonyms held out of this index's dictionary, and names of its own)"
                   if cal.get("origin") == "default" else "")
        typer.echo(f"  calibration {cal['method']} on {cal['mentions']:,} mentions of {cal['fitted_on']}{shipped}")
        if cal.get("auto_from") is not None:
            typer.echo(f"  decisions: auto at confidence >= {cal['auto_from']}, no link below {cal['no_link_below']}, "
                       f"review between; margin weight {cal['margin_weight']}")
    typer.echo(f"  parameters {manifest['parameters']}")
    size = sum(entry["size"] for entry in manifest["files"].values())
    typer.echo(f"  {len(manifest['files'])} files, {size / 2**20:.1f} MiB" + ("" if no_check else ", verified"))


@index_app.command("kinds")
def kinds_cli() -> None:
    """List the index kinds `index build --kind` accepts."""
    for name in available_kinds():
        typer.echo(name)


def _echo_prior(entry: dict) -> None:
    names = f", {entry['names']:,} mention texts" if "names" in entry else ""
    typer.echo(f"  tie prior: {entry['concepts']:,} concepts{names} counted in {entry['mentions']:,} labelled mentions "
               f"({entry['gold_ids_not_in_dictionary']:,} gold ids not in the dictionary)")
