"""One change driven by the capability suite: tf-idf with punctuation as white space, before and after.

    .venv/bin/python scripts/capability_fix.py [--data ../shared/data] [--out eval] [--indexes indexes/eval]
        [--sample 200] [--seed 15]

The suite found tf-idf's top-1 changing when a name lost its punctuation ("Aplasia/Hypoplasia of
the nasal bone" written "Aplasia Hypoplasia ...", "Sinfalangismo proximal (manos)" without the
brackets): character n-grams such as "a/" and "(m" exist in the name and not in the mention.
`linker.text.normalize` mode ``words`` (``default`` plus punctuation as white space) is now the
tf-idf default. This script measures, with every other setting equal:

1. the capability suite on the embedded default dictionary, tf-idf ``default`` vs ``words``;
2. the tf-idf benchmarks of scripts/eval_all.py (NCBI-disease, Cantemist, CodiEsp-D, Mantra GSC),
   same dictionaries, test sets and xref rules, under the Full and exact-match filters
   (the 0.2 filters take most of eval_all's time and do not depend on the index).

Writes ``eval/capabilities/capabilities_fix.md|json`` (and the suite's ``eval/capabilities/capabilities_fix_suite.*``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from capability_indexes import default_index
from eval_all import mention_names, ncbi_names, table  # the benchmarks' own dictionary builders

from linker.dictionary import SourceSpec, merge_tables
from linker.eval.capabilities import evaluate_capabilities, write_capability_report
from linker.eval.report import evaluate
from linker.fileio import atomic_file
from linker.index import build_index
from linker.index.tfidf import TfidfConfig
from linker.text import icd10cm_code

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("capability_fix")
MODES = ("default", "words")  # before, after


def benchmarks(data: Path, idx: Path) -> list[tuple[str, Path, str, dict]]:
    """(label, concept table, test spec, evaluate() options) of scripts/eval_all.py's tf-idf rows."""
    ncbi, cantemist, codiesp, hpo = data / "ncbi_disease", data / "cantemist", data / "codiesp", data / "hpo"
    medic = table(idx / "medic.parquet", [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt",))], rebuild=False)
    extra = ncbi_names(data, idx / "ncbi_train_dev_names.tsv")
    medic_td = table(idx / "medic_train_dev.parquet", [SourceSpec("tsv", (ncbi / "medic_06Jul2012.txt", extra))],
                     rebuild=False)
    n_train = [f"pubtator:{ncbi / 'NCBItrainset_corpus.txt'}", f"pubtator:{ncbi / 'NCBIdevelopset_corpus.txt'}"]
    same = {"train_spec": n_train, "filters": ("full", "dict", "train")}
    test = f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}"
    icdo = table(idx / "icdo.parquet", [SourceSpec("icdo", (cantemist / "valid-codes.tsv",))], rebuild=False)
    c_test, c_train = f"brat:{cantemist / 'test.zip'}#lang=es", f"brat:{cantemist / 'train.zip'}"
    c_names = mention_names([c_train], idx / "cantemist_train_names.tsv", lang="es")
    icdo_train = table(idx / "icdo_train.parquet", [SourceSpec("icdo", (cantemist / "valid-codes.tsv",)),
                                                    SourceSpec("tsv", (c_names,))], rebuild=False)
    c_opts = {"train_spec": c_train, "filters": ("full", "dict", "train")}
    icd10 = table(idx / "icd10cm.parquet", [SourceSpec("icd10", ())], rebuild=False)
    x_test, x_train = f"codiesp:{codiesp / 'testX.tsv'}#D", f"codiesp:{codiesp / 'trainX.tsv'}#D"
    x_names = mention_names([x_train], idx / "codiesp_d_train_names.tsv", lang="es", canonical=icd10cm_code)
    icd10_train = table(idx / "icd10cm_train.parquet", [SourceSpec("icd10", ()), SourceSpec("tsv", (x_names,))],
                        rebuild=False)
    x_opts = {"train_spec": x_train, "filters": ("full", "dict", "train")}
    hp_files = sorted(hpo.glob("hp.obo*")) + sorted(hpo.glob("hp-*.babelon.tsv")) + sorted(hpo.glob("hp-*.synonyms.tsv"))
    hp = table(idx / "hpo_translations.parquet", [SourceSpec("obo", tuple(hp_files))], rebuild=False)
    doid = table(idx / "doid.parquet", [SourceSpec("obo", tuple(sorted((data / "doid").glob("*.obo*"))))], rebuild=False)
    merged = idx / "hpo_doid.parquet"
    if not merged.exists():
        merge_tables([hp, doid], merged)
    return [
        ("NCBI-disease, MEDIC", medic, test, same),
        ("NCBI-disease, MEDIC+train+dev", medic_td, test, same),
        ("Cantemist, ICD-O names", icdo, c_test, c_opts),
        ("Cantemist, ICD-O names + train", icdo_train, c_test, c_opts),
        ("CodiEsp-D, ICD-10-CM names", icd10, x_test, x_opts),
        ("CodiEsp-D, ICD-10-CM names + train", icd10_train, x_test, x_opts),
        ("Mantra GSC, HPO+DOID (UMLS via xrefs)", merged, f"brat:{data / 'mantra_gsc' / 'Mantra-GSC-brat.zip'}",
         {"filters": ("full", "dict"), "gold_via_xref": "UMLS"}),
    ]


def tfidf(dict_path: Path, mode: str, idx: Path) -> Path:
    out = idx / f"{dict_path.stem}_tfidf_{mode}"
    if not (out / "manifest.json").exists():
        build_index(dict_path, kind="tfidf", out=out, config=TfidfConfig(normalization=mode))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "capabilities")
    parser.add_argument("--indexes", type=Path, default=ROOT / "indexes" / "eval")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_before, started = os.getloadavg(), time.perf_counter()
    idx = args.indexes
    idx.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)

    # 1. the suite on the embedded default dictionary, both modes side by side
    default_table = default_index(ROOT / "indexes").with_suffix(".parquet")
    suite_indexes = [tfidf(default_table, mode, ROOT / "indexes") for mode in MODES]
    reports = evaluate_capabilities([p.relative_to(ROOT) for p in suite_indexes], labels=[f"tf-idf {m}" for m in MODES],
                                    sample=args.sample, seed=args.seed)
    write_capability_report(reports, args.out, name="capabilities_fix_suite",
                            intro="The embedded default dictionary (ICD-10-CM + HPO, English), tf-idf with "
                                  "`normalization` `default` (before) and `words` (after, punctuation as white space). "
                                  f"Command: `scripts/capability_fix.py --sample {args.sample} --seed {args.seed}`.")
    suite = [{"capability": a.capability, "n": a.n, "before": a.rate, "before_ci": [a.low, a.high], "after": b.rate,
              "after_ci": [b.low, b.high]} for a, b in zip(reports[0].rows, reports[1].rows)]

    # 2. the tf-idf benchmarks of eval_all.py, both modes
    bench = []
    for label, dict_path, spec, options in benchmarks(args.data, idx):
        row = {"benchmark": label}
        for mode in MODES:
            report = evaluate(tfidf(dict_path, mode, idx), spec, ks=(1, 5), **options)
            for r in report.rows:
                if r.lang == "all":
                    row[f"{mode} {r.filter}"] = {"n": r.n, "acc1": r.acc(1).value, "acc5": r.acc(5).value,
                                                 "acc1_ci": [r.acc(1).low, r.acc(1).high]}
            log.info("%s %s: Acc@1 %.2f", label, mode, 100 * report.row("full").acc(1).value)
        bench.append(row)

    result = {"suite": suite, "benchmarks": bench, "load_average": {"before": load_before, "after": os.getloadavg()},
              "seconds": round(time.perf_counter() - started, 1), "cpu_count": os.cpu_count(),
              "command": f"scripts/capability_fix.py --sample {args.sample} --seed {args.seed}"}
    with atomic_file(args.out / "capabilities_fix.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    with atomic_file(args.out / "capabilities_fix.md") as tmp:
        tmp.write_text(markdown(result), encoding="utf-8")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def markdown(result: dict) -> str:
    lines = ["# A fix driven by the capability suite: punctuation as white space in tf-idf", "",
             " ".join(__doc__.split("\n\n")[2].split()), "", " ".join(__doc__.split("\n\n")[3].split()), "",
             f"Command: `{result['command']}`; {result['seconds']} s; load average (1, 5, 15 min) "
             f"{', '.join(f'{x:.1f}' for x in result['load_average']['before'])} at the start, "
             f"{', '.join(f'{x:.1f}' for x in result['load_average']['after'])} at the end, on {result['cpu_count']} CPUs "
             "shared with other jobs.", "",
             "## Capability suite, default dictionary (failure % [95% Wilson interval])", "",
             "| capability | n | before (`default`) | after (`words`) |", "|---|---|---|---|"]
    for s in result["suite"]:
        lines.append(f"| {s['capability']} | {s['n']} | {100 * s['before']:.1f} [{100 * s['before_ci'][0]:.1f}, "
                     f"{100 * s['before_ci'][1]:.1f}] | {100 * s['after']:.1f} [{100 * s['after_ci'][0]:.1f}, "
                     f"{100 * s['after_ci'][1]:.1f}] |")
    lines += ["", "## Benchmarks of scripts/eval_all.py (tf-idf, Acc@1 / Acc@5 %, before → after)", "",
              "| benchmark | filter | n | Acc@1 before | Acc@1 after | Acc@5 before | Acc@5 after |", "|---|---|---|---|---|---|---|"]
    for b in result["benchmarks"]:
        for f in ("full", "dict", "train"):
            before, after = b.get(f"default {f}"), b.get(f"words {f}")
            if before is None:
                continue
            lines.append(f"| {b['benchmark']} | {f} | {before['n']:,} | {_pct(before['acc1'])} | {_pct(after['acc1'])} | "
                         f"{_pct(before['acc5'])} | {_pct(after['acc5'])} |")
    for metric in ("acc1", "acc5"):
        deltas = [(b[f"words {f}"][metric] - b[f"default {f}"][metric], b["benchmark"], f)
                  for b in result["benchmarks"] for f in ("full", "dict", "train") if f"default {f}" in b]
        worse = [d for d in deltas if d[0] < 0]
        lines += ["", f"Acc@{metric[-1]}: higher in {sum(d[0] > 0 for d in deltas)}, equal in "
                      f"{sum(d[0] == 0 for d in deltas)}, lower in {len(worse)} of {len(deltas)} rows"
                      + (f"; largest fall {100 * min(worse)[0]:.2f} points ({min(worse)[1]}, {min(worse)[2]})" if worse else "")
                      + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
