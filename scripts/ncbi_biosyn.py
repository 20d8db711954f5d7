"""NCBI-disease under BioSyn's protocol, every system trained and scored here on CPU.

    .venv/bin/python scripts/ncbi_biosyn.py [--data ../shared/data] [--out eval] [--work indexes/ncbi_biosyn]
        [--models models] [--sap-pairs 10000|all|0] [--epochs 10] [--threads 2] [--rebuild]

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
Stages are skipped when their output exists (unless --rebuild). Writes eval/ncbi_biosyn.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
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
from linker.train.biosyn import SPARSE_WEIGHT_FILE, BiosynConfig, train_biosyn
from linker.train.sap import SapConfig, train_sap
from stages import Stages, index_current  # scripts/stages.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("ncbi_biosyn")
PUBLISHED = [
    ("BioSyn (Sung et al. 2020), BioBERT, sparse + dense", 91.1, 93.9),
    ("SapBERT (Liu et al. 2021), PubMedBERT + UMLS pairs, fine-tuned", 92.0, 95.6),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval")
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    ncbi, work, models = args.data / "ncbi_disease", args.work, args.models
    work.mkdir(parents=True, exist_ok=True)
    prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
    test_spec = f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}{prep}"
    train_specs = [f"pubtator:{ncbi / name}{prep}" for name in ("NCBItrainset_corpus.txt", "NCBIdevelopset_corpus.txt")]
    medic_txt = ncbi / "medic_06Jul2012.txt"  # its OMIM ids become xrefs: alternatives of the MeSH disease
    stage = Stages(args.out / f"{args.report_name}.json", rebuild=args.rebuild)  # keeps skipped stages' timings
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
    biosyn_config = BiosynConfig(epochs=args.epochs, threads=args.threads, max_seconds=args.biosyn_max_seconds)
    # The test mentions are watched during training only to draw the curve; the protocol fixes the
    # epochs, so nothing is chosen by them (train+dev are both trained on: no untouched dev split).
    stage("train_biosyn", (biosyn_model / "train_metrics.json").exists(),
          lambda: train_biosyn(train_specs, medic, encoder=str(sap_model or base), out=biosyn_model,
                               config=biosyn_config, monitor=load_dataset(test_spec),
                               resume=biosyn_model.with_name(biosyn_model.name + ".checkpoint").exists()))
    learned = json.loads((biosyn_model / SPARSE_WEIGHT_FILE).read_text())["sparse_weight"]

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

    bio_metrics = json.loads((biosyn_model / "train_metrics.json").read_text())
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
                       "monitor_acc1_after_training": bio_metrics["extra"].get("monitor_dense_acc1_after_training")},
        },
        "stage_seconds": timings,
        "hardware": {"cpu_count": os.cpu_count(), "torch_threads": args.threads, "machine": platform.machine(),
                     "processor": platform.processor(), "torch": torch.__version__, "gpu": torch.cuda.is_available(),
                     "load_average_at_end": list(os.getloadavg())},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.out / f"{args.report_name}.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(result, indent=2), root=ROOT, data=args.data))
    with atomic_file(args.out / f"{args.report_name}.md") as tmp:
        tmp.write_text(portable_paths(markdown(result), root=ROOT, data=args.data))
    curve(result, args.out / f"{args.report_name}_curve.png")
    print(markdown(result))


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

    bio = r["training"]["biosyn"]
    epochs = bio["epochs"]
    xs = [e["epoch"] - 1 for e in epochs]
    fig, ax = plt.subplots(figsize=(6, 4))
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
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _pct(value: float) -> float:
    return round(100 * value, 2)


def markdown(r: dict) -> str:
    sap, bio = r["training"]["sap"], r["training"]["biosyn"]
    hard_n = r["rows"][0]["any"]["filtered02_n"]
    lines = [
        "# NCBI-disease under BioSyn's protocol, trained on CPU",
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
        f"lr {bio['config']['lr']}, {len(epochs)} epochs, {bio['seconds']:.0f} s in all (candidate refresh included); "
        f"learned sparse weight {bio['sparse_weight']:.4f}."
        + (" **Stopped by the time budget** (`--biosyn-max-seconds`) after step {step_in_epoch} of {steps_per_epoch} "
           "of epoch {epoch}.".format(**bio["stopped_at_time_budget"]) if bio.get("stopped_at_time_budget") else ""),
        "",
        "The curve (`" + r["report_name"] + "_curve.png`) watches dense Acc@1 against MEDIC alone on the test set's "
        "single-concept mentions; the protocol fixes the epochs, so it chose nothing. "
        f"After the last epoch: {bio.get('monitor_acc1_after_training')}.",
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
        f"Wall seconds per stage: {r['stage_seconds']}.",
        "",
        "Differences from the published setting: the encoder is all-MiniLM-L6-v2 (general domain, 22M parameters) "
        "instead of BioBERT (biomedical, 110M); abbreviations come from our Schwartz & Hearst detector instead of "
        "Ab3P; cosine scores with temperature 0.05 instead of BERT [CLS] dot products (see `linker.train.biosyn`).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
