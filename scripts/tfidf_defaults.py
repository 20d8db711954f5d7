"""Choose the tf-idf defaults by measurement: analyzer, n-gram range and normalisation mode.

    .venv/bin/python scripts/tfidf_defaults.py            # writes eval/tfidf_defaults/tfidf_defaults.{md,json}
    .venv/bin/python scripts/tfidf_defaults.py --quick    # two settings, a smoke test of the script

For every setting and every benchmark in ../shared/data (NCBI-disease test against MEDIC +
train/dev mentions, Cantemist test against the ICD-O names, CodiEsp-D test against the English
ICD-10-CM names, Mantra GSC against HPO with translations + Disease Ontology; the dictionaries
of scripts/eval_all.py), build a tf-idf index with exact search and evaluate it: Acc@1 and Acc@5
on the full test set (and on the Filtered0.2 subset where the benchmark has training mentions),
build seconds, the name matrix's non-zeros, and linking speed. The machine is shared: speed is
reported as a ratio to the Medical Crossing setting on the same benchmark, measured in the same
process minutes apart, with the load average beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval_all  # noqa: E402  (the dictionaries of the evaluation reports, built the same way)

from linker.dictionary import SourceSpec, merge_tables  # noqa: E402
from linker.eval.datasets import load_dataset  # noqa: E402
from linker.eval.report import evaluate  # noqa: E402
from linker.index import build_index  # noqa: E402
from linker.index.tfidf import PRESETS, TfidfConfig  # noqa: E402
from linker.link import Linker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("tfidf_defaults")

NGRAMS = [("char", 1, 2), ("char", 2, 3), ("char_wb", 2, 3), ("char_wb", 3, 3), ("char", 3, 4)]
MODES = ["default", "faithful", "biosyn"]


def benchmarks(data: Path, idx: Path) -> list[dict]:
    """(name, dictionary, test spec, evaluate() options) of the four benchmarks, as eval_all builds them."""
    ncbi = data / "ncbi_disease"
    extra = eval_all.ncbi_names(data, idx / "ncbi_train_dev_names.tsv")
    medic_td = eval_all.table(idx / "medic_train_dev.parquet",
                              [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt", extra))], rebuild=False)
    ncbi_train = [f"pubtator:{ncbi / 'NCBItrainset_corpus.txt'}", f"pubtator:{ncbi / 'NCBIdevelopset_corpus.txt'}"]
    cantemist = data / "cantemist"
    icdo = eval_all.table(idx / "icdo.parquet", [SourceSpec("icdo", (cantemist / "valid-codes.tsv",))], rebuild=False)
    codiesp = data / "codiesp"
    icd10 = eval_all.table(idx / "icd10cm.parquet", [SourceSpec("icd10", ())], rebuild=False)
    hpo = data / "hpo"
    hp_files = (sorted(hpo.glob("hp.obo*")) + sorted(hpo.glob("hp-*.babelon.tsv")) + sorted(hpo.glob("hp-*.synonyms.tsv")))
    hp = eval_all.table(idx / "hpo_translations.parquet", [SourceSpec("obo", tuple(hp_files))], rebuild=False)
    doid = eval_all.table(idx / "doid.parquet", [SourceSpec("obo", tuple(sorted((data / "doid").glob("*.obo*"))))],
                          rebuild=False)
    merged = idx / "hpo_doid.parquet"
    if not merged.exists():
        merge_tables([hp, doid], merged)
    return [
        {"name": "NCBI-disease (MEDIC + train/dev)", "dict": medic_td, "test": f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}",
         "options": {"train_spec": ncbi_train, "filters": ("full", "train0.2")}},
        {"name": "Cantemist (ICD-O, es)", "dict": icdo, "test": f"brat:{cantemist / 'test.zip'}#lang=es",
         "options": {"train_spec": f"brat:{cantemist / 'train.zip'}", "filters": ("full", "train0.2")}},
        {"name": "CodiEsp-D (ICD-10-CM en, es mentions)", "dict": icd10, "test": f"codiesp:{codiesp / 'testX.tsv'}#D",
         "options": {"train_spec": f"codiesp:{codiesp / 'trainX.tsv'}#D", "filters": ("full", "train0.2")}},
        {"name": "Mantra GSC (HPO + DOID)", "dict": merged, "test": f"brat:{data / 'mantra_gsc' / 'Mantra-GSC-brat.zip'}",
         "options": {"filters": ("full",), "gold_via_xref": "UMLS"}},
    ]


def settings(quick: bool) -> list[TfidfConfig]:
    grid = [TfidfConfig(analyzer=a, ngram_min=lo, ngram_max=hi, normalization=m) for a, lo, hi in NGRAMS for m in MODES]
    if quick:
        grid = [PRESETS["medical-crossing"], TfidfConfig(analyzer="char_wb", ngram_min=3, ngram_max=3)]
    return grid


def postings_walked(names, mentions: list[str]) -> float:
    """Mean over mentions of the name-matrix entries an exact product visits: the sum of the document
    frequencies of the mention's n-grams. A measure of search work that the machine's load does not change."""
    vectors = names.vectors(mentions)
    df = names.document_frequency
    return round(float(df[vectors.indices].sum()) / max(1, len(mentions)), 1)


def label(config: TfidfConfig) -> str:
    return f"{config.analyzer} {config.ngram_min}-{config.ngram_max}, {config.normalization}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("LINKER_SHARED_DATA", ROOT.parent / "shared" / "data")))
    parser.add_argument("--indexes", type=Path, default=ROOT / "indexes" / "eval")
    parser.add_argument("--report", type=Path, default=ROOT / "eval" / "tfidf_defaults" / "tfidf_defaults")
    parser.add_argument("--quick", action="store_true", help="two settings only")
    parser.add_argument("--render", type=Path, help="only rewrite the Markdown from this JSON report")
    args = parser.parse_args()
    if args.render:
        report = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(markdown(report))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.indexes.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report = {"command": " ".join(["scripts/tfidf_defaults.py", *sys.argv[1:]]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "load_at_start": list(os.getloadavg()), "results": []}
    for bench in benchmarks(args.data, args.indexes):
        for config in settings(args.quick):
            folder = args.indexes / "sweep"
            load_before = os.getloadavg()[0]
            manifest = build_index(bench["dict"], kind="tfidf", out=folder, config=config)
            rep = evaluate(folder, bench["test"], ks=(1, 5), **bench["options"])
            linker = Linker.load(folder, checksums=False)
            texts = list(dict.fromkeys(m.text for m in load_dataset(bench["test"])))
            cpu = time.process_time()
            linker.link(texts, k=5)
            cpu = time.process_time() - cpu  # CPU seconds of all threads: less sensitive to the load than wall time
            walked = postings_walked(linker.index.names, texts)
            row = {"benchmark": bench["name"], "setting": label(config), "config": asdict(config),
                   "names": manifest["counts"]["names"], "features": manifest["features"], "nnz": int(linker.index.names.matrix.nnz),
                   "postings_per_query": walked, "link_cpu_s": round(cpu, 3), "texts": len(texts),
                   "build_s": manifest["build_seconds"], "link_s": rep.seconds["link"],
                   "mentions": rep.config["mentions"],
                   "load": [round(load_before, 2), round(os.getloadavg()[0], 2)], "subsets": {}}
            for filter_name in bench["options"]["filters"]:
                r = rep.row(filter_name)
                row["subsets"][filter_name] = {"n": r.n, "acc1": round(100 * r.acc(1).value, 2),
                                               "acc5": round(100 * r.acc(5).value, 2),
                                               "ci1": [round(100 * r.acc(1).low, 2), round(100 * r.acc(1).high, 2)]}
            report["results"].append(row)
            log.info("%s | %s: %s, link %.2fs", bench["name"], label(config), row["subsets"], row["link_s"])
            shutil.rmtree(folder)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["load_at_end"] = list(os.getloadavg())
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.with_suffix(".json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    args.report.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {args.report}.md and .json in {report['seconds']}s")


BASE = "char 1-2, default"  # the Medical Crossing setting, the reference of the ratios


def cpu_speed(row: dict) -> float:
    return row["texts"] / row["link_cpu_s"]


def markdown(report: dict) -> str:
    lines = ["# tf-idf defaults: analyzer, n-gram range and normalisation, measured", "",
             f"Generated by `{report['command']}` on {report['date']}; {report['cpus']} CPUs shared with other jobs "
             f"(load average {report['load_at_start'][0]:.2f} at the start, {report['load_at_end'][0]:.2f} at the end; "
             f"per-row load before/after in the table), {report['seconds']:.0f}s in all. Exact search, k = 5. "
             "Acc@1 / Acc@5 in %; *F0.2*: the Filtered0.2 subset (training mentions at normalised Levenshtein "
             "< 0.2 removed, as in the Medical Crossing paper). *postings/query*: name-matrix entries an exact "
             "search visits per mention (the sum of its n-grams' document frequencies), the work that the load "
             "does not change. *mentions/CPU-s*: distinct test mentions linked per CPU second of `Linker.link` "
             "(all threads), and *speed* that relative to `char 1-2, default` (the Medical Crossing setting) on "
             "the same benchmark; CPU time is less disturbed by the other jobs than wall time, not immune.", ""]
    for bench in dict.fromkeys(r["benchmark"] for r in report["results"]):
        rows = [r for r in report["results"] if r["benchmark"] == bench]
        base = next((r for r in rows if r["setting"] == BASE), rows[0])
        filters = list(rows[0]["subsets"])
        head = " | ".join(f"{'full' if f == 'full' else 'F0.2'} Acc@1 / @5" for f in filters)
        lines += [f"## {bench}: {rows[0]['mentions']:,} mentions, {rows[0]['names']:,} names", "",
                  f"| setting | {head} | build s | postings/query | mentions/CPU-s | speed | load |",
                  "|---|" + "---:|" * (len(filters) + 5)]
        for r in rows:
            cells = " | ".join(f"{r['subsets'][f]['acc1']:.2f} / {r['subsets'][f]['acc5']:.2f}" for f in filters)
            lines.append(f"| {r['setting']} | {cells} | {r['build_s']:.1f} | {r['postings_per_query']:,.0f} | "
                         f"{cpu_speed(r):,.0f} | {cpu_speed(r) / cpu_speed(base):.2f}x | "
                         f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |")
        lines.append("")
    benches = list(dict.fromkeys(r["benchmark"] for r in report["results"]))
    means = {}
    for setting in dict.fromkeys(r["setting"] for r in report["results"]):
        means[setting] = np.mean([r["subsets"]["full"]["acc1"] for r in report["results"] if r["setting"] == setting])
    best = max(means, key=means.get)
    default = label(TfidfConfig())
    lines += [f"Highest mean full Acc@1: `{best}` ({means[best]:.2f}). The library's default (`TfidfConfig()`, "
              f"`linker index build` without options) is `{default}` ({means.get(default, float('nan')):.2f}); "
              f"`--preset medical-crossing` is `{BASE}` ({means.get(BASE, float('nan')):.2f}).", ""]
    lines += ["## Mean over the benchmarks", "",
              f"| setting | mean full Acc@1 | mean postings/query vs {BASE} | mean speed vs {BASE} |",
              "|---|---:|---:|---:|"]
    for setting in dict.fromkeys(r["setting"] for r in report["results"]):
        rows = [r for r in report["results"] if r["setting"] == setting]
        bases = [next((b for b in report["results"] if b["benchmark"] == r["benchmark"] and b["setting"] == BASE), r)
                 for r in rows]
        work = np.mean([r["postings_per_query"] / b["postings_per_query"] for r, b in zip(rows, bases)])
        speed = np.mean([cpu_speed(r) / cpu_speed(b) for r, b in zip(rows, bases)])
        acc = np.mean([r["subsets"]["full"]["acc1"] for r in rows])
        lines.append(f"| {setting} | {acc:.2f} (over {len(rows)} of {len(benches)}) | {work:.2f}x | {speed:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
