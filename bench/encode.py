"""Encoder speed and parity at each precision (fp32, bf16, int8) on this machine's CPU.

    python -m bench.encode --part throughput [--names 1500] [--repeats 3]
    python -m bench.encode --part parity
    python -m bench.encode --part train
    python -m bench.encode --report          # eval/bench/bench_encode.md from the JSON

Each part adds its results to eval/bench/bench_encode.json (other parts' results are kept) and the
report is rewritten from the JSON. The CPU is shared with other jobs, so speeds are measured as
ratios: the contenders run alternately in one process, each repeat in turn, and the median of the
repeats is reported with the load average around each part.

- throughput: names/s encoding MEDIC names (a seeded sample) as passages with all-MiniLM-L6-v2
  and multilingual-e5-small: sentence-transformers' own `encode` (batch 64, the loop before this
  change) and linker's loop (length-sorted, batches filled to a token budget) in fp32, bf16, int8.
- parity: dense indexes in each precision over (a) MEDIC + NCBI train/dev mentions, queried with
  the NCBI-disease test set preprocessed as BioSyn does (minilm; eval/ncbi_biosyn/ncbi_biosyn.md's set-up),
  (b) ICD-O names + Cantemist train mentions, queried with the Cantemist test set (e5-small;
  eval/accuracy/cantemist_tfidf_train.md's set-up). Top-1 agreement with fp32 and Acc@1 (Full).
- (the report's build section, from an earlier run, is measured now by `python -m bench.dense_build`.)
- train: SAP pairs/s and BioSyn seconds per step (minilm, MEDIC), alternating: the code before
  issue 11 (fp32, unfused Adam, one padded forward per batch), bf16 autocast with fused Adam, and
  that with each batch run as length buckets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from bench import data as catalogue
from bench.report import REPO as ROOT
from bench.report import Report, command

log = logging.getLogger("bench.encode")
PRECISIONS = ("fp32", "bf16", "int8")


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save(out: Path, part: str, result: dict) -> None:
    """The parts accumulate in one report: this part replaces its earlier run, the others are kept."""
    data = {k: v for k, v in load_json(out.with_suffix(".json")).items() if k in ("throughput", "parity", "build", "train")}
    if part == "parity":  # parity runs per benchmark (--only) add to the benchmarks already measured
        result["benchmarks"] = {**data.get("parity", {}).get("benchmarks", {}), **result["benchmarks"]}
    data[part] = {**result, "command": command(), "machine": machine()}
    write_report(out, data)


def machine() -> dict:
    import torch

    from linker.precision import available_cpus, native_precisions

    return {"cpus_available": available_cpus(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_precisions": list(native_precisions()), "processor": platform.processor() or platform.machine()}


def medic_names(n: int, seed: int = 0) -> list[str]:
    from linker.dictionary import SourceSpec, read_concept_table

    table = catalogue.dictionary(ROOT / "indexes" / "bench_encode" / "medic.parquet",
                                 [SourceSpec("tsv", (catalogue.get("ncbi").path("medic"),))])
    names = read_concept_table(table).table.column("name").to_pylist()
    rng = np.random.default_rng(seed)
    return [names[i] for i in np.sort(rng.choice(len(names), size=min(n, len(names)), replace=False))]


# --- throughput ---------------------------------------------------------------------------------


def throughput(args) -> dict:
    from linker.encoders import load_encoder

    names = medic_names(args.names)
    result = {"names": len(names), "repeats": args.repeats, "encoders": {}, "load_before": os.getloadavg()}
    for encoder_name in ("minilm", "e5-small"):
        fp32 = load_encoder(encoder_name)
        contenders = {"fp32, sentence-transformers encode (before)": None}
        contenders.update({p: fp32.with_precision(p) for p in PRECISIONS})
        contenders.update({f"{p} compiled": fp32.with_precision(p).compile() for p in ("fp32", "bf16")})
        runs: dict[str, list[float]] = {label: [] for label in contenders}
        cpu_runs: dict[str, list[float]] = {label: [] for label in contenders}
        vectors: dict[str, np.ndarray] = {}
        compile_cpu: dict[str, float] = {}
        for label, encoder in contenders.items():  # warm-up: first calls pay one-off kernel set-up (and compiling)
            started = time.process_time()
            # a compiled encoder warms up on all the names: torch.compile may compile again for a batch
            # shape it has not seen (a last batch of one name), and that belongs to its one-off cost
            run_one(fp32, encoder, names if label.endswith("compiled") else names[:64])
            if label.endswith("compiled"):
                compile_cpu[label] = time.process_time() - started
        for repeat in range(args.repeats):
            for label, encoder in contenders.items():
                started, cpu = time.perf_counter(), time.process_time()
                vectors[label] = run_one(fp32, encoder, names)
                runs[label].append(len(names) / (time.perf_counter() - started))
                cpu_runs[label].append(len(names) / (time.process_time() - cpu))
                log.info("%s %s repeat %d: %.0f names/s, %.0f per CPU-s (load %.1f)", encoder_name, label, repeat + 1,
                         runs[label][-1], cpu_runs[label][-1], os.getloadavg()[0])
        reference = vectors["fp32"]
        for label in compile_cpu:  # the warm-up's CPU time beyond one ordinary run of the names
            compile_cpu[label] = round(compile_cpu[label] - len(names) / statistics.median(cpu_runs[label]), 1)
        result["encoders"][encoder_name] = {
            label: {"names_per_s": [round(x, 1) for x in runs[label]], "median": round(statistics.median(runs[label]), 1),
                    "names_per_cpu_s": [round(x, 1) for x in cpu_runs[label]],
                    "median_per_cpu_s": round(statistics.median(cpu_runs[label]), 1),
                    "min_cosine_to_fp32": round(float(np.min(np.sum(vectors[label] * reference, axis=1))), 6),
                    **({"compile_cpu_seconds": compile_cpu[label], "compiled": contenders[label].compiled}
                       if label in compile_cpu else {})}
            for label in contenders
        }
        result["encoders"][encoder_name]["_stats"] = contenders["fp32"].last_stats.to_dict()
    if args.budgets:
        result["token_budget"] = budget_sweep(args, names)
    result["load_after"] = os.getloadavg()
    return result


def run_one(fp32, encoder, names: list[str]) -> np.ndarray:
    if encoder is None:  # the loop before: sentence-transformers' encode, batches of 64 names
        prefix = fp32.spec.passage_prefix
        return fp32.model.encode([prefix + n for n in names], batch_size=64, convert_to_numpy=True, show_progress_bar=False,
                                 normalize_embeddings=True)
    return encoder.encode(names, role="passage")


def budget_sweep(args, names: list[str]) -> dict:
    from linker.encoders import load_encoder

    budgets = [int(b) for b in args.budgets.split(",")]
    out = {}
    for encoder_name in ("minilm", "e5-small"):
        fp32 = load_encoder(encoder_name)
        for precision in ("fp32", "bf16"):
            encoder = fp32.with_precision(precision)
            runs = {b: [] for b in budgets}
            for _ in range(args.repeats):
                for budget in budgets:
                    started = time.perf_counter()
                    encoder.encode(names, role="passage", token_budget=budget)
                    runs[budget].append(len(names) / (time.perf_counter() - started))
            out[f"{encoder_name} {precision}"] = {str(b): round(statistics.median(v), 1) for b, v in runs.items()}
            log.info("budget sweep %s %s: %s", encoder_name, precision, out[f"{encoder_name} {precision}"])
    return out


# --- parity -------------------------------------------------------------------------------------


def parity(args) -> dict:
    from linker.dictionary import SourceSpec, build_dictionary
    from linker.eval.datasets import load_dataset

    work = ROOT / "indexes" / "bench_encode"
    work.mkdir(parents=True, exist_ok=True)
    ncbi, cantemist = catalogue.get("ncbi").check(), catalogue.get("cantemist").check()
    prep = f"biosyn&typos={ncbi.path('typos')}"
    train_specs = [ncbi.spec(split, prep) for split in ("train", "dev")]
    medic_td = work / "medic_train_dev.parquet"
    if not medic_td.exists():
        rows = [f"{cid}\t{m.text}" for spec in train_specs for m in load_dataset(spec) if len(m.gold) == 1 for cid in m.gold[0]]
        (work / "ncbi_train_dev_names.tsv").write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
        build_dictionary([SourceSpec("tsv", (ncbi.path("medic"), work / "ncbi_train_dev_names.tsv"))], medic_td)
    c_train = f"brat:{cantemist.path('train')}"
    icdo_train = work / "icdo_train.parquet"
    if not icdo_train.exists():
        rows = [f"{m.gold[0][0]}\t{m.text}\tes" for m in load_dataset(c_train) if len(m.gold) == 1]
        (work / "cantemist_train_names.tsv").write_text("\n".join(dict.fromkeys(rows)) + "\n", encoding="utf-8")
        build_dictionary([SourceSpec("icdo", (cantemist.path("codes"),)),
                          SourceSpec("tsv", (work / "cantemist_train_names.tsv",))], icdo_train)
    benchmarks = [
        ("NCBI-disease test, MEDIC + train/dev mentions", "minilm", medic_td, ncbi.spec("test", prep),
         {"composite": "any"}),
        ("Cantemist test, ICD-O names + train mentions", "e5-small", icdo_train, cantemist.spec("test"), {}),
    ]
    wanted = [b for b in benchmarks if not args.only or args.only in b[1] or args.only in b[0]]
    result = {"benchmarks": {}, "load_before": os.getloadavg()}
    for label, encoder_name, table, test, options in wanted:
        started, load = dt.datetime.now(dt.timezone.utc), os.getloadavg()
        result["benchmarks"][label] = parity_one(work, label, encoder_name, table, test, options)
        result["benchmarks"][label]["run"] = (  # each benchmark keeps its own command when another is rerun
            f"`{command()}`, {started:%H:%M}-"
            f"{dt.datetime.now(dt.timezone.utc):%H:%M} UTC {started:%Y-%m-%d}; load average {_load(load)} before, "
            f"{_load(os.getloadavg())} after")
        reused = {k: r["built_at"] for k, r in result["benchmarks"][label]["precisions"].items() if r["reused"]}
        if reused:  # scored now, encoded by the run that built them (delete indexes/bench_encode/ to rebuild)
            result["benchmarks"][label]["run"] += "; indexes reused, built " + ", ".join(f"{k} {v}" for k, v in reused.items())
    result["load_after"] = os.getloadavg()
    return result


def parity_one(work: Path, label: str, encoder_name: str, table: Path, test: str, options: dict) -> dict:
    from linker.eval.datasets import load_dataset
    from linker.eval.report import evaluate
    from linker.index import build_index
    from linker.index.dense import DenseConfig
    from linker.link import Linker

    mentions = [m.text for m in load_dataset(test)]
    rows, top1 = {}, {}
    for precision in PRECISIONS:
        folder = work / f"{table.stem}_{encoder_name}_{precision}"
        reused = (folder / "manifest.json").exists()  # built by an earlier run: scored again, not rebuilt
        if not reused:
            build_index(table, kind="dense", out=folder, config=DenseConfig(encoder=encoder_name, precision=precision))
        manifest = json.loads((folder / "manifest.json").read_text())
        report = evaluate(folder, test, ks=(1, 5), **options)
        full = report.row("full")
        results = Linker.load(folder).link(mentions, k=1)
        top1[precision] = [r.candidates[0].concept_id if r.candidates else None for r in results]
        rows[precision] = {
            "acc1": round(100 * full.acc(1).value, 2), "acc5": round(100 * full.acc(5).value, 2), "n": full.n,
            "build_seconds": round(manifest["build_seconds"], 1), "built_at": manifest["built_at"], "reused": reused,
            "encode_seconds": manifest["dense"]["encode_seconds"],
            "names": manifest["counts"]["names"], "build_check": manifest["dense"]["precision"].get("check"),
            "truncated": manifest["dense"]["encoding"]["truncated"],
            "compiled": manifest["dense"]["encoding"].get("compiled"),  # torch.compile (auto: >= 20,000 names)
        }
        log.info("%s %s: %s", label, precision, rows[precision])
    for precision in PRECISIONS:
        same = np.mean([a == b for a, b in zip(top1[precision], top1["fp32"])])
        rows[precision]["top1_agreement"] = round(100 * float(same), 2)
        rows[precision]["acc1_delta"] = round(rows[precision]["acc1"] - rows["fp32"]["acc1"], 2)
        rows[precision]["passes"] = bool(same >= 0.995 and abs(rows[precision]["acc1_delta"]) <= 0.3)
    return {"encoder": encoder_name, "dictionary": str(table.relative_to(ROOT)), "test": test.replace(str(ROOT.parent), ".."),
            "mentions": len(mentions), "precisions": rows}


# --- ICD-10-CM build ------------------------------------------------------------------------------


# --- training -----------------------------------------------------------------------------------


def train(args) -> dict:
    from linker.dictionary import SourceSpec, build_dictionary
    from linker.train.biosyn import BiosynConfig, train_biosyn
    from linker.train.sap import SapConfig, train_sap

    work = ROOT / "indexes" / "bench_encode" / "train"
    work.mkdir(parents=True, exist_ok=True)
    ncbi = catalogue.get("ncbi").check()
    medic = ROOT / "indexes" / "bench_encode" / "medic.parquet"
    medic_names(1)  # builds the MEDIC table when missing
    # BioSyn re-encodes its whole dictionary every epoch; a MEDIC subset keeps each repeat short
    # while the step itself (16 mentions x 20 candidates) is the same as on all of MEDIC.
    # The subset keeps the concepts of the training mentions (else no candidate list holds a positive).
    from linker.eval.datasets import load_dataset

    train_spec = ncbi.spec("train")
    gold = {i.split(":")[-1] for m in load_dataset(train_spec) for part in m.gold for i in part}
    small = work / "medic_small.txt"
    lines = [line for line in ncbi.path("medic").read_text(encoding="utf-8").splitlines() if line.strip()]
    step = max(1, len(lines) // args.biosyn_concepts)
    kept = [line for i, line in enumerate(lines) if i % step == 0 or set(line.split("||")[0].split("|")) & gold]
    small.write_text("\n".join(kept) + "\n", encoding="utf-8")
    small_table = work / "medic_small.parquet"
    build_dictionary([SourceSpec("tsv", (small,))], small_table, overwrite=True)
    # Contenders: the code before issue 11 (fp32, torch's unfused Adam/AdamW, each training batch one
    # forward pass padded to its longest text); bf16 autocast with the fused optimizer (what
    # `--precision auto` picks on this CPU), still one padded batch; and that with the batch run as
    # length buckets (linker.encoders.in_length_buckets), today's code.
    import torch

    from linker.train import common

    fused_adam, bucketed_embed = common.adam, common.embed

    def unfused_adam(params, *, decoupled: bool, **options):
        return (torch.optim.AdamW if decoupled else torch.optim.Adam)(params, **options)

    def padded_embed(model, texts, device):  # the training forward before length buckets
        prepare = getattr(model, "preprocess", None) or model.tokenize
        features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in prepare(list(texts)).items()}
        return model(features)["sentence_embedding"]

    contenders = {"fp32, unfused Adam, padded batches (before)": ("fp32", unfused_adam, padded_embed),
                  "bf16, padded batches": ("bf16", fused_adam, padded_embed),
                  "bf16, length buckets": ("bf16", fused_adam, bucketed_embed)}
    sap, biosyn = {c: [] for c in contenders}, {c: [] for c in contenders}
    load_before = os.getloadavg()
    for repeat in range(args.repeats):
        for label, (precision, optimizer, embed) in contenders.items():
            common.adam, common.embed = optimizer, embed
            try:
                summary = train_sap(medic, encoder="minilm", out=work / "sap_run", overwrite=True,
                                    config=SapConfig(max_pairs=args.sap_pairs, batch_size=64, precision=precision))
                sap[label].append(summary["pairs_per_second"])
                summary = train_biosyn(train_spec, small_table, encoder="minilm", out=work / "biosyn_run", overwrite=True,
                                       config=BiosynConfig(epochs=1, max_queries=args.biosyn_queries, precision=precision))
            finally:
                common.adam, common.embed = fused_adam, bucketed_embed
            metrics = json.loads((work / "biosyn_run" / "train_metrics.json").read_text())
            steps = metrics["steps"]
            step_seconds = (steps[-1]["seconds"] - metrics["epochs"][0]["candidate_seconds"]) / len(steps)
            biosyn[label].append({"step_seconds": round(step_seconds, 3),
                                  "candidate_seconds": metrics["epochs"][0]["candidate_seconds"]})
            log.info("train %s repeat %d: sap %.1f pairs/s, biosyn %s (load %.1f)", label, repeat + 1, sap[label][-1],
                     biosyn[label][-1], os.getloadavg()[0])
    median = statistics.median
    return {
        "sap": {"pairs": args.sap_pairs, "batch": 64, "encoder": "minilm",
                **{c: {"pairs_per_s": v, "median": round(median(v), 1)} for c, v in sap.items()}},
        "biosyn": {"queries": args.biosyn_queries, "batch": 16, "topk": 20, "encoder": "minilm",
                   "dictionary_names": _rows(small_table),
                   **{c: {"runs": v, "median_step_seconds": round(median(r["step_seconds"] for r in v), 3),
                          "median_candidate_seconds": round(median(r["candidate_seconds"] for r in v), 2)}
                      for c, v in biosyn.items()}},
        "load_before": load_before, "load_after": os.getloadavg(),
    }


def _rows(table: Path) -> int:
    from linker.dictionary import read_concept_table

    return read_concept_table(table).table.num_rows


# --- report -------------------------------------------------------------------------------------


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def write_report(out: Path, data: dict) -> None:
    report = Report(out.name, out=out.parent, title="Dense encoding at each precision on the shared CPU")
    lines = ["Commands per part below. Speeds are medians of repeats that alternate the contenders in one process: "
             "compare ratios within a table, not absolute figures across tables. Load average (1/5/15 min) is shown "
             "per part.", ""]
    if "throughput" in data:
        t = data["throughput"]
        lines += ["## Encoding throughput (names/s)", "",
                  f"`{t['command']}`: {t['names']:,} MEDIC names (seeded sample) as passages, median of {t['repeats']} "
                  f"repeats; load {_load(t['load_before'])} before, {_load(t['load_after'])} after; "
                  f"{t['machine']['torch_threads']} torch threads, native precisions {', '.join(t['machine']['native_precisions'])}.", "",
                  "| encoder | contender | names/s (median) | runs | vs fp32 before | names per CPU-s (median) | vs fp32 before, per CPU-s | min cosine to fp32 |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, rows in t["encoders"].items():
            before_row = rows["fp32, sentence-transformers encode (before)"]
            before, before_cpu = before_row["median"], before_row.get("median_per_cpu_s")
            for label, row in rows.items():
                if label.startswith("_"):
                    continue
                shown = label if "before" in label else f"{label}, linker loop"
                if "compile_cpu_seconds" in row:
                    shown += f" (compiling took {row['compile_cpu_seconds']:.0f} CPU-s{'' if row['compiled'] else '; FAILED, ran eager'})"
                per_cpu = row.get("median_per_cpu_s")
                cpu_cells = (f"{per_cpu:,.0f} | {per_cpu / before_cpu:.2f}x" if per_cpu and before_cpu else "- | -")
                lines.append(f"| {name} | {shown} | {row['median']:,.0f} | {', '.join(f'{x:.0f}' for x in row['names_per_s'])} "
                             f"| {row['median'] / before:.2f}x | {cpu_cells} | {row['min_cosine_to_fp32']:.5f} |")
        if "token_budget" in t:
            lines += ["", "Token budget per batch (names/s, median):", "",
                      "| encoder, precision | " + " | ".join(next(iter(t["token_budget"].values())).keys()) + " |",
                      "|---|" + "---|" * len(next(iter(t["token_budget"].values())))]
            lines += [f"| {k} | " + " | ".join(f"{v:,.0f}" for v in row.values()) + " |" for k, row in t["token_budget"].items()]
        lines.append("")
    if "parity" in data:
        p = data["parity"]
        lines += ["## Parity with fp32 on real benchmarks", "",
                  f"`{p['command']}`. A dense flat index per precision; the test mentions are encoded in the index's "
                  "precision. Bar: top-1 agreement with fp32 >= 99.5% and Acc@1 within 0.3 points. "
                  "Build check: the index build's own check on 512 of its names (min cosine, nearest-name agreement).", "",
                  "| benchmark | encoder | precision | Acc@1 | Acc@5 | top-1 agreement with fp32 % | Acc@1 - fp32 | passes | build check | names encoded/s | compiled |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for label, b in p["benchmarks"].items():
            for precision, row in b["precisions"].items():
                check = row.get("build_check")
                shown = "-" if not check else f"{check['min_cosine']:.4f} / {100 * check['top1_agreement']:.1f}%"
                lines.append(f"| {label} (n={b['mentions']:,}) | {b['encoder']} | {precision} | {row['acc1']:.2f} | {row['acc5']:.2f} "
                             f"| {row['top1_agreement']:.2f} | {row['acc1_delta']:+.2f} | {'yes' if row['passes'] else 'no'} "
                             f"| {shown} | {row['names'] / max(row['encode_seconds'], 1e-9):,.0f} "
                             f"| {'-' if row.get('compiled') is None else 'yes' if row['compiled'] else 'no'} |")
        lines += [""] + [f"- {label}: {b['run']}" for label, b in p["benchmarks"].items() if b.get("run")] + [""]
    if "build" in data:
        b = data["build"]
        what = "a seeded sample of ICD-10-CM's names" if b["sampled"] else "all ICD-10-CM names"
        lines += ["## Dense index build: ICD-10-CM with e5-small", "",
                  f"`{b['command']}`: {what} ({b['names']:,}), flat FAISS, precision {b['precision']['requested']} -> "
                  f"{b['precision']['chosen']}. Build {b['seconds']:.0f} s ({b['seconds'] / 60:.1f} min), of which encoding "
                  f"{b['encode_seconds']:.0f} s ({b['encoding']['names_per_second']:,.0f} names/s); "
                  f"{b['encoding']['truncated']} names truncated (longest {b['encoding']['longest']} tokens, limit "
                  f"{b['encoding']['max_length']}); load {_load(b['load_before'])} before, {_load(b['load_after'])} after.", ""]
    if "train" in data:
        t = data["train"]
        s, bio = t["sap"], t["biosyn"]
        labels = [c for c in s if isinstance(s[c], dict)]  # contenders in run order (older runs: fp32, bf16)
        lines += ["## Training: fp32 vs bf16 autocast, padded batches vs length buckets", "",
                  f"`{t['command']}`: minilm; SAP {s['pairs']} MEDIC pairs, batch {s['batch']}; BioSyn {bio['queries']} "
                  f"NCBI train mentions, batch {bio['batch']}, top-{bio['topk']}, one epoch over a MEDIC subset (the train "
                  f"mentions' concepts and a stride sample) of "
                  f"{bio['dictionary_names']:,} names. Alternating, median of the runs; load {_load(t['load_before'])} "
                  f"before, {_load(t['load_after'])} after.", "",
                  "| measure | " + " | ".join(labels) + " | speed-up, last vs first |", "|---|" + "---|" * (len(labels) + 1),
                  "| SAP pairs/s | " + " | ".join(f"{s[c]['median']:.1f}" for c in labels)
                  + f" | {s[labels[-1]]['median'] / s[labels[0]]['median']:.2f}x |",
                  "| BioSyn seconds per step | " + " | ".join(f"{bio[c]['median_step_seconds']:.2f}" for c in labels)
                  + f" | {bio[labels[0]]['median_step_seconds'] / bio[labels[-1]]['median_step_seconds']:.2f}x |",
                  "| BioSyn dictionary + query re-encoding per epoch, s | "
                  + " | ".join(f"{bio[c]['median_candidate_seconds']:.1f}" for c in labels)
                  + f" | {bio[labels[0]]['median_candidate_seconds'] / bio[labels[-1]]['median_candidate_seconds']:.2f}x |", ""]
    report.write(data, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("throughput", "parity", "train"))
    parser.add_argument("--report", action="store_true", help="only rewrite the Markdown from the JSON")
    parser.add_argument("--out", type=Path, default=Path("eval/bench/bench_encode"), help="the report's path stem")
    parser.add_argument("--names", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", default="", help="also sweep these token budgets, e.g. 2048,4096,8192,16384")
    parser.add_argument("--only", default="", help="parity: only the benchmark whose encoder or label contains this")
    parser.add_argument("--sap-pairs", type=int, default=512)
    parser.add_argument("--biosyn-queries", type=int, default=96)
    parser.add_argument("--biosyn-concepts", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.report:
        write_report(args.out, load_json(args.out.with_suffix(".json")))
        return
    if args.part is None:
        parser.error("give --part or --report")
    result = {"throughput": throughput, "parity": parity, "train": train}[args.part](args)
    save(args.out, args.part, result)


if __name__ == "__main__":
    main()
