"""`linker index build|info|kinds|tune`: index folders over concept tables."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from linker.cli._app import app
from linker.cli.common import echo_json
from linker.errors import ConfigError
from linker.index import available_kinds, build_index, get_kind
from linker.index.dense import DenseConfig
from linker.index.manifest import read_manifest, verify

index_app = typer.Typer(help="Build and inspect index folders.", no_args_is_help=True)
app.add_typer(index_app, name="index")


def _ngram_range(text: str) -> tuple[int, int]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--ngram: expected MIN,MAX such as 1,2, found {text!r}")
    return int(parts[0]), int(parts[1])


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


def _tfidf_config(preset: str | None, ngram: str | None, analyzer: str | None, normalization: str | None,
                  threads: int | None, exact_max_names: int | None, search: str | None = None) -> TfidfConfig:
    from linker.index.tfidf import TfidfConfig, get_preset

    options: dict = {"analyzer": analyzer, "normalization": normalization}
    if ngram is not None:
        options["ngram_min"], options["ngram_max"] = _ngram_range(ngram)
    options = {key: value for key, value in options.items() if value is not None}
    if preset is not None and options:
        raise ConfigError(f"--preset {preset} sets the analyzer, n-gram range and normalisation; "
                          f"found also {', '.join(dict.fromkeys('--' + key.split('_')[0] for key in options))}")
    base = get_preset(preset) if preset is not None else TfidfConfig()
    query_options = {"threads": threads, "exact_max_names": exact_max_names, "search": search}
    return dataclasses.replace(base, **options, **{key: v for key, v in query_options.items() if v is not None})


def _dense_config(encoder: str | None, faiss_index: str | None, batch_size: int | None, threads: int | None,
                  precision: str, compile_choice: str, storage: str | None = None, engine: str | None = None,
                  workers: int | None = None, address: str | None = None) -> DenseConfig:
    from linker.encoders import check_encoder_name

    if encoder is not None:
        check_encoder_name(encoder)  # before the concept table is read
    options = {"encoder": encoder, "faiss_kind": faiss_index, "batch_size": batch_size, "threads": threads,
               "precision": precision, "compile": compile_choice, "storage": storage, "engine": engine,
               "workers": workers, "address": address}
    return DenseConfig(**{key: value for key, value in options.items() if value is not None})


@index_app.command("build")
def build_cli(
    dict_path: Path = typer.Option(..., "--dict", "-d", help="Concept table (.parquet) from `linker dict build`."),
    kind: str = typer.Option("tfidf", "--kind", "-k", help=f"Index kind: {', '.join(available_kinds())}."),
    out: Path = typer.Option(..., "--out", "-o", help="Index folder to write; an existing one only with --overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is an index folder that linker wrote."),
    preset: str = typer.Option(None, "--preset", help="tf-idf: a named setting, e.g. medical-crossing (char 1,2 as that paper and BioSyn)."),
    ngram: str = typer.Option(None, "--ngram", help="tf-idf: character n-gram range MIN,MAX (default 3,3)."),
    analyzer: str = typer.Option(None, "--analyzer", help="tf-idf: char_wb (n-grams inside word boundaries, default) or char."),
    normalization: str = typer.Option(None, "--normalization", help="tf-idf: text normalisation of names and mentions: biosyn (default), default, words, faithful."),
    exact_max_names: int = typer.Option(None, "--exact-max-names", help="tf-idf, --search auto: search larger indexes with maxscore (default 500000)."),
    search: str = typer.Option(None, "--search", help="tf-idf: auto (default: exact up to --exact-max-names names, maxscore above), exact, maxscore (same top-k, stops reading postings early) or approximate."),
    threads: int = typer.Option(None, "--threads", help="Threads of the tf-idf product (default 2) and of torch/FAISS (default: all cores)."),
    encoder: str = typer.Option(None, "--encoder", help="dense/hybrid: encoder alias (minilm, e5-small), folder or hub name."),
    faiss_index: str = typer.Option(None, "--faiss", help="dense/hybrid: FAISS index type: auto (default: flat up to 200,000 names, ivf-pqfs above), flat, hnsw, ivf-sq8, ivf-pq, ivf-pqfs."),
    storage: str = typer.Option(None, "--storage", help="dense/hybrid: dtype of the stored name vectors: auto (default: fp16 for the IVF kinds, fp32 otherwise), fp32, fp16."),
    engine: str = typer.Option(None, "--engine", help="dense/hybrid: who encodes the names: local (default, this process) or ray (Ray actors; resumable)."),
    workers: int = typer.Option(None, "--workers", help="--engine ray: encoding actors (default: one per CPU of the Ray cluster)."),
    address: str = typer.Option(None, "--address", help="--engine ray: the Ray cluster to join (default: start a local Ray)."),
    batch_size: int = typer.Option(None, "--batch-size", help="dense/hybrid: most names per encoding batch (batches are filled by tokens)."),
    precision: str = typer.Option("auto", "--precision", help="dense/hybrid: auto, fp32, bf16 or int8; auto = the fastest this CPU runs natively that passes a check against fp32."),
    compile_choice: str = typer.Option("auto", "--compile", help="dense/hybrid: torch.compile the encoder: auto (CPU builds of >= 20,000 names, with a C++ compiler), on or off."),
    sparse_weight: str = typer.Option(None, "--sparse-weight", help="hybrid: weight of the tf-idf score: a number (default 1), learned (BioSyn's, from the encoder folder's biosyn.json) or tuned (on --dev by `linker index tune`'s grid)."),
    dev: str = typer.Option(None, "--dev", help="hybrid with --sparse-weight tuned: dev mentions FORMAT:PATH[#OPTIONS] to tune on."),
    reranker: Path = typer.Option(None, "--reranker", help="Re-ranker folder (`linker train rerank`) to bind: copied in, used by default."),
    prior: list[str] = typer.Option(None, "--prior", help="Labelled training data FORMAT:PATH[#OPTIONS] (repeatable): among concepts tied at equal scores, the one most often gold there for the matched name ranks first, then the one most often gold overall."),
) -> None:
    """Build an index folder (tfidf, dense or hybrid) over a concept table."""
    # Here, not at the top: this module is imported by every `linker` command, and tf-idf's imports (scikit-learn,
    # numba) took seconds of a dense `linker link`.
    from linker.index.tfidf import TfidfConfig

    spec = get_kind(kind)
    dense_only = {"--encoder": encoder, "--faiss": faiss_index, "--storage": storage, "--engine": engine,
                  "--workers": workers, "--address": address, "--batch-size": batch_size}
    given = [option for option, value in dense_only.items() if value is not None]
    if spec.config_type is TfidfConfig and given:
        raise ConfigError(f"{', '.join(given)}: options of dense and hybrid indexes; --kind {kind} encodes nothing")
    if spec.config_type is not TfidfConfig:  # dense and hybrid encode names
        from linker.extras import check

        check(("torch", "sentence_transformers", "faiss"), extra="dense", what=f"a {kind} index")  # before --dict is read
    own = {}  # options of a kind's own config (the hybrid's weights), not of one of its parts
    if "sparse_weight" in {f.name for f in dataclasses.fields(spec.config_type)}:
        own = {} if sparse_weight in (None, "tuned") else {"sparse_weight": _sparse_weight(sparse_weight, encoder)}
        if (sparse_weight == "tuned") != (dev is not None):
            raise ConfigError("--sparse-weight tuned needs --dev SPEC (the dev mentions to tune on), and --dev needs it")
    parts = {
        TfidfConfig: lambda: _tfidf_config(preset, ngram, analyzer, normalization, threads, exact_max_names, search),
        DenseConfig: lambda: _dense_config(encoder, faiss_index, batch_size, threads, precision, compile_choice,
                                           storage, engine, workers, address),
    }
    config = spec.config_from_dict(_parameters(spec.config_type, parts, own))
    if dev is not None:  # read after the build: the folder the build replaces may not hold it
        from linker.datasets import spec_inputs
        from linker.fileio import check_output

        check_output(out, inputs=spec_inputs(dev, "--dev"), overwrite=overwrite, folder=True, option="--out")
    manifest = build_index(dict_path, kind=kind, out=out, config=config, reranker=reranker, prior=prior or (),
                           overwrite=overwrite)
    counts = manifest["counts"]
    typer.echo(f"wrote {out}: {kind} index of {counts['names']:,} names of {counts['concepts']:,} concepts "
               f"in {manifest['build_seconds']:.1f}s")
    if manifest.get("prior"):
        _echo_prior(manifest["prior"])
    if kind == "hybrid" and sparse_weight == "tuned":
        from linker.eval.tune import tune_sparse_weight

        chosen = tune_sparse_weight(out, dev)["chosen"]
        typer.echo(f"tuned on {dev}: sparse_weight {chosen['sparse_weight']:g}, dense_weight "
                   f"{chosen['dense_weight']:g} (dev Acc@1 {100 * chosen['acc1']:.2f})")


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
        verify(folder, manifest)
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
        shipped = " (the default calibration: synonyms held out of this index's dictionary)" if cal.get("origin") == "default" else ""
        typer.echo(f"  calibration {cal['method']} on {cal['mentions']:,} mentions of {cal['fitted_on']}{shipped}")
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
