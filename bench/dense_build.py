"""Dense index build of ICD-10-CM with multilingual-e5-small on this machine's CPU; writes eval/bench/bench_dense_build.{md,json}.

    python -m bench.dense_build [--sample 1000] [--repeats 3] [--no-full] [--full-runs 1]

Parts left out (`--sample 0`, `--no-full`) keep their results from an earlier run in the JSON, so the
sample and the full build can run as two processes.

1. The names: ICD-10-CM from simple-icd-10-cm (`linker dict build --source icd10`, no data folder
   needed): how many, how many are exact duplicates (what encoding each distinct text once could
   save at most), and their e5 token lengths (with the "passage: " prefix) against the model's
   limit: what a max_seq_length fitted below the longest name would truncate, and the padding the
   length-sorted token-budget batches add.
2. Encoding a seeded sample of the names, the contenders alternating in one process, median of
   `--repeats`: sentence-transformers' `encode` in fp32 (batch 64, the names' order: the loop
   before issue 11), linker's loop (length-sorted, token-budget batches) in fp32 and in bf16, and
   bf16 with one torch thread instead of two. Wall-clock names/s and names per CPU-second (the
   process's CPU time, all threads): on a shared CPU the second says what the work costs, the
   first what this machine's load let it have.
3. The full build (`build_index`, kind dense, e5-small, precision auto) of all the names: wall
   time, CPU time, names/s, and the manifest's encoding figures; with `--full-runs N`, N builds in a
   row, the one of median wall time reported and every run listed. Nothing is extrapolated.

The CPU is shared with other jobs (the load average before and after each part is recorded).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np

import linker  # noqa: F401  (first: it sets OpenMP's wait policy, which torch's libgomp reads when it loads)
from bench.report import Report
from bench.report import load as _load

log = logging.getLogger("bench.dense_build")


def icd10cm_table(work: Path) -> Path:
    from linker.dictionary import SourceSpec, build_dictionary

    table = work / "icd10cm.parquet"
    if not table.exists():
        build_dictionary([SourceSpec("icd10", ())], table)
    return table


def names_part(names: list[str], encoder) -> dict:
    """Duplicates and token lengths of the names as the encoder sees them (passage prefix included)."""
    from linker.encoders import token_counts

    prefix = encoder.spec.prefix("passage")
    lengths = token_counts(encoder.model, [prefix + n for n in names])
    limit = encoder.max_length
    caps = {}
    for cap in (32, 48, 64):
        over = lengths > cap
        caps[str(cap)] = {"names_truncated": int(over.sum()),
                          "tokens_cut_percent": round(100 * float((lengths[over] - cap).sum() / lengths.sum()), 2)}
    return {
        "names": len(names), "distinct": len(set(names)),
        "duplicate_percent": round(100 * (1 - len(set(names)) / len(names)), 2),
        "tokens": {"p50": int(np.percentile(lengths, 50)), "p90": int(np.percentile(lengths, 90)),
                   "p99": int(np.percentile(lengths, 99)), "max": int(lengths.max()), "mean": round(float(lengths.mean()), 1),
                   "model_limit": limit, "truncated_at_limit": int((lengths > limit).sum())},
        "caps": caps,
    }


def sample_part(names: list[str], encoder, n: int, repeats: int) -> dict:
    """Alternating contenders on a seeded sample; names/s (wall) and names per CPU-second, medians."""
    import torch

    sample = [names[i] for i in np.sort(np.random.default_rng(0).choice(len(names), size=min(n, len(names)), replace=False))]
    threads = torch.get_num_threads()
    bf16 = encoder.with_precision("bf16")
    prefix = encoder.spec.prefix("passage")

    def before() -> np.ndarray:  # sentence-transformers' own loop: fixed batches of 64 in the given order
        return encoder.model.encode([prefix + s for s in sample], batch_size=64, convert_to_numpy=True,
                                    show_progress_bar=False, normalize_embeddings=True)

    def one_thread() -> np.ndarray:
        torch.set_num_threads(1)
        try:
            return bf16.encode(sample, role="passage")
        finally:
            torch.set_num_threads(threads)

    contenders = {
        "sentence-transformers encode, fp32, batch 64 (before)": before,
        "linker loop, fp32": lambda: encoder.encode(sample, role="passage"),
        f"linker loop, bf16, {threads} threads": lambda: bf16.encode(sample, role="passage"),
        "linker loop, bf16, 1 thread": one_thread,
    }
    compiled = bf16.compile()
    contenders[f"linker loop, bf16 compiled, {threads} threads"] = lambda: compiled.encode(sample, role="passage")
    encoder.encode(sample[:32], role="passage")  # warm-up: first calls pay one-off kernel set-up
    bf16.encode(sample[:32], role="passage")
    c = time.process_time()
    compiled.encode(sample, role="passage")  # all of it: torch.compile may compile again for a batch shape it has not seen
    warm_up_cpu = time.process_time() - c
    wall: dict[str, list[float]] = {label: [] for label in contenders}
    cpu: dict[str, list[float]] = {label: [] for label in contenders}
    vectors: dict[str, np.ndarray] = {}
    load_before = _load()
    for repeat in range(repeats):
        for label, run in contenders.items():
            w, c = time.perf_counter(), time.process_time()
            vectors[label] = run()
            w, c = time.perf_counter() - w, time.process_time() - c
            wall[label].append(len(sample) / w)
            cpu[label].append(len(sample) / max(c, 1e-9))
            log.info("%s repeat %d: %.1f names/s, %.1f names per CPU-s (load %.1f)", label, repeat + 1, wall[label][-1],
                     cpu[label][-1], os.getloadavg()[0])
    reference = vectors["linker loop, fp32"]
    compiled_label = f"linker loop, bf16 compiled, {threads} threads"
    compile_cpu_seconds = round(warm_up_cpu - len(sample) / statistics.median(cpu[compiled_label]), 1)
    bf16.encode(sample, role="passage")
    stats = bf16.last_stats
    return {
        "names": len(sample), "repeats": repeats, "torch_threads": threads, "load_before": load_before, "load_after": _load(),
        "compile_cpu_seconds": compile_cpu_seconds, "compiled": compiled.compiled,
        "padding": {"tokens": stats.tokens, "padded_tokens": stats.padded_tokens, "batches": stats.batches},
        "contenders": {
            label: {"names_per_s": [round(x, 1) for x in wall[label]], "median": round(statistics.median(wall[label]), 1),
                    "names_per_cpu_s": [round(x, 1) for x in cpu[label]],
                    "median_per_cpu_s": round(statistics.median(cpu[label]), 1),
                    "min_cosine_to_fp32": round(float(np.min(np.sum(vectors[label] * reference, axis=1))), 6)}
            for label in contenders
        },
    }


def full_parts(table: Path, work: Path, compile_choice: str, runs: int) -> dict:
    """`runs` full builds one after the other; the one of median wall time is reported, every run listed."""
    builds = [full_part(table, work, compile_choice) for _ in range(runs)]
    for i, b in enumerate(builds):
        log.info("full build %d of %d: %.1f s, %.1f CPU-s", i + 1, runs, b["seconds"], b["cpu_seconds"])
    median = sorted(builds, key=lambda b: b["seconds"])[(runs - 1) // 2]
    return {**median, "runs": [{k: b[k] for k in ("seconds", "cpu_seconds", "encode_seconds", "load_before", "load_after")}
                               | {"check_seconds": (b["check"] or {}).get("seconds")} for b in builds]}


def full_part(table: Path, work: Path, compile_choice: str = "auto") -> dict:
    from linker.index import build_index
    from linker.index.dense import DenseConfig

    load_before = _load()
    w, c = time.perf_counter(), time.process_time()
    manifest = build_index(table, kind="dense", out=work / "icd10cm_e5_auto", overwrite=True,
                           config=DenseConfig(encoder="e5-small", precision="auto", compile=compile_choice))
    w, c = time.perf_counter() - w, time.process_time() - c
    names = manifest["counts"]["names"]
    dense = manifest["dense"]
    return {"names": names, "seconds": round(w, 1), "cpu_seconds": round(c, 1), "names_per_s": round(names / w, 1),
            "names_per_cpu_s": round(names / c, 1), "encode_seconds": dense["encode_seconds"],
            "precision": {k: dense["precision"][k] for k in ("requested", "chosen")}, "check": dense["precision"].get("check"),
            "encoding": dense["encoding"], "compile": compile_choice, "load_before": load_before, "load_after": _load()}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def write_report(report: Report, data: dict) -> None:
    n, s = data["names"], data.get("sample")
    t = n["tokens"]
    lines = [
        f"Commands per part below; {data['machine']}. Compare rows of one table; names per CPU-second is the cost of "
        "the work whatever the load.", "",
        "## The names", "",
        f"{n['names']:,} names (ICD-10-CM descriptions and inclusion terms), {n['distinct']:,} distinct: encoding each "
        f"distinct text once would save at most {n['duplicate_percent']}% of the work. e5 tokens per name (\"passage: \" "
        f"prefix included): median {t['p50']}, p90 {t['p90']}, p99 {t['p99']}, longest {t['max']}, mean {t['mean']}; "
        f"the model's limit is {t['model_limit']} ({t['truncated_at_limit']} names truncated). Batches are padded only "
        "to their own longest name, so a max_seq_length fitted below the longest name saves only the tokens it cuts:", "",
        "| max_seq_length | names truncated | tokens cut |", "|---:|---:|---:|",
        *[f"| {cap} | {row['names_truncated']:,} | {row['tokens_cut_percent']}% |" for cap, row in n["caps"].items()], "",
    ]
    if s:
        first = next(iter(s["contenders"].values()))
        lines += [
            "## Encoding a sample, contenders alternating", "",
            f"`{s['command']}`: {s['names']:,} names (seeded sample), median of {s['repeats']} repeats; load {s['load_before']} before, "
            f"{s['load_after']} after. Length-sorted token-budget batches pad {s['padding']['padded_tokens']:,} tokens for "
            f"{s['padding']['tokens']:,} ({s['padding']['batches']} batches)."
            + (f" Compiling (torch.compile, once per process) took {s['compile_cpu_seconds']:.0f} CPU-s"
               f"{'' if s.get('compiled') else ' and FAILED (the row ran in eager mode)'}." if "compile_cpu_seconds" in s else ""), "",
            "| contender | names/s (median) | runs | names per CPU-s (median) | vs before (per CPU-s) | min cosine to fp32 |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for label, row in s["contenders"].items():
            lines.append(f"| {label} | {row['median']:,.1f} | {', '.join(f'{x:.0f}' for x in row['names_per_s'])} "
                         f"| {row['median_per_cpu_s']:,.1f} | {row['median_per_cpu_s'] / first['median_per_cpu_s']:.2f}x "
                         f"| {row['min_cosine_to_fp32']:.5f} |")
        lines.append("")
    if data.get("full"):
        f = data["full"]
        e = f["encoding"]
        lines += [
            "## Full build", "",
            f"`{f['command']}`: all {f['names']:,} names, flat FAISS, precision {f['precision']['requested']} -> {f['precision']['chosen']}: "
            f"**{f['seconds']:,.0f} s ({f['seconds'] / 60:.1f} min)** wall, {f['cpu_seconds']:,.0f} CPU-seconds; "
            f"{f['names_per_s']:,.1f} names/s, {f['names_per_cpu_s']:,.1f} names per CPU-second; "
            f"torch.compile {f.get('compile', 'auto')} -> {'compiled' if e.get('compiled') else 'eager'}; encoding "
            f"{f['encode_seconds']:,.0f} s; {e['padded_tokens']:,} padded tokens for {e['tokens']:,}, {e['truncated']} truncated. "
            f"Load {f['load_before']} before, {f['load_after']} after. The aim was under 3 minutes.", "",
        ]
        if len(f.get("runs", [])) > 1:  # the figures above are the run of median wall time
            lines += [f"The run of median wall time of {len(f['runs'])}, built one after the other:", "",
                      "| run | wall s | CPU s | encoding s | precision check s (compile included) | load before | load after |",
                      "|---:|---:|---:|---:|---:|---|---|",
                      *[f"| {i} | {r['seconds']:,.0f} | {r['cpu_seconds']:,.0f} | {r['encode_seconds']:,.0f} | "
                        f"{_seconds(r['check_seconds'])} | {r['load_before']} | {r['load_after']} |"
                        for i, r in enumerate(f["runs"], 1)], ""]
    report.write(data, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=1000, help="names in the alternating sample (0 skips it)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="skip the full build")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"), help="torch.compile in the full build")
    parser.add_argument("--full-runs", type=int, default=1, help="full builds in a row; the median one is reported")
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    from linker.dictionary import read_concept_table
    from linker.encoders import load_encoder
    from linker.precision import available_cpus, native_precisions

    report = Report("bench_dense_build", out=args.out, title="Dense index build: ICD-10-CM with multilingual-e5-small")
    work = Path("indexes/bench_encode")
    work.mkdir(parents=True, exist_ok=True)
    table = icd10cm_table(work)
    names = read_concept_table(table).table.column("name").to_pylist()
    encoder = load_encoder("e5-small")
    command = report.meta["command"]
    data = {
        "machine": f"{available_cpus()} CPUs available, {torch.get_num_threads()} torch threads, native precisions "
                   f"{', '.join(native_precisions())}",
        "names": names_part(names, encoder),
    }
    log.info("names: %s", data["names"])
    sample = sample_part(names, encoder, args.sample, args.repeats) if args.sample else None
    del encoder
    full = None if args.no_full else full_parts(table, work, args.compile, args.full_runs)
    path = report.paths["json"]
    earlier = json.loads(path.read_text()) if path.exists() else {}  # a part skipped now keeps its last run
    for key, value in (("sample", sample), ("full", full)):
        data[key] = {**value, "command": command} if value else earlier.get(key)
    write_report(report, data)


if __name__ == "__main__":
    main()
