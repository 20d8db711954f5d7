"""Train and evaluate on NCBI-disease: SapBERT-style self-alignment on MEDIC, then BioSyn; CPU-sized.

    .venv/bin/python scripts/train_ncbi.py [--data ../shared/data] [--out eval] [--work indexes/train_ncbi]
        [--sap-pairs 1500] [--biosyn-queries 192] [--biosyn-epochs 1] [--dict-names 10000] [--threads 1]

Stages (each skipped when its output exists, unless --rebuild):
1. MEDIC concept table (the `tsv` source reads CTD's pipe format) -> <work>/medic.parquet, and the
   *evaluation dictionary*: with --dict-names N (default), a MEDIC subset of about N names: every name
   of every concept that is gold for an NCBI-disease test mention or for a sampled training mention,
   plus all names of seeded randomly drawn other MEDIC concepts as distractors; --dict-names 0 keeps
   all of MEDIC. The subset exists only because one MiniLM pass over all of MEDIC (one dense index)
   took 337-1,080 s on the shared 2-core machine (eval/train_ncbi_full_medic.md), and the full run needs
   five; every system is scored on the same dictionary, so they compare with each other, not with
   published rows.
2. `train_sap`: all-MiniLM-L6-v2 ("minilm") on a seeded sample of synonym pairs of all of MEDIC
   -> models/ncbi-minilm-sap
3. `train_biosyn`: that model on a seeded sample of NCBI-disease *train* mentions, the evaluation
   dictionary as its dictionary -> models/ncbi-minilm-sap-biosyn
4. indexes over the evaluation dictionary: tf-idf; dense with base minilm, +sap, +sap+biosyn; hybrid
   (tf-idf + the last encoder, the hybrid index's default sparse weight 1.0)
5. `linker.eval.report.evaluate` on NCBI-disease test (960 mentions), composite rule "all", full set.

Writes eval/train_ncbi.md and eval/train_ncbi.json with training times, hardware and machine load.
The sizes are chosen for 2 shared CPU cores, far below the papers' (BioSyn: 10 epochs over all
train+dev mentions with BioBERT on a GPU; SapBERT: 1 epoch over ~11M UMLS pairs): the numbers
show what the code does at that size, not what the methods reach.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import time
from pathlib import Path

import torch

from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.eval.datasets import load_dataset
from linker.eval.report import evaluate
from linker.fileio import atomic_file
from linker.index import build_index
from linker.index.dense import DenseConfig
from linker.index.hybrid import HybridConfig
from linker.train.biosyn import BiosynConfig, train_biosyn
from linker.train.sap import SapConfig, train_sap

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("train_ncbi")
PUBLISHED = [("BioSyn (Sung et al. 2020), BioBERT, MEDIC+train+dev names", 91.1, 93.9)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "train_ncbi")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--sap-pairs", type=int, default=1500)
    parser.add_argument("--sap-batch", type=int, default=64)
    parser.add_argument("--biosyn-queries", type=int, default=192)
    parser.add_argument("--biosyn-epochs", type=int, default=1)
    parser.add_argument("--dict-names", type=int, default=10000)
    # 1 thread: under a load of ~10 on 2 cores, 2 OpenMP threads ran a training step 3x slower (measured)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-name", default="train_ncbi", help="eval/<name>.md|json")
    parser.add_argument("--systems", default="tfidf,dense_minilm,dense_sap,dense_sap_biosyn,hybrid_sap_biosyn",
                        help="comma-separated index names to build and score (each dense one costs a pass over the names)")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    ncbi = args.data / "ncbi_disease"
    work, models = args.work, args.models
    work.mkdir(parents=True, exist_ok=True)
    # Stage timings survive re-runs that skip finished stages: the previous report's values are kept.
    previous_path = args.out / f"{args.report_name}.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    timings: dict[str, float] = dict(previous.get("stage_seconds", previous.get("stage_seconds_this_run", {})))
    load: dict[str, list[float]] = dict(previous.get("load_average_after_stage", {}))

    def stage(name: str, done: bool, fn) -> None:
        if done and not args.rebuild:
            log.info("stage %s: output exists, skipped", name)
            return
        started = time.perf_counter()
        fn()
        timings[name] = round(time.perf_counter() - started, 1)
        load[name] = [round(x, 2) for x in os.getloadavg()]
        log.info("stage %s: %.0fs (load %s)", name, timings[name], load[name])

    medic = work / "medic.parquet"
    stage("dictionary", medic.exists(),
          lambda: build_dictionary([SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt",))], medic))

    train_spec = f"pubtator:{ncbi / 'NCBItrainset_corpus.txt'}"
    test_spec = f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}"
    biosyn_config = BiosynConfig(max_queries=args.biosyn_queries, epochs=args.biosyn_epochs, threads=args.threads)
    eval_dict = medic
    if args.dict_names:
        eval_dict = work / f"medic_subset_{args.dict_names}.parquet"
        stage("dictionary_subset", eval_dict.exists(),
              lambda: subset_dictionary(medic, eval_dict, args.dict_names, test_spec, train_spec, biosyn_config))

    sap_model = models / "ncbi-minilm-sap"
    sap_config = SapConfig(max_pairs=args.sap_pairs, batch_size=args.sap_batch, threads=args.threads)
    stage("train_sap", (sap_model / "train_metrics.json").exists(),
          lambda: train_sap(medic, encoder="minilm", out=sap_model, config=sap_config))

    biosyn_model = models / "ncbi-minilm-sap-biosyn"
    stage("train_biosyn", (biosyn_model / "train_metrics.json").exists(),
          lambda: train_biosyn(train_spec, eval_dict, encoder=str(sap_model), out=biosyn_model, config=biosyn_config))

    systems = [
        ("tf-idf (char 1-2 grams)", "tfidf", "tfidf", None),
        ("dense minilm (base)", "dense_minilm", "dense", DenseConfig(encoder="minilm")),
        ("dense minilm + sap", "dense_sap", "dense", DenseConfig(encoder=str(sap_model))),
        ("dense minilm + sap + biosyn", "dense_sap_biosyn", "dense", DenseConfig(encoder=str(biosyn_model))),
        ("hybrid tf-idf + (minilm + sap + biosyn)", "hybrid_sap_biosyn", "hybrid",
         HybridConfig(dense=DenseConfig(encoder=str(biosyn_model)))),
    ]
    rows = []
    wanted = set(args.systems.split(","))
    for label, name, kind, config in [s for s in systems if s[1] in wanted]:
        folder = work / name
        stage(f"index_{name}", (folder / "manifest.json").exists(),
              lambda: build_index(eval_dict, kind=kind, out=folder, config=config))
        started = time.perf_counter()
        report = evaluate(folder, test_spec, ks=(1, 5))
        row = report.row("full")
        rows.append({"system": label, "index": str(folder), "n": row.n,
                     "acc1": round(100 * row.acc(1).value, 2), "acc5": round(100 * row.acc(5).value, 2),
                     "acc1_interval": [round(100 * row.acc(1).low, 2), round(100 * row.acc(1).high, 2)],
                     "eval_seconds": round(time.perf_counter() - started, 1)})
        log.info("%s: Acc@1 %.2f Acc@5 %.2f", label, rows[-1]["acc1"], rows[-1]["acc5"])

    sap_metrics = json.loads((sap_model / "train_metrics.json").read_text())
    bio_metrics = json.loads((biosyn_model / "train_metrics.json").read_text())
    result = {
        "dataset": test_spec,
        "dictionary": str(eval_dict),
        "dictionary_names": read_concept_table(eval_dict).table.num_rows,
        "dictionary_concepts": len(set(read_concept_table(eval_dict).table.column("concept_id").to_pylist())),
        "medic_names": read_concept_table(medic).table.num_rows,
        "rows": rows,
        "published": [{"system": s, "acc1": a1, "acc5": a5} for s, a1, a5 in PUBLISHED],
        "training": {
            "sap": {"model": str(sap_model), "config": json.loads((sap_model / "train_config.json").read_text())["config"],
                    "pairs": sap_metrics["extra"]["pairs"], "seconds": sap_metrics["extra"]["train_seconds"],
                    "epoch_loss": sap_metrics["epochs"], "first_step_loss": sap_metrics["steps"][0]["loss"],
                    "last_step_loss": sap_metrics["steps"][-1]["loss"]},
            "biosyn": {"model": str(biosyn_model),
                       "dictionary": json.loads((biosyn_model / "train_config.json").read_text())["data"]["dict"],
                       "config": json.loads((biosyn_model / "train_config.json").read_text())["config"],
                       "queries": bio_metrics["extra"]["queries"], "seconds": bio_metrics["extra"]["train_seconds"],
                       "epochs": bio_metrics["epochs"], "sparse_weight": bio_metrics["extra"]["sparse_weight"],
                       "first_step_loss": bio_metrics["steps"][0]["loss"], "last_step_loss": bio_metrics["steps"][-1]["loss"]},
        },
        "stage_seconds": timings,
        "load_average_after_stage": load,
        "hardware": {"cpu_count": os.cpu_count(), "torch_threads": args.threads, "machine": platform.machine(),
                     "torch": torch.__version__, "gpu": torch.cuda.is_available(),
                     "note": "2 CPU cores shared with up to 6 other jobs; times are wall-clock under that load"},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.out / f"{args.report_name}.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2))
    with atomic_file(args.out / f"{args.report_name}.md") as tmp:
        tmp.write_text(markdown(result))
    print(markdown(result))


def subset_dictionary(medic: Path, out: Path, names: int, test_spec: str, train_spec: str,
                      biosyn_config: BiosynConfig) -> None:
    """Write the evaluation dictionary (see the module docstring) as TSV and build it with the tsv source."""
    from linker.text import code_key
    from linker.train.biosyn import training_queries

    table = read_concept_table(medic).table
    rows = list(zip(*(table.column(c).to_pylist() for c in ("concept_id", "name", "lang"))))
    by_concept: dict[str, list[tuple[str, str, str]]] = {}
    for row in rows:
        by_concept.setdefault(code_key(row[0]), []).append(row)
    gold = {code_key(a) for m in load_dataset(test_spec) for part in m.gold for a in part}
    queries, _ = training_queries(load_dataset(train_spec), biosyn_config)  # the very sample BioSyn trains on
    gold |= {g for q in queries for g in q.gold}
    keep = [c for c in sorted(by_concept) if c in gold]
    others = [c for c in sorted(by_concept) if c not in gold]
    random.Random(0).shuffle(others)
    count = sum(len(by_concept[c]) for c in keep)
    for c in others:
        if count >= names:
            break
        keep.append(c)
        count += len(by_concept[c])
    tsv = out.with_suffix(".tsv")
    with atomic_file(tsv) as tmp:
        tmp.write_text("concept_id\tname\tlang\n" + "".join(
            f"{cid}\t{name}\t{lang}\n" for c in keep for cid, name, lang in by_concept[c]))
    build_dictionary([SourceSpec("tsv", (tsv,))], out)


def markdown(r: dict) -> str:
    sap, bio = r["training"]["sap"], r["training"]["biosyn"]
    lines = [
        "# Training on NCBI-disease (CPU-sized)",
        "",
        f"Test: {r['dataset']} ({r['rows'][0]['n']} mentions, full set, composite rule \"all\"). Produced by "
        "`scripts/train_ncbi.py`.",
        "",
        f"Dictionary: {r['dictionary']}, {r['dictionary_names']:,} names of {r['dictionary_concepts']:,} concepts "
        f"(MEDIC has {r['medic_names']:,} names)." + ("" if r["dictionary_names"] == r["medic_names"] else
        " A subset: all names of the gold concepts of the test mentions and of the sampled training mentions, plus "
        "seeded random MEDIC concepts as distractors, because one MiniLM pass over all of MEDIC took 337-1,080 s on "
        "this shared 2-core machine (see train_ncbi_full_medic.md, which scores the same systems on all of MEDIC); every "
        "row here uses the same dictionary, so rows compare with each other but NOT with published numbers (fewer "
        "distractors make the task easier)."),
        "",
        "| system | Acc@1 | Acc@5 | Acc@1 95% CI |",
        "|---|---|---|---|",
    ]
    for row in r["rows"]:
        lo, hi = row["acc1_interval"]
        lines.append(f"| {row['system']} | {row['acc1']:.2f} | {row['acc5']:.2f} | [{lo:.2f}, {hi:.2f}] |")
    for p in r["published"]:
        lines.append(f"| *published:* {p['system']} | {p['acc1']} | {p['acc5']} | |")
    lines += [
        "",
        "## Training runs",
        "",
        f"- **sap** (`linker train sap --encoder minilm`): {sap['pairs']['pairs']:,} MEDIC synonym pairs "
        f"(of {sap['pairs']['concepts_with_pairs']:,} concepts with synonyms), batch {sap['config']['batch_size']}, "
        f"lr {sap['config']['lr']}, {sap['config']['epochs']} epoch: {sap['seconds']:.0f} s; step loss "
        f"{sap['first_step_loss']:.3f} -> {sap['last_step_loss']:.3f}.",
        f"- **biosyn** (`linker train biosyn --encoder models/ncbi-minilm-sap`): {bio['queries']['queries']:,} of "
        f"{bio['queries']['unique_queries']:,} unique single-concept NCBI train mentions, topk "
        f"{bio['config']['topk']}, dense ratio {bio['config']['dense_ratio']}, batch {bio['config']['batch_size']}, "
        f"lr {bio['config']['lr']}, {len(bio['epochs'])} epoch(s), candidates from {bio['dictionary']}: "
        f"{bio['seconds']:.0f} s (candidate retrieval included); step loss {bio['first_step_loss']:.3f} -> {bio['last_step_loss']:.3f}; "
        f"learned sparse weight {bio['sparse_weight']:.5f} (BioSyn starts it at 0).",
        "",
        "Per biosyn epoch: " + "; ".join(
            f"epoch {e['epoch']}: mean loss {e['mean_loss']}, train dense Acc@1 before it "
            f"{e['train_dense_acc1_before_epoch']}, {e['queries_without_positive']} queries without a positive candidate"
            for e in bio["epochs"]) + ".",
        "",
        f"Hardware: {r['hardware']['cpu_count']} CPU cores, torch {r['hardware']['torch']} with "
        f"{r['hardware']['torch_threads']} threads, GPU: {r['hardware']['gpu']}. {r['hardware']['note']}.",
        f"Wall seconds per stage (kept from the run that did it when a later run skipped it): {r['stage_seconds']}; "
        f"load average (1, 5, 15 min) after each: {r['load_average_after_stage']}.",
        "",
        "The published row used BioBERT, 10 epochs over all train+dev mentions, and MEDIC plus the train+dev "
        "mentions as extra dictionary names; this run is orders of magnitude smaller and is not a reproduction.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
