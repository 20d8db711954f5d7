"""NCBI-disease under BioSyn's protocol, every system trained and scored by this script.

    .venv/bin/python scripts/ncbi_biosyn.py [--data ../shared/data] [--out eval] [--work indexes/ncbi_biosyn]
        [--models models] [--sap-pairs 10000|all|0] [--epochs 10] [--threads 2] [--rebuild]
        [--grid "topk=20,40 batch=16,32 lr=1e-5,2e-5,5e-5" [--grid-workers N] [--grid-seconds S]
         [--grid-report NAME] [--choose-epochs]] [--stop-after sap|biosyn]

BioSyn (Sung et al. 2020) reports 91.1 Acc@1 on the NCBI-disease test set under this protocol,
which this script follows step by step (dmis-lab/BioSyn README and preprocess/query_preprocess.py):

- queries: abbreviations defined in the abstract expanded (BioSyn: Ab3P; here Schwartz & Hearst),
  typos fixed from ``ncbi-spell-check.txt``, composite mentions split into one text per concept,
  lower case, punctuation removed: the dataset option ``#biosyn&typos=...``;
- dictionary at test time: MEDIC plus the train and dev mentions (preprocessed the same way) as
  extra names of their gold concept; at training time MEDIC alone;
- training: BioSyn on all unique single-concept train+dev mentions (composites dropped), topk 20,
  dense ratio 0.5, lr 1e-5, batch 16, 10 epochs;
- scoring: Acc@k over the 960 test mentions, a mention right when its top-k holds a gold id;
  a split composite needs every part right. Reported under BioSyn's rule ("any": any gold id of
  the mention per part) and our stricter one ("all": every gold concept found).

Encoder: all-MiniLM-L6-v2 (22M parameters, general English), the offline one this project ships,
where BioSyn fine-tuned BioBERT (110M, biomedical). Systems: tf-idf; base encoder; + sap on MEDIC
synonym pairs; + sap + biosyn; hybrid of tf-idf and the last, with BioSyn's learned sparse weight.
Stages are skipped when their output exists (unless --rebuild). Writes eval/ncbi_biosyn/ncbi_biosyn.{md,json}.

With --grid, BioSyn's lr, batch size and top-k are first chosen on dev (each point trained on train
alone, scored by dense Acc@1 on the dev mentions; eval/ncbi_biosyn/<report>_grid.json), and --choose-epochs takes
the epoch count from the same dev curves. --stop-after biosyn ends after training, so the training can
run on a GPU machine and the scoring here (scripts/gpu_ncbi_biosyn.sh, scripts/model_transfer.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.eval.datasets import load_dataset
from linker.eval.report import evaluate
from linker.fileio import atomic_file, portable_paths
from linker.index import build_index
from linker.index.dense import DenseConfig
from linker.index.hybrid import HybridConfig
from linker.index.tfidf import TfidfConfig
from linker.train.biosyn import SPARSE_WEIGHT_FILE, BiosynConfig, train_biosyn, watched_acc1
from linker.train.sap import SapConfig, train_sap
from stages import Stages, index_current, recheck_carried  # scripts/stages.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("ncbi_biosyn")
PUBLISHED = [
    ("BioSyn (Sung et al. 2020), BioBERT, sparse + dense", 91.1, 93.9),
    ("SapBERT (Liu et al. 2021), PubMedBERT + UMLS pairs, fine-tuned", 92.0, 95.6),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "ncbi_biosyn")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "ncbi_biosyn")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--sap-pairs", type=sap_pairs_arg, default=10000,
                        help="MEDIC synonym pairs for sap (all: every pair, 50 per concept at most; 0: no sap)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--biosyn-max-seconds", type=float, default=None,
                        help="time budget for BioSyn in this process (seconds): stop after the step that passes it and "
                             "save; the report then says where it stopped")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-name", default="ncbi_biosyn")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--grid", type=grid_arg, default=None,
                        help="choose BioSyn's lr, batch size and top-k on dev first: each point trained on train alone "
                             "for --epochs and scored by dense Acc@1 on the dev mentions, e.g. "
                             "'lr=1e-5,2e-5 batch=16,32 topk=20,40' (points run in order: put the protocol's first)")
    parser.add_argument("--grid-seconds", type=float, default=None,
                        help="start no further grid point after this many seconds (those are recorded as not run)")
    parser.add_argument("--grid-report", default=None,
                        help="read (or write) the grid of this report name instead of this run's own (reuse a grid)")
    parser.add_argument("--choose-epochs", action="store_true",
                        help="choose the epochs on dev too: the grid point and epoch of the best dev Acc@1 over every "
                             "epoch of every point, and train the final model for that many epochs")
    parser.add_argument("--grid-workers", type=int, default=1,
                        help="grid points trained at once, each in its own process (a GPU has room for several)")
    parser.add_argument("--stop-after", choices=("sap", "biosyn"), default=None,
                        help="stop once this training stage is done (e.g. train on a GPU machine, score elsewhere)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    ncbi, work, models = args.data / "ncbi_disease", args.work, args.models
    work.mkdir(parents=True, exist_ok=True)
    prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
    test_spec = f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}{prep}"
    train_specs = [f"pubtator:{ncbi / name}{prep}" for name in ("NCBItrainset_corpus.txt", "NCBIdevelopset_corpus.txt")]
    medic_txt = ncbi / "medic_06Jul2012.txt"  # its OMIM ids become xrefs: alternatives of the MeSH disease
    previous = args.out / f"{args.report_name}.json"
    stage = Stages(previous, rebuild=args.rebuild)  # keeps skipped stages' timings
    stage_note = json.loads(previous.read_text()).get("stage_seconds_note") if previous.exists() else None
    timings = stage.seconds

    medic = work / "medic.parquet"
    stage("dictionary_medic", medic.exists(), lambda: build_dictionary([SourceSpec("tsv", (medic_txt,))], medic))
    names_tsv, medic_td = work / "train_dev_names.tsv", work / "medic_train_dev.parquet"

    def build_test_dictionary() -> None:
        rows = [f"{concept_id}\t{m.text}" for spec in train_specs for m in load_dataset(spec)
                if len(m.gold) == 1 for concept_id in m.gold[0]]
        with atomic_file(names_tsv) as tmp:
            tmp.write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
        build_dictionary([SourceSpec("tsv", (medic_txt, names_tsv))], medic_td)

    stage("dictionary_medic_train_dev", medic_td.exists(), build_test_dictionary)

    base = args.encoder
    # --sap-pairs 0 skips sap: BioSyn then starts from the base encoder.
    # The pair count is in the folder names, so a run with other pairs never resumes from these.
    sap_model = models / f"ncbi-biosyn-{base}-sap-{args.sap_pairs}" if args.sap_pairs else None
    biosyn_model = models / (f"{sap_model.name}-biosyn" if sap_model else f"ncbi-biosyn-{base}-biosyn")
    if sap_model:
        sap_config = SapConfig(max_pairs=None if args.sap_pairs == "all" else args.sap_pairs, batch_size=64,
                               threads=args.threads)
        stage("train_sap", (sap_model / "train_metrics.json").exists(),
              lambda: train_sap(medic, encoder=base, out=sap_model, config=sap_config))
    if args.stop_after == "sap":
        return
    biosyn_config = BiosynConfig(epochs=args.epochs, threads=args.threads, max_seconds=args.biosyn_max_seconds)
    grid_json = args.out / f"{args.grid_report or args.report_name}_grid.json"
    if args.grid:
        # Hyper-parameters chosen on dev: the grid trains on train alone and watches dev; only the final model
        # below sees train+dev. A grid model is deleted once scored (its dev curve is kept in the grid report).
        biosyn_model = biosyn_model.with_name(biosyn_model.name + "-devgrid" + ("-epochs" if args.choose_epochs else ""))
        dev_spec = train_specs[1]
        stage("choose_biosyn_on_dev", grid_done(grid_json, args.grid),
              lambda: choose_on_dev(args.grid, grid_json, base_config=biosyn_config, train_spec=train_specs[0],
                                    dev_spec=dev_spec, dictionary=medic, encoder=str(sap_model or base),
                                    work=work / "grid", max_seconds=args.grid_seconds, workers=args.grid_workers,
                                    data=args.data))
        grid = {**json.loads(grid_json.read_text()), "report": str(grid_json)}
        if args.choose_epochs:
            grid["chosen_with_epochs"] = chosen_with_epochs(grid)
            log.info("chosen on dev with its epochs: %s", grid["chosen_with_epochs"])
        chosen = grid.get("chosen_with_epochs") or grid["chosen"]
        biosyn_config = replace(biosyn_config, **chosen["params"], **({"epochs": chosen["epochs"]} if args.choose_epochs else {}))
    # The test mentions are watched during training only to draw the curve; the protocol fixes the
    # epochs, so nothing is chosen by them (train+dev are both trained on: no untouched dev split).
    stage("train_biosyn", (biosyn_model / "train_metrics.json").exists(),
          lambda: train_biosyn(train_specs, medic, encoder=str(sap_model or base), out=biosyn_model,
                               config=biosyn_config, monitor=load_dataset(test_spec),
                               resume=biosyn_model.with_name(biosyn_model.name + ".checkpoint").exists()))
    if args.stop_after == "biosyn":
        # The stage times so far, kept by the run that scores (Stages reads them from this report).
        partial = {"report_name": args.report_name, "stopped_after": "biosyn", "stage_seconds": stage.seconds,
                   "load_average_after_stage": stage.load_after, "hardware": hardware(args.threads)}
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_file(args.out / f"{args.report_name}.json") as tmp:
            tmp.write_text(portable_paths(json.dumps(partial, indent=2), root=ROOT, data=args.data))
        return
    learned = json.loads((biosyn_model / SPARSE_WEIGHT_FILE).read_text())["sparse_weight"]
    bio_metrics = json.loads((biosyn_model / "train_metrics.json").read_text())
    watched_here = recheck_carried(stage, biosyn_model, work / f"{biosyn_model.name}_watched_here.json", lambda: {
        "watched_dense_acc1_here": watched_acc1(biosyn_model, medic, test_spec, biosyn_config),
        "hardware": hardware(args.threads)})

    # Names normalised as the queries are (BioSyn preprocesses its dictionary the same way).
    sparse = TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="biosyn")  # BioSyn's char 1-2
    trained = f"{base} + sap + biosyn" if sap_model else f"{base} + biosyn"
    systems = [
        ("tf-idf (char n-grams)", "tfidf", "tfidf", sparse),
        (f"dense {base} (base)", "dense_base", "dense", DenseConfig(encoder=base)),
        *([(f"dense {base} + sap (MEDIC pairs)", "dense_sap", "dense", DenseConfig(encoder=str(sap_model)))]
          if sap_model else []),
        (f"dense {trained}", "dense_" + trained_key(sap_model), "dense", DenseConfig(encoder=str(biosyn_model))),
        (f"hybrid tf-idf + ({trained}), learned sparse weight {learned:.3f}", "hybrid_" + trained_key(sap_model),
         "hybrid", HybridConfig(tfidf=sparse, dense=DenseConfig(encoder=str(biosyn_model)),
                                sparse_weight=max(learned, 0.0))),
    ]
    rows = []
    for label, name, kind, config in systems:
        folder = work / name
        encoder = config.encoder if kind == "dense" else config.dense.encoder if kind == "hybrid" else None
        stage(f"index_{name}", index_current(folder, encoder),
              lambda: build_index(medic_td, kind=kind, out=folder, config=config, overwrite=True))
        row = {"system": label, "index": str(folder)}
        report = evaluate(folder, test_spec, train_spec=train_specs, filters=("full", "train0.2"), ks=(1, 5),
                          composite=("any", "all"), report_dir=args.out, name=f"{args.report_name}_{name}",
                          overwrite=True)  # both rules from one linking pass; regenerates its reports
        for rule in ("any", "all"):
            full, hard = report.row("full", composite=rule), report.row("train0.2", composite=rule)
            row[rule] = {"n": full.n, "acc1": _pct(full.acc(1).value), "acc5": _pct(full.acc(5).value),
                         "acc1_interval": [_pct(full.acc(1).low), _pct(full.acc(1).high)],
                         "filtered02_n": hard.n, "filtered02_acc1": _pct(hard.acc(1).value),
                         "filtered02_acc5": _pct(hard.acc(5).value), "seconds": report.seconds["total"]}
        rows.append(row)
        log.info("%s: Acc@1 %.2f (BioSyn rule) %.2f (all)", label, row["any"]["acc1"], row["all"]["acc1"])

    result = {
        "command": " ".join(["python", "scripts/ncbi_biosyn.py", *sys.argv[1:]]),
        "report_name": args.report_name,
        "test": test_spec,
        "train": train_specs,
        "dictionary": {"path": str(medic_td), "names": read_concept_table(medic_td).table.num_rows,
                       "medic_names": read_concept_table(medic).table.num_rows},
        "rows": rows,
        "published": [{"system": s, "acc1": a1, "acc5": a5} for s, a1, a5 in PUBLISHED],
        "training": {
            "sap": sap_summary(sap_model),
            "biosyn": {"model": str(biosyn_model), "queries": bio_metrics["extra"]["queries"],
                       "seconds": bio_metrics["extra"]["train_seconds"], "epochs": bio_metrics["epochs"],
                       "config": json.loads((biosyn_model / "train_config.json").read_text())["config"],
                       "sparse_weight": bio_metrics["extra"]["sparse_weight"],
                       "stopped_at_time_budget": bio_metrics["extra"].get("stopped_at_time_budget"),
                       "monitor_acc1_after_training": bio_metrics["extra"].get("monitor_dense_acc1_after_training"),
                       "hardware": bio_metrics["extra"]["hardware"], "precision": bio_metrics["extra"].get("precision"),
                       "resumed": bio_metrics["extra"].get("resumed"),
                       "monitor_acc1_recomputed_here": watched_here},
            "grid": grid if args.grid else None,
        },
        "stage_seconds": timings,
        "stage_seconds_note": stage_note,
        "hardware": hardware(args.threads),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.out / f"{args.report_name}.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(result, indent=2), root=ROOT, data=args.data))
    with atomic_file(args.out / f"{args.report_name}.md") as tmp:
        tmp.write_text(portable_paths(markdown(result), root=ROOT, data=args.data))
    curve(result, args.out / f"{args.report_name}_curve.png")
    print(markdown(result))


def hardware(threads: int) -> dict:
    return {"cpu_count": os.cpu_count(), "torch_threads": threads, "machine": platform.machine(),
            "processor": platform.processor(), "torch": torch.__version__, "gpu": torch.cuda.is_available(),
            **({"gpu_name": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),
            "load_average_at_end": list(os.getloadavg())}


def sap_pairs_arg(text: str) -> int | str:
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of pairs or 'all', found {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of pairs >= 0 or 'all', found {value}")
    return value


GRID_KEYS = {"lr": ("lr", float), "batch": ("batch_size", int), "topk": ("topk", int)}


def grid_arg(text: str) -> list[dict]:
    """'lr=1e-5,2e-5 batch=16 topk=20,40' -> every combination, as BiosynConfig fields, in the order written."""
    import itertools

    axes = []
    for part in text.split():
        key, _, values = part.partition("=")
        if key not in GRID_KEYS or not values:
            raise argparse.ArgumentTypeError(f"expected NAME=V1,V2 with NAME one of {', '.join(GRID_KEYS)}; found {part!r}")
        field, cast = GRID_KEYS[key]
        try:
            axes.append([(field, cast(v)) for v in values.split(",")])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: expected {cast.__name__} values, found {values!r}") from None
    if not axes:
        raise argparse.ArgumentTypeError("expected at least one NAME=V1,V2")
    return [dict(point) for point in itertools.product(*axes)]


def grid_key(params: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(params.items()))


def dev_curve(point: dict) -> list[float]:
    """A grid point's dev Acc@1 after epochs 1..n (its first recorded value is before any training)."""
    return [*point["dev_acc1_before_epoch"][1:], point["dev_acc1"]]


def chosen_with_epochs(report: dict) -> dict:
    """The best (dev Acc@1) point and epoch count over every epoch of every scored point; ties: fewer epochs,
    then the point listed first."""
    best = None
    for i, (key, p) in enumerate(report["points"].items()):
        if p.get("dev_acc1") is None:
            continue
        for epoch, acc in enumerate(dev_curve(p), start=1):
            if best is None or (acc, -epoch, -i) > best[0]:
                best = ((acc, -epoch, -i), {"key": key, "params": p["params"], "epochs": epoch, "dev_acc1": acc})
    if best is None:
        raise SystemExit("the grid has no scored point to choose from")
    return best[1]


def grid_done(path: Path, grid: list[dict]) -> bool:
    """The grid report exists and holds every point (run or recorded as not run)."""
    if not path.exists():
        return False
    points = json.loads(path.read_text())["points"]
    return all(grid_key(p) in points for p in grid)


def choose_on_dev(grid: list[dict], path: Path, *, base_config: BiosynConfig, train_spec: str, dev_spec: str,
                  dictionary: Path, encoder: str, work: Path, max_seconds: float | None, workers: int = 1,
                  data: Path | None = None) -> None:
    """Train BioSyn once per grid point (train split only), score each by dense Acc@1 of the dev mentions
    against the training dictionary after the last epoch; write the points and the chosen one to `path`.

    Resumes: points already scored in `path` are not run again. Ties go to the point listed first.
    `workers` > 1 trains that many points at once in separate processes (one small encoder leaves a GPU
    mostly idle); each gets an equal share of `base_config.threads`.
    """
    report = json.loads(path.read_text()) if path.exists() else {"points": {}}
    report.update({"train": train_spec, "dev": dev_spec, "dictionary": str(dictionary), "encoder": encoder,
                   "grid": grid, "epochs": base_config.epochs, "workers": workers,
                   "score": "dense Acc@1 of the dev mentions (single-concept) against the training dictionary, "
                            "after the last epoch"})
    todo = [p for p in grid if (report["points"].get(grid_key(p)) or {}).get("dev_acc1") is None]
    threads = max(1, (base_config.threads or os.cpu_count() or 1) // workers)
    deadline = None if max_seconds is None else time.time() + max_seconds
    # A grid point runs all its epochs (no --biosyn-max-seconds): a truncated run would be scored unfairly.
    jobs = [(p, replace(base_config, threads=threads, max_seconds=None, **p), train_spec, dev_spec, dictionary, encoder,
             work / grid_key(p), deadline) for p in todo]
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: CUDA cannot be used in a forked child
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(run_grid_point, *job) for job in jobs]):
                record_grid_point(report, future.result(), grid, path, data)
    else:
        for job in jobs:
            record_grid_point(report, run_grid_point(*job), grid, path, data)
    if report.get("chosen") is None:
        raise SystemExit(f"{path}: no grid point was run")


def run_grid_point(params: dict, config: BiosynConfig, train_spec: str, dev_spec: str, dictionary: Path,
                   encoder: str, folder: Path, deadline: float | None) -> dict:
    """One grid point (in a worker process when the grid runs in parallel): its dev curve, model deleted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if deadline is not None and time.time() > deadline:
        log.info("grid %s: not run (--grid-seconds passed)", grid_key(params))
        return {"params": params, "dev_acc1": None, "not_run": "--grid-seconds passed before it started"}
    result = train_biosyn([train_spec], dictionary, encoder=encoder, out=folder, config=config,
                          monitor=load_dataset(dev_spec), overwrite=True)
    metrics = json.loads((folder / "train_metrics.json").read_text())
    shutil.rmtree(folder)  # only its dev curve is kept
    point = {"params": params, "dev_acc1": metrics["extra"]["monitor_dense_acc1_after_training"],
             "dev_acc1_before_epoch": [e["monitor_dense_acc1_before_epoch"] for e in metrics["epochs"]],
             "train_acc1_before_epoch": [e["train_dense_acc1_before_epoch"] for e in metrics["epochs"]],
             "mean_loss": [e["mean_loss"] for e in metrics["epochs"]], "sparse_weight": result["sparse_weight"],
             "queries": result["queries"], "seconds": round(result["train_seconds"], 1),
             "hardware": result["hardware"], "precision": result["precision"]}
    log.info("grid %s: dev Acc@1 %.4f (%.0fs)", grid_key(params), point["dev_acc1"], point["seconds"])
    return point


def record_grid_point(report: dict, point: dict, grid: list[dict], path: Path, data: Path | None) -> None:
    """Add a finished point, choose again (ties: the point listed first), rewrite the grid report."""
    report["points"][grid_key(point["params"])] = point
    report["points"] = {grid_key(p): report["points"][grid_key(p)] for p in grid if grid_key(p) in report["points"]}
    scored = [(p["dev_acc1"], -i, k) for i, (k, p) in enumerate(report["points"].items()) if p["dev_acc1"] is not None]
    best = max(scored)[2] if scored else None
    report["chosen"] = {"key": best, **report["points"][best]} if best else None
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        tmp.write_text(portable_paths(json.dumps(report, indent=2), root=ROOT, data=data))


def trained_key(sap_model: Path | None) -> str:
    return "sap_biosyn" if sap_model else "biosyn"


def sap_summary(sap_model: Path | None) -> dict | None:
    if sap_model is None:
        return None
    metrics = json.loads((sap_model / "train_metrics.json").read_text())
    return {"model": str(sap_model), "pairs": metrics["extra"]["pairs"], "seconds": metrics["extra"]["train_seconds"],
            "config": json.loads((sap_model / "train_config.json").read_text())["config"],
            "first_step_loss": metrics["steps"][0]["loss"], "last_step_loss": metrics["steps"][-1]["loss"]}


def curve(r: dict, path: Path) -> None:
    """Dense Acc@1 per epoch on the training queries and on the watched test mentions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bio, grid = r["training"]["biosyn"], r["training"].get("grid")
    epochs = bio["epochs"]
    xs = [e["epoch"] - 1 for e in epochs]
    fig, axes = plt.subplots(1, 2 if grid else 1, figsize=(12 if grid else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(xs, [e["train_dense_acc1_before_epoch"] for e in epochs], marker="o", label="train+dev queries")
    watched = [(x, e.get("monitor_dense_acc1_before_epoch")) for x, e in zip(xs, epochs)]
    if bio.get("monitor_acc1_after_training") is not None:
        watched.append((len(epochs), bio["monitor_acc1_after_training"]))
    watched = [(x, y) for x, y in watched if y is not None]
    if watched:
        ax.plot(*zip(*watched), marker="s", label="test mentions (watched, not used to choose)")
    ax.set_xlabel("epochs trained")
    ax.set_ylabel("dense Acc@1 vs MEDIC (training dictionary)")
    ax.set_title("BioSyn on NCBI-disease: training curve")
    ax.grid(alpha=0.3)
    ax.legend()
    if grid:
        dev = axes[0][1]
        for key, p in grid["points"].items():
            if p.get("dev_acc1") is not None:
                ys = [*p["dev_acc1_before_epoch"], p["dev_acc1"]]
                q = p["params"]
                dev.plot(range(len(ys)), ys, marker="o" if key == grid["chosen"]["key"] else None,
                         label=f"lr {q['lr']}, batch {q['batch_size']}, topk {q['topk']}")
        dev.set_xlabel("epochs trained (train split only)")
        dev.set_ylabel("dense Acc@1 on dev vs MEDIC")
        dev.set_title("the dev grid (marked: chosen)")
        dev.grid(alpha=0.3)
        dev.legend(fontsize=7)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def trained_on(bio: dict) -> str:
    hw = bio.get("hardware") or {}
    where = hw.get("gpu") or f"{hw.get('cpu_count')} CPU cores, {hw.get('torch_threads')} torch threads"
    return f"{where} ({hw.get('device', 'cpu')}, torch {hw.get('torch')}, forward passes in {bio.get('precision')})"


def grid_lines(grid: dict | None) -> list[str]:
    """The dev grid that chose BioSyn's lr, batch size and top-k (scripts/ncbi_biosyn.py --grid)."""
    if not grid:
        return []
    chosen, with_epochs = grid["chosen"], grid.get("chosen_with_epochs")
    final = (f"the point and epoch count of the best dev Acc@1 over every epoch of every point (`--choose-epochs`): "
             f"lr {with_epochs['params']['lr']}, batch {with_epochs['params']['batch_size']}, topk "
             f"{with_epochs['params']['topk']}, {with_epochs['epochs']} epochs (dev {100 * with_epochs['dev_acc1']:.2f}; "
             "ties: fewer epochs)" if with_epochs else
             f"the chosen point, lr {chosen['params']['lr']}, batch {chosen['params']['batch_size']}, topk "
             f"{chosen['params']['topk']}")
    lines = [
        "",
        f"**Chosen on dev** (`--grid`, grid report `{Path(grid['report']).name}`): each point trained BioSyn from the "
        f"same start on the train split alone ({chosen['queries']['queries']:,} queries) for {grid['epochs']} epochs "
        f"and was scored by {grid['score']} (dev: {grid['dev']}; bold: the best after the last epoch, ties to the "
        f"point listed first); the final model above was then trained on train+dev with {final}. "
        f"{grid['workers']} points trained at once on {trained_on(chosen)}.",
        "",
        "| lr | batch | topk | dev Acc@1 after the last epoch | best dev Acc@1 over epochs (epoch) | train Acc@1 before "
        "the last epoch | learned sparse weight | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, p in grid["points"].items():
        q = p["params"]
        if p.get("dev_acc1") is None:
            lines.append(f"| {q['lr']} | {q['batch_size']} | {q['topk']} | not run: {p.get('not_run')} | | | | |")
            continue
        curve = dev_curve(p)
        best = max(range(len(curve)), key=lambda i: (curve[i], -i))
        mark = "**" if key == chosen["key"] else ""
        lines.append(f"| {mark}{q['lr']}{mark} | {mark}{q['batch_size']}{mark} | {mark}{q['topk']}{mark} "
                     f"| {mark}{100 * p['dev_acc1']:.2f}{mark} | {100 * curve[best]:.2f} ({best + 1}) "
                     f"| {100 * p['train_acc1_before_epoch'][-1]:.2f} | {p['sparse_weight']:.3f} | {p['seconds']:.0f} |")
    return lines


def _pct(value: float) -> float:
    return round(100 * value, 2)


def markdown(r: dict) -> str:
    sap, bio = r["training"]["sap"], r["training"]["biosyn"]
    hard_n = r["rows"][0]["any"]["filtered02_n"]
    lines = [
        "# NCBI-disease under BioSyn's protocol, trained here",
        "",
        f"Produced by `{r['command']}` (see the script's docstring for each step of the protocol).",
        f"Test: {r['rows'][0]['any']['n']} NCBI-disease test mentions, rewritten as BioSyn's preprocessing does "
        "(abbreviations from the abstract, typo list, composites split, lower case, no punctuation). "
        f"Dictionary: MEDIC plus the train+dev mentions, {r['dictionary']['names']:,} names "
        f"(MEDIC alone: {r['dictionary']['medic_names']:,}).",
        "",
        "*BioSyn rule*: a split composite counts when each part's top-k holds any of its gold ids (BioSyn's "
        "`check_label`); *all*: every gold concept must be found. *Filtered0.2*: the test mentions that are "
        f"neither equal nor close (normalised Levenshtein < 0.2) to a train+dev mention, n = {hard_n}.",
        "",
        "| system | Acc@1 (BioSyn rule) | Acc@5 (BioSyn rule) | Acc@1 95% CI | Acc@1 (all) | Acc@5 (all) "
        "| Filtered0.2 Acc@1 | Filtered0.2 Acc@5 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        a, s = row["any"], row["all"]
        lo, hi = a["acc1_interval"]
        lines.append(f"| {row['system']} | {a['acc1']:.2f} | {a['acc5']:.2f} | [{lo:.2f}, {hi:.2f}] | {s['acc1']:.2f} "
                     f"| {s['acc5']:.2f} | {a['filtered02_acc1']:.2f} | {a['filtered02_acc5']:.2f} |")
    for p in r["published"]:
        lines.append(f"| *published:* {p['system']} | {p['acc1']} | {p['acc5']} | | | | | |")
    epochs = bio["epochs"]
    lines += [
        "",
        "## Training",
        "",
        *([f"- **sap** on MEDIC synonym pairs: {sap['pairs']['pairs']:,} pairs, batch {sap['config']['batch_size']}, "
            f"lr {sap['config']['lr']}, {sap['config']['epochs']} epoch, {sap['seconds']:.0f} s; step loss "
            f"{sap['first_step_loss']:.3f} -> {sap['last_step_loss']:.3f}."] if sap else
          ["- **sap**: skipped (`--sap-pairs 0`); BioSyn starts from the base encoder."]),
        f"- **biosyn** from the {'sap' if sap else 'base'} model: {bio['queries']['queries']:,} unique single-concept "
        f"train+dev queries ({bio['queries']['composite_dropped']} composite mentions dropped), candidates from MEDIC, "
        f"topk {bio['config']['topk']}, dense ratio {bio['config']['dense_ratio']}, batch {bio['config']['batch_size']}, "
        f"lr {bio['config']['lr']}, {len(epochs)} epochs, {bio['seconds']:.0f} s "
        f"{'after the resume' if bio.get('resumed') else 'in all'} (candidate refresh included); "
        f"learned sparse weight {bio['sparse_weight']:.4f}; trained on {trained_on(bio)}."
        + (" **Stopped by the time budget** (`--biosyn-max-seconds`) after step {step_in_epoch} of {steps_per_epoch} "
           "of epoch {epoch}.".format(**bio["stopped_at_time_budget"]) if bio.get("stopped_at_time_budget") else ""),
        *grid_lines(r["training"].get("grid")),
        "",
        "The curve (`" + r["report_name"] + "_curve.png`) watches dense Acc@1 against MEDIC alone on the test set's "
        "single-concept mentions; the epochs are fixed (by the protocol, or on dev), so it chose nothing. "
        f"After the last epoch: {bio.get('monitor_acc1_after_training')}"
        + (f" on the training machine, {bio['monitor_acc1_recomputed_here']} recomputed on the scoring machine from the "
           "weights as carried there (scripts/model_transfer.py: fp16 shards)" if bio.get("monitor_acc1_recomputed_here")
           is not None else "") + "."
        + (" The run was resumed from its last epoch checkpoint (model and optimizer state restored; each epoch's "
           "order and dropout are seeded, so it repeats an uninterrupted run up to GPU non-determinism)."
           if bio.get("resumed") else ""),
        "",
        "| epoch | mean loss | train dense Acc@1 before the epoch | test (watched) dense Acc@1 before the epoch "
        "| queries without a positive candidate | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {e['epoch']} | {e['mean_loss']} | {e['train_dense_acc1_before_epoch']} | "
              f"{e.get('monitor_dense_acc1_before_epoch')} | {e['queries_without_positive']} | {e['seconds']:.0f} |"
              for e in epochs]
    hw = r["hardware"]
    lines += [
        "",
        f"Hardware: {hw['cpu_count']} CPU cores ({hw['processor'] or hw['machine']}), torch {hw['torch']} with "
        f"{hw['torch_threads']} threads, GPU: {hw['gpu']}; load average at the end {hw['load_average_at_end']}. "
        f"Wall seconds per stage: {r['stage_seconds']}."
        + (f" {r['stage_seconds_note']}" if r.get("stage_seconds_note") else ""),
        "",
        "Differences from the published setting: the encoder is all-MiniLM-L6-v2 (general domain, 22M parameters) "
        "instead of BioBERT (biomedical, 110M); abbreviations come from our Schwartz & Hearst detector instead of "
        "Ab3P; cosine scores with temperature 0.05 instead of BERT [CLS] dot products (see `linker.train.biosyn`).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
