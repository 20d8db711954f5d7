"""Multilingual e5-small before/after CPU-sized training: Cantemist (BioSyn) and Mantra GSC (SapBERT-style).

    .venv/bin/python scripts/train_multilingual.py cantemist [--biosyn-queries 256] [--epochs 1] [--threads 1]
    .venv/bin/python scripts/train_multilingual.py cantemist --biosyn-queries 0 --epochs 3 --with-train-names  # all
    .venv/bin/python scripts/train_multilingual.py mantra [--sap-pairs 1024] [--threads 1]
    .venv/bin/python scripts/train_multilingual.py codiesp [--threads 1]
    .venv/bin/python scripts/train_multilingual.py codiesp --biosyn-queries 0 --epochs 2 --threads 2  # all
    # full size (Makefile eval-multilingual-full; trained on a lent GPU by scripts/gpu_multilingual.sh):
    .venv/bin/python scripts/train_multilingual.py mantra --sap-pairs 0 --doid --sap-batch 256
    .venv/bin/python scripts/train_multilingual.py codiesp --biosyn-queries 0 --epochs 10 \
        --sap-model models/mantra-e5-sap-all-doid

cantemist: dictionary = ICD-O names of valid-codes.tsv (built as scripts/eval_all.py does);
  `train_biosyn` of e5-small on a seeded sample of the Cantemist train mentions (embeddings and the
  lower encoder layers frozen, as the Medical Crossing study did); dense indexes with e5-small before
  and after; Cantemist test scored Full / dict / train filters; optionally the same two encoders on
  the dictionary that adds the train mentions as names (eval_all.py's "ICD-O names + train mentions").
  Writes eval/train_multilingual/train_cantemist_e5.md|json. `--biosyn-queries 0` trains on every unique train mention
  (model models/cantemist-e5-biosyn-all, report eval/train_multilingual/train_cantemist_e5_all.md|json): the run resumes
  from its last finished epoch (BioSyn checkpoints after each), and the dev1 mentions are watched
  before every epoch and after the last (dense Acc@1 against the training dictionary, a curve in
  eval/<report>_curve.png; dev1 is not trained on, and nothing is chosen by it). A run stopped after
  epoch e finishes with `--epochs e` from that checkpoint; a finished model asked for more `--epochs` is
  trained on from its weights with a fresh optimizer (its checkpoint is gone; the report's training section
  records the epochs where the optimizer restarted); `--max-seconds` stops training after the
  step that passes this budget and saves the model (on shared CPUs, to end by a given time).
mantra: dictionary = HPO with its es/fr/nl/de translations (eval_all.py's hpo_translations table;
  the Disease Ontology is left out with --no-doid, the default here, because one e5-small pass over
  its extra 18k names costs ~80 s and two dense builds over all 118k names do not fit the time box);
  `train_sap` of e5-small on the cross-lingual synonym pairs of that table; Mantra GSC scored per
  language, gold via the terms' UMLS xrefs. Writes eval/train_multilingual/train_mantra_e5.md|json.
codiesp: the same two encoders (e5-small, and e5-small + the mantra part's cross-lingual sap on HPO,
  trained first if missing) on CodiEsp-D test: Spanish mentions against the English ICD-10-CM names
  (eval_all.py's icd10cm table), Full and the training-set filters. Writes eval/train_multilingual/train_codiesp_e5.md|json.
  `--biosyn-queries 0` instead trains BioSyn on every unique CodiEsp-D train mention (Spanish) against
  those English names (model models/codiesp-e5-biosyn-all, dev = devX watched per epoch, resumable as
  for cantemist) and writes eval/train_multilingual/train_codiesp_e5_all.md|json|_curve.png; the dictionary with the train
  mentions added is scored by `scripts/hybrid_tuning.py codiesp --encoder models/codiesp-e5-biosyn-all`.

Full size: `mantra --sap-pairs 0` trains sap on every pair (SapBERT's cap of 50 per concept; with --doid
the Disease Ontology's synonyms too, model models/mantra-e5-sap-all-doid, report
eval/train_multilingual/train_mantra_e5_all_doid.md), and `--sap-model` starts the cantemist / codiesp BioSyn runs from it (models
<part>-e5-sap-biosyn-all, reports eval/train_<part>_e5_sap_all.md). A BioSyn model trained on another kind of
machine has its watched dev number recomputed here from the carried weights (`watched_acc1`).

Every stage is skipped when its output exists, so an interrupted run resumes. Sizes are chosen for
2 shared CPU cores; the numbers show what the code does at this size, not what the methods reach.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from linker.dictionary import (
    SourceSpec,
    build_dictionary,
    merge_tables,
    read_concept_table,
)
from linker.eval.report import evaluate, markdown_table
from linker.fileio import atomic_file, portable_paths
from linker.index import build_index
from linker.index.dense import DenseConfig
from linker.eval.datasets import load_dataset
from linker.train import common
from linker.train.biosyn import BiosynConfig, train_biosyn, watched_acc1
from linker.train.sap import SapConfig, train_sap
from stages import Stages, index_current, recheck_carried  # scripts/stages.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("train_multilingual")
PUBLISHED = {
    # Medical Crossing paper, Cantemist, SapBERT (XLM-R, all-lang) + target-language training:
    # Full / Filtered (train) / Filtered0.2 (train), Acc@1 / Acc@5
    "codiesp": [("tf-idf, Medical Crossing paper", {"full": (20.55, 39.24)}),
                ("SapBERT+target, Medical Crossing paper (ICD-10-CM names + train mentions)",
                 {"full": (67.18, None), "train": (47.62, None), "train0.2": (45.42, None)})],
    "cantemist": [("SapBERT+target, Medical Crossing paper", {"full": (79.45, 87.76), "train": (53.31, 68.54),
                                                               "train0.2": (51.48, 66.10)})],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["cantemist", "mantra", "codiesp"])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "train_multilingual")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "train_multilingual")
    parser.add_argument("--eval-indexes", type=Path, default=ROOT / "indexes" / "eval",
                        help="scripts/eval_all.py's folder: its dictionaries are reused when present")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--biosyn-queries", type=int, default=256, help="0: every unique train mention")
    parser.add_argument("--epochs", type=int, default=1, help="BioSyn epochs (cantemist)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="BioSyn time budget per run: stop after the step that passes it and save the model")
    parser.add_argument("--max-length", type=int, default=25, help="BioSyn tokens per mention or name (BioSyn: 25)")
    parser.add_argument("--freeze-layers", type=int, default=4)  # Medical Crossing froze embeddings + 4 or 10 layers
    parser.add_argument("--sap-pairs", type=int, default=1024, help="0: every synonym and translation pair "
                        "(SapBERT's cap of 50 pairs per concept); model models/mantra-e5-sap-all")
    parser.add_argument("--sap-batch", type=int, default=64)  # 256 pairs/step of the paper do not fit the time box
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--with-train-names", action="store_true", help="cantemist: also the dict + train mentions variant")
    parser.add_argument("--doid", action="store_true",
                        help="mantra: add the Disease Ontology to the dictionary, and to sap's pairs (model name -doid)")
    parser.add_argument("--sap-model", type=Path, default=None,
                        help="cantemist / codiesp with --biosyn-queries 0: start BioSyn from this cross-lingual sap "
                             "model (the mantra part's) instead of e5-small; model <part>-e5-sap-biosyn-all")
    parser.add_argument("--note", default="", help="free text for the report (how the stages were run)")
    parser.add_argument("--index-only", choices=["base", "trained", "train"], default=None,
                        help="only build that dense index and exit: run 'base' and 'trained' as two 1-thread "
                             "processes to use both cores, then run without it to evaluate; 'train': only "
                             "build the dictionaries and train (on a GPU machine: scripts/gpu_multilingual.sh)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    full = args.part in ("cantemist", "codiesp") and args.biosyn_queries == 0  # BioSyn on all train mentions
    if args.sap_model is not None and not full:
        raise SystemExit("--sap-model starts BioSyn on every train mention: use it with cantemist / codiesp "
                         "and --biosyn-queries 0")
    if args.sap_model is not None and not (args.sap_model / "train_metrics.json").is_file():
        raise SystemExit(f"--sap-model {args.sap_model}: no finished model there (train_metrics.json missing); "
                         "train it first: scripts/train_multilingual.py mantra --sap-pairs 0 --doid")
    sap_tag = ("_all" if args.sap_pairs == 0 else "") + ("_doid" if args.doid else "")  # mantra's sap run
    if args.part == "mantra":
        name = f"train_mantra_e5{sap_tag}"
    else:
        name = f"train_{args.part}_e5" + ("_sap" if args.sap_model else "") + ("_all" if full else "")
    state = {"part": args.part, "note": args.note, "full": full, "report_name": name,
             "command": " ".join(["python", "scripts/train_multilingual.py", *sys.argv[1:]]), "stage_seconds": {}, "load_average_after_stage": {}, "rows": [],
             "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "args": {k: str(v) for k, v in vars(args).items()},
             "hardware": {"cpu_count": os.cpu_count(), "torch_threads": args.threads, "machine": platform.machine(),
                          "torch": torch.__version__, "gpu": torch.cuda.is_available(),
                          "note": "2 CPU cores shared with other jobs; times are wall-clock under that load "
                                  "(load averages below; --note says what ran beside)"}}
    stage = Stages(args.out / f"{name}.json")  # keeps the timings of stages a re-run skips
    state["stage_seconds"], state["load_average_after_stage"] = stage.seconds, stage.load_after

    def dense(dict_path: Path, folder: Path, encoder: str) -> Path:
        if args.index_only and (encoder == "e5-small") != (args.index_only == "base"):
            return folder
        stage(f"index_{folder.name}", index_current(folder, encoder),
              lambda: build_index(dict_path, kind="dense", out=folder, config=DenseConfig(encoder=encoder),
                                  overwrite=True))
        return folder

    reports = []

    def score(label: str, index_dir: Path, dataset: str, **kw) -> None:
        if args.index_only:
            return
        started = time.perf_counter()
        report = evaluate(index_dir, dataset, ks=(1, 5), **kw)
        reports.append((label, report))
        rows = [{"filter": r.filter, "lang": r.lang, "n": r.n, "acc1": round(100 * r.acc(1).value, 2),
                 "acc5": round(100 * r.acc(5).value, 2)} for r in report.rows]
        state["rows"].append({"system": label, "index": str(index_dir), "eval_seconds": round(time.perf_counter() - started, 1),
                              "rows": rows})
        full = report.row("full")
        log.info("%s: Acc@1 %.2f Acc@5 %.2f (n=%d)", label, 100 * full.acc(1).value, 100 * full.acc(5).value, full.n)
        write(args.out, name, state, reports, data=args.data)  # partial results survive a cut-off run

    def biosyn(model: Path, train: str, dictionary: Path, dev: str, dataset: str, names: str) -> None:
        """BioSyn of e5-small on `train` against `dictionary` (the cantemist and codiesp parts); with every
        train mention (`full`), `dev` is watched per epoch and drawn as the training curve."""
        config = BiosynConfig(max_queries=args.biosyn_queries or None, epochs=args.epochs, freeze_embeddings=True,
                              freeze_layers=args.freeze_layers, threads=args.threads, max_seconds=args.max_seconds,
                              max_length=args.max_length)
        start = str(args.sap_model) if args.sap_model else "e5-small"
        # A finished model with fewer epochs than asked is trained on (a fresh optimizer: its checkpoint is gone).
        finished = common.finished_metrics(model)
        done = finished is not None and ("stopped_at_time_budget" in finished.extra or len(finished.epochs) >= args.epochs)
        stage("train_biosyn", done or args.index_only in ("base", "trained"),
              lambda: train_biosyn(train, dictionary, encoder=start, out=model, config=config,
                                   monitor=load_dataset(dev) if full else None,
                                   resume=finished is not None or common.checkpoint_dir(model).exists()))
        if not common.finished_metrics(model):  # --index-only base: nothing trained yet
            return
        state["training"] = training_summary(model)
        if full and args.index_only != "train":  # a GPU machine that only trains may lack matplotlib
            state["training"]["monitor"] = dev
            curve(state["training"], args.out / f"{name}_curve.png", dataset, names,
                  "e5-small + cross-lingual sap" if args.sap_model else "e5-small")
            state["training"]["monitor_acc1_recomputed_here"] = recheck_carried(
                stage, model, args.work / f"{model.name}_watched_here.json",
                lambda: {"watched_dense_acc1_here": watched_acc1(model, dictionary, dev, config)})

    # the BioSyn model's tag in model, index and row names (cantemist, codiesp)
    tag = ("sap_" if args.sap_model else "") + ("biosyn_all" if full else "biosyn")
    label = tag.replace("_", " + ", 1) if args.sap_model else tag  # "sap + biosyn_all"
    if args.part == "cantemist":
        cantemist = args.data / "cantemist"
        test, train = f"brat:{cantemist / 'test.zip'}#lang=es", f"brat:{cantemist / 'train.zip'}#lang=es"
        icdo = reuse(args.eval_indexes / "icdo.parquet", args.work / "icdo.parquet",
                     [SourceSpec("icdo", (cantemist / "valid-codes.tsv",))])
        state["dictionary"] = describe(icdo)
        model = args.models / f"cantemist-e5-{tag.replace('_', '-')}"
        biosyn(model, train, icdo, f"brat:{cantemist / 'dev1.zip'}#lang=es", "Cantemist", "ICD-O names")
        if args.index_only == "train":  # the training section and curve only; rows come from a later run
            return write(args.out, name, state, reports, data=args.data)
        score("dense e5-small, ICD-O names (es)", dense(icdo, args.work / "icdo_e5", "e5-small"), test,
              train_spec=train, filters=("all",))
        score(f"dense e5-small + {label}, ICD-O names (es)", dense(icdo, args.work / f"icdo_e5_{tag}", str(model)), test,
              train_spec=train, filters=("all",))
        if args.with_train_names:
            icdo_train = args.eval_indexes / "icdo_train.parquet"  # eval_all.py: ICD-O names + train mentions
            if not icdo_train.exists():
                raise SystemExit(f"{icdo_train} missing: run scripts/eval_all.py first")
            state["dictionary_with_train_names"] = describe(icdo_train)
            score("dense e5-small, ICD-O names + train mentions", dense(icdo_train, args.work / "icdo_train_e5", "e5-small"),
                  test, train_spec=train, filters=("all",))
            score(f"dense e5-small + {label}, ICD-O names + train mentions",
                  dense(icdo_train, args.work / f"icdo_train_e5_{tag}", str(model)), test, train_spec=train,
                  filters=("all",))
    elif not full:  # mantra, and codiesp's HPO sap row (the BioSyn run above needs no sap model)
        hpo_dir = args.data / "hpo"
        hp_files = (sorted(hpo_dir.glob("hp.obo*")) + sorted(hpo_dir.glob("hp-*.babelon.tsv"))
                    + sorted(hpo_dir.glob("hp-*.synonyms.tsv")))
        hp = reuse(args.eval_indexes / "hpo_translations.parquet", args.work / "hpo_translations.parquet",
                   [SourceSpec("obo", tuple(hp_files))])
        dictionary = hp
        if args.doid:
            doid = reuse(args.eval_indexes / "doid.parquet", args.work / "doid.parquet",
                         [SourceSpec("obo", tuple(sorted((args.data / "doid").glob("*.obo*"))))])
            dictionary = args.work / "hpo_doid.parquet"
            if not dictionary.exists():
                merge_tables([hp, doid], dictionary)
        # cross-lingual sap on the synonym and translation pairs of that dictionary, shared by both parts
        model = args.models / f"mantra-e5-sap{sap_tag.replace('_', '-')}"
        config = SapConfig(max_pairs=args.sap_pairs or None, batch_size=args.sap_batch, freeze_embeddings=True,
                           threads=args.threads)
        stage("train_sap", (model / "train_metrics.json").exists() or args.index_only in ("base", "trained"),
              lambda: train_sap(dictionary, encoder="e5-small", out=model, config=config))
        if (model / "train_metrics.json").exists():
            state["training"] = training_summary(model)
        if args.index_only == "train":
            state["dictionary"] = describe(dictionary if args.part == "mantra" else hp)
            return write(args.out, name, state, reports, data=args.data)
    if args.part == "mantra":
        state["dictionary"] = describe(dictionary)
        test = f"brat:{args.data / 'mantra_gsc' / 'Mantra-GSC-brat.zip'}"
        stem = dictionary.stem
        score(f"dense e5-small, {stem}", dense(dictionary, args.work / f"{stem}_e5", "e5-small"), test,
              filters=("full", "dict", "dict0.2"), gold_via_xref="UMLS")
        score(f"dense e5-small + sap, {stem}", dense(dictionary, args.work / f"{stem}_e5_sap{sap_tag}", str(model)), test,
              filters=("full", "dict", "dict0.2"), gold_via_xref="UMLS")
    elif args.part == "codiesp":
        codiesp = args.data / "codiesp"
        test, train = f"codiesp:{codiesp / 'testX.tsv'}#D", f"codiesp:{codiesp / 'trainX.tsv'}#D"
        icd = reuse(args.eval_indexes / "icd10cm.parquet", args.work / "icd10cm.parquet", [SourceSpec("icd10", ())])
        state["dictionary"] = describe(icd)
        score("dense e5-small, ICD-10-CM names (en)", dense(icd, args.work / "icd10cm_e5", "e5-small"), test,
              train_spec=train, filters=("all",))
        if full:  # BioSyn on every train mention against the English names: Spanish -> English by training
            model = args.models / f"codiesp-e5-{tag.replace('_', '-')}"
            biosyn(model, train, icd, f"codiesp:{codiesp / 'devX.tsv'}#D", "CodiEsp-D", "ICD-10-CM names (en)")
            if args.index_only == "train":
                return write(args.out, name, state, reports, data=args.data)
            score(f"dense e5-small + {label}, ICD-10-CM names (en)",
                  dense(icd, args.work / f"icd10cm_e5_{tag}", str(model)), test, train_spec=train,
                  filters=("all",))
        else:
            score("dense e5-small + sap (HPO cross-lingual pairs), ICD-10-CM names (en)",
                  dense(icd, args.work / "icd10cm_e5_sap", str(model)), test, train_spec=train, filters=("all",))
    state["tfidf_rows"] = tfidf_rows(ROOT / "eval" / "accuracy" / "summary.json", {"codiesp": "codiesp_d"}.get(args.part, args.part))
    write(args.out, name, state, reports, data=args.data)
    print((args.out / f"{name}.md").read_text())


def tfidf_rows(summary: Path, group: str) -> list[str]:
    """eval_all.py's tf-idf rows of this dataset (Full and train filters), to print beside the dense ones."""
    if not summary.exists():
        return []
    lines = []
    for ev in json.loads(summary.read_text())["evaluations"]:
        if ev["group"] != group:
            continue
        cells = [f"{r['filter']} {r['lang']} n={r['n']:,} " + " / ".join(f"{100 * a['value']:.2f}" for a in r["accuracies"])
                 for r in ev["rows"] if r["filter"] in ("full", "train", "train0.2") and r["lang"] == "all"]
        lines.append(f"{ev['label']}: " + "; ".join(cells))
    return lines


def reuse(existing: Path, fallback: Path, sources: list[SourceSpec]) -> Path:
    """eval_all.py's table when it exists (same sources), else build it here."""
    if existing.exists():
        return existing
    if not fallback.exists():
        build_dictionary(sources, fallback)
    return fallback


def describe(path: Path) -> dict:
    table = read_concept_table(path).table
    langs: dict[str, int] = {}
    for lang in table.column("lang").to_pylist():
        langs[lang] = langs.get(lang, 0) + 1
    return {"path": str(path), "names": table.num_rows, "concepts": len(set(table.column("concept_id").to_pylist())),
            "names_per_lang": dict(sorted(langs.items()))}


def training_summary(model: Path) -> dict:
    metrics = json.loads((model / "train_metrics.json").read_text())
    config = json.loads((model / "train_config.json").read_text())
    steps = metrics["steps"]
    return {"model": str(model), "config": config.get("config"), "data": config.get("data"), "extra": metrics["extra"],
            "epochs": metrics["epochs"], "steps": len(steps), "first_step_loss": steps[0]["loss"] if steps else None,
            "last_step_loss": steps[-1]["loss"] if steps else None}


def curve(t: dict, path: Path, dataset: str, dictionary: str, start: str) -> None:
    """Dense Acc@1 of the watched (dev) mentions before each epoch and after the last: is more training worth it?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    points = [e["monitor_dense_acc1_before_epoch"] for e in t["epochs"]] + [t["extra"]["monitor_dense_acc1_after_training"]]
    train = [e["train_dense_acc1_before_epoch"] for e in t["epochs"]]
    x = list(range(len(points)))
    stopped = t["extra"].get("stopped_at_time_budget")
    if stopped:  # the last epoch ended early: its point sits at the share of that epoch trained
        x[-1] = x[-2] + stopped["step_in_epoch"] / stopped["steps_per_epoch"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, [100 * p for p in points], marker="o", label="dev mentions (watched, not trained on)")
    ax.plot(range(len(train)), [100 * p for p in train], marker="s", label="training queries")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=not stopped))
    ax.set_xlabel("epochs trained")
    ax.set_ylabel(f"dense Acc@1 vs {dictionary} (%)")
    ax.set_title(f"BioSyn on all {dataset} train mentions from {start}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def write(out: Path, name: str, state: dict, reports, *, data: Path) -> None:
    state["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if (out / f"{name}.json").exists():  # another process (--index-only) may have timed other stages meanwhile
        old = json.loads((out / f"{name}.json").read_text())
        for key in ("stage_seconds", "load_average_after_stage"):  # in place: `stage` keeps adding to these dicts
            for label, value in old.get(key, {}).items():
                state[key].setdefault(label, value)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / f"{name}.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(state, indent=2, default=str), root=ROOT, data=data))
    with atomic_file(out / f"{name}.md") as tmp:
        tmp.write_text(portable_paths(markdown(state, reports), root=ROOT, data=data))


def markdown(s: dict, reports) -> str:
    d, t = s["dictionary"], s.get("training", {})
    sap_all = (t.get("config") or {}).get("max_pairs", 0) is None  # sap on every pair
    from_sap = " from the cross-lingual sap model" if s["args"].get("sap_model") not in (None, "None") else ""
    title = {"cantemist": "Cantemist test: e5-small before / after BioSyn training "
                          + (f"on all train mentions{from_sap}" if s.get("full") else "(CPU-sized)"),
             "mantra": "Mantra GSC: e5-small before / after SapBERT-style training "
                       + ("on every cross-lingual synonym pair" if sap_all else "(CPU-sized)"),
             "codiesp": "CodiEsp-D: e5-small before / after "
                        + (f"BioSyn training on all train mentions{from_sap}" if s.get("full")
                           else "cross-lingual SapBERT-style training on HPO (CPU-sized)")}[s["part"]]
    lines = [f"# {title}", "", f"Produced by `{s.get('command', 'scripts/train_multilingual.py ' + s['part'])}`. "
             "Acc@k in %; n = mentions.",
             "", (f"Dictionary: {d['path']}, {d['names']:,} names of {d['concepts']:,} concepts; names per language "
                  f"{d['names_per_lang']}.")]
    if "dictionary_with_train_names" in s:
        e = s["dictionary_with_train_names"]
        lines.append(f"With train mentions: {e['path']}, {e['names']:,} names of {e['concepts']:,} concepts.")
    if s["part"] == "mantra":
        lines += ["", ("Gold ids are UMLS CUIs; a predicted HPO term counts through its UMLS xrefs. *in dict %* is the "
                       "share of mentions whose gold CUI is reachable at all through the dictionary's xrefs (the ceiling "
                       "of every row). Unless --doid, the Disease Ontology of eval_all.py's tf-idf row is left out here, "
                       "so that tf-idf row (HPO + translations + DOID) is not the same dictionary.")]
    lines += ["", markdown_table(reports, reach=True) if reports else "(no evaluation finished)", ""]
    for label, cols in PUBLISHED.get(s["part"], []):
        lines.append(f"Published: {label}: " + "; ".join(f"{k} {a1:.2f}" + ("" if a5 is None else f" / {a5:.2f}")
                                                        for k, (a1, a5) in cols.items()))
    for row in s.get("tfidf_rows", []):
        lines.append(f"tf-idf (eval/accuracy/summary.json, same test set): {row}")
    if t:
        lines += ["", "## Training run", "", f"Model {t['model']}; config {t['config']}; data {t['data']}.",
                  f"Training data: {t['extra']}.",
                  f"{t['steps']} steps; step loss {t['first_step_loss']} -> {t['last_step_loss']}; epochs {t['epochs']}."]
        stopped = t["extra"].get("stopped_at_time_budget")
        if stopped:
            lines.append(f"Stopped by the time budget (--max-seconds) after step {stopped['step_in_epoch']} of "
                         f"{stopped['steps_per_epoch']} of epoch {stopped['epoch']}.")
        restarted = t["extra"].get("optimizer_restarted_before_epoch")
        if restarted:
            lines.append(f"The finished model was trained on for more epochs: a fresh optimizer (Adam state reset) before "
                         f"epoch {', '.join(map(str, restarted))}, so not the same as an uninterrupted run.")
        if t.get("monitor"):
            watched = [e["monitor_dense_acc1_before_epoch"] for e in t["epochs"]]
            watched.append(t["extra"]["monitor_dense_acc1_after_training"])
            lines += ["", f"Training curve (`{s['report_name']}_curve.png`): dense Acc@1 of the watched `{t['monitor']}` "
                          "mentions against the training dictionary, before each epoch and after the last: "
                          + ", ".join(f"{100 * a:.2f}" for a in watched) + ". They are not trained on and choose nothing."]
            if t.get("monitor_acc1_recomputed_here") is not None:
                lines.append(f"Trained on {t['extra']['hardware'].get('device')} and carried here: the last of these "
                             f"recomputed here from the carried weights reads {100 * t['monitor_acc1_recomputed_here']:.2f}.")
    h = s["hardware"]
    lines += ["", (f"Hardware: {h['cpu_count']} CPU cores, no GPU (cuda: {h['gpu']}), torch {h['torch']} with "
                   f"{h['torch_threads']} thread(s) in the run that wrote this report. {h['note']}."),
              (f"Wall seconds per stage: {s['stage_seconds']}; load average (1, 5, 15 min) at start "
               f"{s['load_average_at_start']}, after each stage {s['load_average_after_stage']}, at the end "
               f"{s['load_average_at_end']}."),
              "Evaluation seconds: " + ", ".join(f"{r['system']}: {r['eval_seconds']}" for r in s["rows"]) + "."]
    if s.get("note"):
        lines += ["", f"Run notes: {s['note']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
