"""The hybrid's sparse weight tuned on a dev split: dense / tf-idf / hybrid (default, learned) / hybrid (tuned).

    .venv/bin/python scripts/hybrid_tuning.py ncbi [--encoder minilm] [--grid 0,0.1,...,1] [--threads 2]
    .venv/bin/python scripts/hybrid_tuning.py cantemist [--encoder e5-small]
    .venv/bin/python scripts/hybrid_tuning.py codiesp [--encoder e5-small]
    .venv/bin/python scripts/hybrid_tuning.py ncbi --encoder models/ncbi_biosyn/MODEL   # a trained encoder

ncbi: dictionary = MEDIC plus the *train* mentions as names of their gold concept (BioSyn's
  preprocessing, as scripts/ncbi_biosyn.py), dev = the NCBI-disease dev split, test = the test split,
  both rewritten as BioSyn's query preprocessing does (``#biosyn&typos=...``). The dev mentions are not
  names of this dictionary (they would be exact hits and pull the weight towards tf-idf), so the test
  figures here are on MEDIC + train, not on scripts/ncbi_biosyn.py's MEDIC + train + dev.
  tf-idf: BioSyn's char 1-2-grams. Composite rule: BioSyn's ("any").
cantemist: dictionary = the ICD-O names of valid-codes.tsv plus the train mentions (scripts/eval_all.py's
  "ICD-O names + train mentions"), dev = dev1, test = test (Spanish only). tf-idf: the library default.
codiesp: dictionary = the English ICD-10-CM names (package simple-icd-10-cm, as scripts/eval_all.py) plus
  the Spanish CodiEsp-D train mentions under their canonical code (eval_all.py's "ICD-10-CM names (en) +
  train mentions (es)"), dev = devX.tsv, test = testX.tsv, diagnoses only (#D). tf-idf: the library
  default (eval_all.py's tf-idf row keeps the Medical Crossing paper's char 1-2; eval/tfidf_defaults/tfidf_defaults.md
  measured the default higher on CodiEsp-D).

One hybrid index per (dataset, encoder), built once; `linker.eval.tune.tune_sparse_weight` picks the
weight on dev over the grid (score = a * tf-idf + (1 - a) * dense) and stores it, with the dev score
that picked it, in the index's manifest. Every system is then scored on dev and test from that one
index with `weight_scores`: a = 0 ranks by the dense cosine alone and a = 1 by the tf-idf cosine alone
(over the union of both top lists, which holds each side's own top-k, so the top-k equals that of the
dense or tf-idf index), "default" is the library's equal weight, "learned" BioSyn's learned weight
when the encoder folder has one (biosyn.json). The tuned index is also scored by `linker eval`
(Full / Filtered / Filtered0.2 against the training mentions) into eval/hybrid_tuning/<name>_test.md|json|png.

Stages are skipped when their output exists (the index, its tuning record, the reports), so a run
resumes; --rebuild redoes them. Writes eval/hybrid_tuning/<name>.md|json, name = hybrid_tuning_<part>_<encoder>.
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

from linker.dictionary import SourceSpec, build_dictionary
from linker.eval.datasets import load_dataset
from linker.fileio import atomic_file, portable_paths
from linker.index import build_index
from linker.index.dense import DenseConfig
from linker.index.hybrid import DEFAULT_SPARSE_WEIGHT, HybridConfig
from linker.index.manifest import read_manifest
from linker.index.tfidf import TfidfConfig
from linker.text import icd10cm_code
from stages import Stages, index_current  # scripts/stages.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("hybrid_tuning")
# Beside the test rows: the Medical Crossing paper's SapBERT+target Acc@1 (Full, Filtered, Filtered0.2 against the
# training set) and scripts/eval_all.py's tf-idf report on the same dictionary (names + train mentions).
REFERENCES = {
    "cantemist": ("SapBERT+target, Medical Crossing paper", (79.45, 53.31, 51.48), "cantemist_tfidf_train"),
    "codiesp": ("SapBERT+target, Medical Crossing paper", (67.18, 47.62, 45.42), "codiesp_d_tfidf_train"),
}
DEFAULT_ENCODER = {"ncbi": "minilm", "cantemist": "e5-small", "codiesp": "e5-small"}


def setup(part: str, data: Path, work: Path) -> dict:
    """Dataset specs, the dictionary to build (sources) and the tf-idf config of one part."""
    if part == "ncbi":
        ncbi = data / "ncbi_disease"
        prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
        spec = lambda name: f"pubtator:{ncbi / name}{prep}"  # noqa: E731
        return {"dev": spec("NCBIdevelopset_corpus.txt"), "test": spec("NCBItestset_corpus.txt"),
                "train": [spec("NCBItrainset_corpus.txt")], "composite": "any", "lang": "en",
                "sources": [ncbi / "medic_06Jul2012.txt"], "source_kind": "tsv",
                "tfidf": TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="biosyn")}
    if part == "codiesp":
        spec = lambda name: f"codiesp:{data / 'codiesp' / name}#D"  # noqa: E731
        return {"dev": spec("devX.tsv"), "test": spec("testX.tsv"), "train": [spec("trainX.tsv")],
                "composite": "all", "lang": "es", "sources": [], "source_kind": "icd10",
                "canonical": icd10cm_code, "tfidf": TfidfConfig()}  # CodiEsp's codes are lower case (s22.49xa)
    cantemist = data / "cantemist"
    return {"dev": f"brat:{cantemist / 'dev1.zip'}#lang=es", "test": f"brat:{cantemist / 'test.zip'}#lang=es",
            "train": [f"brat:{cantemist / 'train.zip'}"], "composite": "all", "lang": "es",
            "sources": [cantemist / "valid-codes.tsv"], "source_kind": "icdo", "tfidf": TfidfConfig()}


def build_dictionary_with_train_names(cfg: dict, out: Path) -> None:
    """The part's vocabulary plus its training mentions as extra names of their gold concept."""
    names = out.with_suffix(".train_names.tsv")
    canonical = cfg.get("canonical", str)
    rows = [f"{canonical(cid)}\t{m.text}\t{cfg['lang']}" for spec in cfg["train"] for m in load_dataset(spec)
            if len(m.gold) == 1 for cid in m.gold[0]]
    with atomic_file(names) as tmp:
        tmp.write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
    build_dictionary([SourceSpec(cfg["source_kind"], tuple(cfg["sources"])), SourceSpec("tsv", (names,))], out)


def train_filters(mentions, train_specs) -> dict[str, list[int]]:
    """The test mentions `linker eval` keeps under its training-set filters (Filtered, Filtered0.2)."""
    from linker.eval.filters import Normaliser, ReferenceSet, filter_indices

    references = {"train": ReferenceSet([m.text for spec in train_specs for m in load_dataset(spec)], Normaliser())}
    return {f: filter_indices([m.text for m in mentions], f, references=references) for f in ("train", "train0.2")}


def references(part: str, out: Path) -> list[dict]:
    """Published Acc@1 and eval_all.py's tf-idf Acc@1 (its report, when present) for Full / Filtered / Filtered0.2."""
    if part not in REFERENCES:
        return []
    label, published, report = REFERENCES[part]
    rows = [{"system": label, "acc1": list(published)}]
    path = ROOT / "eval" / "accuracy" / f"{report}.json"  # eval_all.py's report
    if path.exists():
        got = {r["filter"]: 100 * r["accuracies"][0]["value"] for r in json.loads(path.read_text())["rows"]
               if r["lang"] == "all"}
        rows.append({"system": f"tf-idf, paper's char 1-2 (eval/accuracy/{report}.md)",
                     "acc1": [round(got[f], 2) for f in ("full", "train", "train0.2")]})
    return rows


def learned_weight(encoder: str) -> float | None:
    from linker.train.biosyn import SPARSE_WEIGHT_FILE

    path = Path(encoder) / SPARSE_WEIGHT_FILE
    return float(json.loads(path.read_text())["sparse_weight"]) if path.is_file() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(DEFAULT_ENCODER))
    parser.add_argument("--encoder", default=None, help="encoder alias or model folder (default: minilm / e5-small)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "hybrid_tuning")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "hybrid_tuning")
    parser.add_argument("--grid", default=None, help="comma-separated a values in [0, 1] (default 0, 0.1, ..., 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-name", default=None)
    parser.add_argument("--build-only", action="store_true", help="build the dictionary and the index, then stop")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    encoder = args.encoder or DEFAULT_ENCODER[args.part]
    slug = Path(encoder).name
    name = args.report_name or f"hybrid_tuning_{args.part}_{slug}"
    cfg = setup(args.part, args.data, args.work)
    work = args.work / args.part
    work.mkdir(parents=True, exist_ok=True)
    stage = Stages(args.out / f"{name}.json", rebuild=args.rebuild)  # a resumed run keeps the timings of the stages it skips
    timings = stage.seconds

    dictionary = work / "dictionary_train.parquet"
    stage("dictionary", dictionary.exists(), lambda: build_dictionary_with_train_names(cfg, dictionary))
    index_dir = work / f"hybrid_{slug}"
    config = HybridConfig(tfidf=cfg["tfidf"], dense=DenseConfig(encoder=encoder, threads=args.threads))
    stage("index", index_current(index_dir, encoder),
          lambda: build_index(dictionary, kind="hybrid", out=index_dir, config=config, overwrite=True))
    if args.build_only:
        return
    from linker.eval.tune import DEFAULT_GRID, parse_grid

    run(args, cfg, encoder, name, index_dir, dictionary, timings, stage,
        DEFAULT_GRID if args.grid is None else parse_grid(args.grid))


def index_stamp(manifest: dict) -> tuple:
    """When an index was built and tuned: a report's copy of the manifest has its paths made portable, so the
    manifests themselves do not compare."""
    return manifest.get("built_at"), (manifest.get("sparse_weight_tuning") or {}).get("tuned_at")


def run(args, cfg: dict, encoder: str, name: str, index_dir: Path, dictionary: Path, timings: dict, stage,
        grid) -> None:
    from linker.eval.datasets import load_dataset as load
    from linker.eval.report import evaluate
    from linker.eval.tune import tune_sparse_weight, weight_scores
    from linker.link import Linker

    tuned = read_manifest(index_dir).get("sparse_weight_tuning")
    stage("tune", tuned is not None and tuned["dataset"] == cfg["dev"] and tuned["grid"] == list(grid),
          lambda: tune_sparse_weight(index_dir, cfg["dev"], grid=grid, composite=cfg["composite"]))
    manifest = read_manifest(index_dir)
    tuning = manifest["sparse_weight_tuning"]
    chosen = (manifest["parameters"]["sparse_weight"], manifest["parameters"]["dense_weight"])
    systems = [("dense", (0.0, 1.0)), ("tf-idf", (1.0, 0.0)),
               (f"hybrid, default weight {DEFAULT_SPARSE_WEIGHT:g}", (DEFAULT_SPARSE_WEIGHT, 1.0))]
    learned = learned_weight(encoder)
    if learned is not None:
        systems.append((f"hybrid, BioSyn's learned weight {learned:.4f}", (max(learned, 0.0), 1.0)))
    systems.append((f"hybrid, tuned on dev: a = {tuning['chosen']['a']:g}", chosen))

    scores_path = index_dir.parent / f"{name}.scores.json"  # per-split scores, kept to resume (not in the index)
    scores = json.loads(scores_path.read_text()) if scores_path.exists() and not args.rebuild else {}
    if scores.get("systems") != [list(w) for _, w in systems] or scores.get("index") != list(index_stamp(manifest)):
        scores = {"systems": [list(w) for _, w in systems], "index": list(index_stamp(manifest))}
    linker_ = None
    for split in ("dev", "test"):
        if split in scores and (split == "dev" or "subsets" in scores[split][0]):
            log.info("scores %s: exist, skipped", split)
            continue
        started = time.perf_counter()
        linker_ = linker_ or Linker.load(index_dir)
        mentions = load(cfg[split])
        scores[split] = weight_scores(linker_, mentions, [w for _, w in systems], ks=(1, 5),
                                      composite=cfg["composite"],
                                      subsets=train_filters(mentions, cfg["train"]) if split == "test" else None)
        timings[f"score_{split}"] = round(time.perf_counter() - started, 1)
        with atomic_file(scores_path) as tmp:
            tmp.write_text(json.dumps(scores, indent=1))

    test_report = args.out / f"{name}_test.json"
    # Current only when written from this very index (as built and tuned): a committed report of an earlier model
    # of the same name must not stand for a retrained one.
    current = test_report.exists() and index_stamp(
        json.loads(test_report.read_text())["config"].get("index_manifest", {})) == index_stamp(manifest)
    stage("eval_test", current,
          lambda: evaluate(index_dir, cfg["test"], train_spec=cfg["train"], filters=("full", "train", "train0.2"),
                           ks=(1, 5), composite=cfg["composite"], report_dir=args.out, name=f"{name}_test",
                           overwrite=True))
    full_eval = json.loads(test_report.read_text())
    import torch

    result = {
        "command": " ".join(["python", "scripts/hybrid_tuning.py", *sys.argv[1:]]),
        "part": args.part, "encoder": encoder, "index": str(index_dir), "dictionary": str(dictionary),
        "names": manifest["counts"]["names"], "index_build_seconds": manifest["build_seconds"],
        "index_precision": manifest.get("dense", {}).get("precision", {}).get("chosen"), "dev": cfg["dev"], "test": cfg["test"],
        "composite_rule": cfg["composite"], "tuning": tuning,
        "rows": [{"system": label, "sparse_weight": w[0], "dense_weight": w[1],
                  "dev": scores["dev"][i], "test": scores["test"][i]} for i, (label, w) in enumerate(systems)],
        "test_eval": {"report": str(test_report), "rows": [
            {"filter": r["filter"], "n": r["n"], "acc1": r["accuracies"][0]["value"],
             "acc5": r["accuracies"][1]["value"]} for r in full_eval["rows"] if r["lang"] == "all"]},
        "references": references(args.part, args.out),
        "stage_seconds": timings,
        "hardware": {"cpu_count": os.cpu_count(), "torch_threads": args.threads, "machine": platform.machine(),
                     "torch": torch.__version__, "gpu": torch.cuda.is_available(),
                     "load_average_at_end": list(os.getloadavg())},
    }
    with atomic_file(args.out / f"{name}.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(result, indent=2), root=ROOT, data=args.data))
    with atomic_file(args.out / f"{name}.md") as tmp:
        tmp.write_text(portable_paths(markdown(result), root=ROOT, data=args.data))
    print(markdown(result))


def _pct(value: float) -> str:
    return f"{100 * value:.2f}"


def markdown(r: dict) -> str:
    t = r["tuning"]
    lines = [
        f"# Hybrid sparse weight tuned on dev: {r['part']}, encoder {r['encoder']}",
        "",
        f"Produced by `{r['command']}`. Index: tf-idf + dense over {r['names']:,} names "
        f"(`{r['dictionary']}`); dev `{r['dev']}`, test `{r['test']}`; composite rule {r['composite_rule']}. "
        "Hybrid score = sparse_weight * tf-idf cosine + dense_weight * dense cosine over the union of both top lists; "
        "dense = (0, 1), tf-idf = (1, 0), scored from the same index.",
        "",
        "| system | sparse, dense weight | dev n | dev Acc@1 | dev Acc@5 | test n | test Acc@1 | test Acc@5 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        d, s = row["dev"], row["test"]
        lines.append(f"| {row['system']} | {row['sparse_weight']:.4g}, {row['dense_weight']:.4g} | {d['n']} "
                     f"| {_pct(d['acc1'])} | {_pct(d['acc5'])} | {s['n']} | {_pct(s['acc1'])} | {_pct(s['acc5'])} |")
    if "subsets" in r["rows"][0]["test"]:
        lines += ["", "Test by `linker eval`'s training-set filters (Filtered = test mentions whose text is not a "
                      "training mention, Filtered0.2 = nor within normalised Levenshtein 0.2 of one), Acc@1 / Acc@5:",
                  "", "| system | Full | Filtered (train) | Filtered0.2 (train) |", "|---|---|---|---|"]
        for row in r["rows"]:
            test, sub = row["test"], row["test"]["subsets"]
            lines.append(f"| {row['system']} | {_pct(test['acc1'])} / {_pct(test['acc5'])} (n={test['n']:,}) | "
                         + " | ".join(f"{_pct(sub[f]['acc1'])} / {_pct(sub[f]['acc5'])} (n={sub[f]['n']:,})"
                                      for f in ("train", "train0.2")) + " |")
        for ref in r.get("references", []):
            lines.append(f"| {ref['system']} | " + " | ".join(f"{a:.2f}" for a in ref["acc1"]) + " |")
    lines += [
        "",
        f"## Dev grid (Acc@1 on {t['mentions']} dev mentions, a = share of tf-idf)",
        "",
        "| a | " + " | ".join(f"{g['a']:g}" for g in t["scores"]) + " |",
        "|---|" + "---|" * len(t["scores"]),
        "| dev Acc@1 | " + " | ".join(_pct(g["acc1"]) for g in t["scores"]) + " |",
        "",
        f"Chosen: a = {t['chosen']['a']:g} (dev Acc@1 {_pct(t['chosen']['acc1'])}; dense alone "
        f"{_pct(t['dense_acc1'])}, tf-idf alone {_pct(t['tfidf_acc1'])}); ties go to the a closest to 0.5. "
        "Stored in the index manifest as `parameters.sparse_weight` / `dense_weight` and `sparse_weight_tuning`.",
        "",
        f"## Tuned hybrid on test, `linker eval` (`{r['test_eval']['report']}`)",
        "",
        "| filter | n | Acc@1 | Acc@5 |",
        "|---|---|---|---|",
        *[f"| {x['filter']} | {x['n']:,} | {_pct(x['acc1'])} | {_pct(x['acc5'])} |" for x in r["test_eval"]["rows"]],
        "",
    ]
    hw = r["hardware"]
    lines += [f"Hardware: {hw['cpu_count']} CPU cores shared with other jobs, torch {hw['torch']} with "
              f"{hw['torch_threads']} threads, GPU: {hw['gpu']}; load average at the end {hw['load_average_at_end']}. "
              f"Index build (both parts, names encoded in {r['index_precision']}): {r['index_build_seconds']:.0f} s; "
              f"wall seconds per stage of this run: {r['stage_seconds']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
