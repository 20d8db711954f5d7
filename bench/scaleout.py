"""Scale-out benchmark: `linker normalize` in one process vs `linker normalize-ray` at 1 and 2 workers.

    nice -n 5 python -m bench.scaleout --index indexes/default \\
        --tfidf-spans 100000 --dense-spans 4000 --dense-names 10000 --shards 8 --runs 3

Spans are drawn (seed 0, with replacement) half from the real NCBI-disease test mentions and half
from the names of the index's own concept table, written as `--shards` JSONL shards. Each contender
runs in a fresh process (`--child`), alternated within each of `--runs` rounds; the report gives the
median of the rounds, the per-CPU-second figures (robust to the machine's load) and the load average
before and after every run:

- local: `Linker.load` + `normalize_jsonl` over all spans in one file, as `linker normalize` does;
  spans/s of the linking phase, its CPU seconds, the process's peak RSS.
- ray-N: `normalize_ray` with N workers into a new folder: the Ray start, the job's wall time,
  each worker's linking CPU seconds and peak RSS (from the workers themselves).

The dense contender uses a flat minilm index over `--dense-names` MEDIC names (built once here, in
the scratch folder). Writes eval/bench/bench_scaleout.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import data
from bench.report import REPO as ROOT
from bench.report import Report, command

SEED = 0
BATCH = 1024  # spans per `Linker.link` call, local and in a Ray worker (linker.normalize.BATCH)
CONTENDERS = ["local", "ray-1", "ray-2"]


# ----------------------------------------------------------------------------- children (one contender each)


def child_local(args) -> dict:
    from linker.link import Linker
    from linker.normalize import normalize_jsonl

    started, cpu0 = time.perf_counter(), time.process_time()
    linker = Linker.load(args.index)
    loaded, cpu1 = time.perf_counter(), time.process_time()
    summary = normalize_jsonl(linker, args.input, args.output, k=args.k)
    done, cpu2 = time.perf_counter(), time.process_time()
    return {"spans": summary.mentions, "load_s": loaded - started, "link_s": done - loaded, "wall_s": done - started,
            "link_cpu_s": cpu2 - cpu1, "total_cpu_s": cpu2 - cpu0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_ray(args) -> dict:
    from linker.engine.ray import normalize_ray, ray_session

    # Ray's memory monitor kills workers when the whole node is above 95% of its memory; on a shared
    # machine that is other people's processes, and a killed worker's CPU time would drop out of the
    # figures (its actor restarts and redoes the shard). Off for the measurement; the kernel's OOM killer stays.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    started = time.perf_counter()
    with ray_session(workers=args.workers):
        ready = time.perf_counter()
        summary = normalize_ray(args.index, args.input, args.output, k=args.k, workers=args.workers)
        done = time.perf_counter()
    workers = list(summary.workers)
    return {"spans": summary.manifest["spans"], "ray_start_s": ready - started, "job_s": done - ready,
            "wall_s": done - started, "workers": workers,
            "link_cpu_s": sum(w["link_cpu_seconds"] for w in workers),
            "peak_rss_mib": max(w["peak_rss_mib"] for w in workers),
            "load_s": max(w["load_seconds"] for w in workers)}


# ----------------------------------------------------------------------------- the parent


def ncbi_mentions() -> list[str]:
    from linker.formats.pubtator import read_pubtator

    return [a.text for a in read_pubtator(data.get("ncbi").path("test"))]


def span_texts(mentions: list[str], names: list[str], n: int) -> list[str]:
    """The benchmark's spans: odd ones drawn from `mentions`, even ones from `names` (seed 0, with replacement)."""
    rng = random.Random(SEED)
    return [rng.choice(mentions) if i % 2 else rng.choice(names) for i in range(n)]


def distinct_shares(texts: list[str], shards: int) -> dict:
    """How repetitive the spans are: `Linker.link` links each distinct text of a batch once, so the
    figures depend on it. Distinct share overall and per batch (local: one file, Ray: per shard)."""
    def per_batch(chunks: list[list[str]]) -> float:
        batches = [c[i : i + BATCH] for c in chunks for i in range(0, len(c), BATCH)]
        return sum(len(set(b)) for b in batches) / len(texts)

    per = -(-len(texts) // shards)
    return {"spans": len(texts), "distinct": len(set(texts)), "distinct_share": len(set(texts)) / len(texts),
            "distinct_per_batch_local": per_batch([texts]),
            "distinct_per_batch_ray": per_batch([texts[s * per : (s + 1) * per] for s in range(shards)])}


def write_spans(folder: Path, texts: list[str], shards: int) -> tuple[Path, Path]:
    """`shards` JSONL shards in folder/shards and the same spans in one file folder/all.jsonl."""
    (folder / "shards").mkdir(parents=True)
    per = -(-len(texts) // shards)
    with (folder / "all.jsonl").open("w", encoding="utf-8") as whole:
        for s in range(shards):
            with (folder / "shards" / f"part-{s:03d}.jsonl").open("w", encoding="utf-8") as part:
                for i in range(s * per, min(len(texts), (s + 1) * per)):
                    line = json.dumps({"id": f"s{i}", "text": texts[i]}, ensure_ascii=False) + "\n"
                    part.write(line)
                    whole.write(line)
    return folder / "shards", folder / "all.jsonl"


def run_child(kind: str, index: Path, source: Path, output: Path, workers: int, k: int) -> dict:
    load_before = os.getloadavg()
    argv = [sys.executable, "-m", "bench.scaleout", "--child", kind, "--index", str(index), "--input", str(source),
            "--output", str(output), "--workers", str(workers), "--k", str(k)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    return result


def contenders(index: Path, shards: Path, whole: Path, scratch: Path, runs: int, k: int,
               names: list[str]) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in names}
    for run in range(runs):
        for name in results:
            out = scratch / f"out-{name}-{run}"
            if name == "local":
                result = run_child("local", index, whole, out.with_suffix(".jsonl"), 1, k)
            else:
                result = run_child("ray", index, shards, out, int(name.split("-")[1]), k)
            print(f"run {run} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
            results[name].append(result)
    return results


def summarise(runs: list[dict]) -> dict:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    spans = runs[0]["spans"]
    out = {"spans": spans, "runs": len(runs), "wall_s": median("wall_s"), "load_s": median("load_s"),
           "link_cpu_s": median("link_cpu_s"), "peak_rss_mib": median("peak_rss_mib"),
           "spans_per_s_wall": spans / median("wall_s"),
           "spans_per_link_cpu_s": statistics.median(spans / r["link_cpu_s"] for r in runs)}
    if "job_s" in runs[0]:
        out |= {"ray_start_s": median("ray_start_s"), "job_s": median("job_s"), "spans_per_s_job": spans / median("job_s"),
                "worker_peak_rss_mib": [statistics.median(sorted(w["peak_rss_mib"] for w in r["workers"])[i] for r in runs)
                                        for i in range(len(runs[0]["workers"]))]}
    else:
        out |= {"link_s": median("link_s"), "spans_per_s_link": spans / median("link_s")}
    return out


def index_names(index: Path) -> list[str]:
    """The names of an index's concept table, which the tf-idf spans are half drawn from."""
    import pyarrow.parquet as pq

    return pq.read_table(index / "concepts.parquet", columns=["name"]).column("name").to_pylist()


def medic_sample(scratch: Path, names: int) -> list[str]:
    """`names` MEDIC name rows (seed 0, all when fewer) written to scratch/medic_sample.parquet; their names."""
    import pyarrow.parquet as pq

    table = scratch / "medic.parquet"
    subprocess.run([sys.executable, "-m", "linker", "-q", "dict", "build", "--source", "tsv",
                    str(data.get("ncbi").path("medic")), "--out", str(table)], cwd=ROOT, check=True)
    full = pq.read_table(table)
    keep = sorted(random.Random(SEED).sample(range(full.num_rows), min(names, full.num_rows)))
    pq.write_table(full.take(keep), scratch / "medic_sample.parquet")
    return full.take(keep).column("name").to_pylist()


def build_dense(scratch: Path, names: int) -> tuple[Path, list[str]]:
    """A flat minilm index over `names` MEDIC name rows (seed 0), built in the scratch folder."""
    sample = medic_sample(scratch, names)
    subprocess.run([sys.executable, "-m", "linker", "-q", "index", "build", "--dict", str(scratch / "medic_sample.parquet"),
                    "--kind", "dense", "--encoder", "minilm", "--out", str(scratch / "dense")], cwd=ROOT, check=True)
    return scratch / "dense", sample


def tfidf_label(index: Path) -> str:
    """The tf-idf index as the report names it: its n-gram setting and size, from its manifest."""
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    p = manifest["parameters"]
    return f"tf-idf ({p['analyzer']} {p['ngram_min']}-{p['ngram_max']}, {manifest['counts']['names']:,} names)"


def dense_label(names: int) -> str:
    return f"dense (minilm flat, {names:,} MEDIC names)"


def capacity(per_cpu_s: float) -> float:
    """Core-hours for 1e8 spans at this many spans per CPU second."""
    return 1e8 / per_cpu_s / 3600


# Inputs of the capacity plan that this script does not measure, with where they were measured.
RERANK_FACTOR = 74.3  # eval/bench/bench_rerank_ncbi.md: re-ranking the top 8 costs 74.3x the retriever alone (per mention)
TFIDF_MATRIX_MIB_PER_M_NAMES = 397  # eval/bench/bench_link.md: the char_wb 3-3 matrix of 1,000,000 generated names
DENSE_DIM = 384  # minilm and e5-small vectors


def capacity_plan(result: dict) -> list[str]:
    """The paper plan for 1e8 spans from the measured per-CPU-second figures (ray-2 workers, else local)."""
    lines = ["## Capacity plan for 10⁸ spans (on paper, from the figures above)", "",
             "Core-hours = 10⁸ / (spans per linking CPU-second) / 3600, from the 2-worker Ray rows (what a worker "
             "sustains on a dedicated core); index loading (once per worker) and Ray's start are extra, minutes per "
             "worker. The re-ranked row divides by the re-ranker's cost, 74.3× the retriever per mention at top 8 "
             "(eval/bench/bench_rerank_ncbi.md: not measured here).", "",
             "| index | spans / linking CPU-s | core-hours for 10⁸ | on 64 cores | with the re-ranker (×74.3): core-hours | on 64 cores |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind, rows in result["indexes"].items():
        per = rows.get("ray-2", rows["local"])["spans_per_link_cpu_s"]
        hours = capacity(per)
        lines.append(f"| {kind} | {per:,.0f} | {hours:,.1f} | {hours / 64:,.2f} h | {hours * RERANK_FACTOR:,.0f} "
                     f"| {hours * RERANK_FACTOR / 64:,.1f} h |")
    tfidf = next(rows for kind, rows in result["indexes"].items() if kind.startswith("tf-idf"))
    worker = max(tfidf.get("ray-2", tfidf["local"]).get("worker_peak_rss_mib", [tfidf["local"]["peak_rss_mib"]]))
    dense_gib = 10e6 * DENSE_DIM * 4 / 2**30
    dense = next((rows for kind, rows in result["indexes"].items() if kind.startswith("dense")), None)
    dense_row = None if dense is None else dense.get("ray-2", dense["local"])
    dense_worker = 0 if dense_row is None else max(dense_row.get("worker_peak_rss_mib", [dense_row["peak_rss_mib"]]))
    dense_spans = 0 if dense_row is None else dense_row["spans"]
    lines += [
        "", "**A 10M-name dictionary (UMLS-sized), estimated, not measured.** Measured above: a tf-idf worker over the "
        f"150,749-name default index peaks at {worker:,.0f} MiB, most of it the Python process and its libraries. At "
        f"10M names the tf-idf matrix is about {TFIDF_MATRIX_MIB_PER_M_NAMES * 10 / 1024:.1f} GiB "
        f"({TFIDF_MATRIX_MIB_PER_M_NAMES} MiB per million names, eval/bench/bench_link.md). A load memory-maps it read-only "
        "(`tfidf/names.npz` written aligned; eval/bench/bench_index_sharing.md measures the sharing at 1 and 2 workers), so a "
        "node holds it once in its page cache, whatever its number of workers. Each worker still builds its own search "
        "structure from it: maxscore's postings (the search above 500,000 names), a transposed copy about as large as "
        "the matrix, and it holds the concept table (Arrow) and the per-name Python lists (names, term ids), roughly "
        "150–250 B per name: about 4 + 1.5–2.5 GiB private per worker, so a 64 GiB node runs about 9–10 tf-idf workers; "
        "writing the postings into the index and mapping them as well (the same aligned `.npz`, the kernel reads plain "
        "arrays) would leave about 2–3 GiB per worker, the design's next step. "
        f"A flat dense index holds 10M × {DENSE_DIM} × 4 B = {dense_gib:.1f} GiB of fp32 vectors, loaded as a "
        "memory-mapped `.npy` (`linker.index.dense`), read-only pages that every worker of a node shares through the "
        "page cache: the node holds them once, and each worker adds its encoder and the concept table"
        + (f" (a dense worker above peaked at {dense_worker:,.0f} MiB over a 76k-name index after "
           f"{dense_spans:,} spans: its memory grows while it encodes, by more than the encoder's weights; "
           "not isolated here)" if dense_worker else "") + ". "
        "FAISS IVF indexes are read with `IO_FLAG_MMAP` (their lists shared the same way); with FAISS 1.15 that flag "
        "left a flat FAISS file's vectors read into memory in a check here, and HNSW keeps its vectors in that same flat "
        "storage, so an HNSW index is still read into each worker.",
    ]
    return lines


def write_report(result: dict, out: Path) -> None:
    has_dense = any(kind.startswith("dense") for kind in result["indexes"])
    report = Report(out.name, out=out.parent, title="Scale-out: `linker normalize` in one process vs `linker normalize-ray`")
    lines = [
        "No GPU; every contender ran in a fresh process, "
        f"alternated within each round ({result['runs']} round{'s' * (result['runs'] != 1)} for tf-idf"
        + (f", {result['dense_runs']} for dense" if has_dense else "") + "); "
        "medians over the rounds. Load average (1/5/15 min) before "
        "and after each run is in the JSON; over the whole run it was "
        f"{result['load_min']:.1f}–{result['load_max']:.1f} (1-minute)."
        + (f" {result['note']}" if result.get("note") else "") + " Spans: half NCBI-disease test mentions, half names "
        "of the index's own dictionary (seed 0, with replacement), k = 5.", "",
        "**spans/s** over wall time depend on the load; **spans per linking CPU-second** (a worker's CPU time after "
        "its index is loaded) is the figure to plan with: a dedicated core gives that many spans per second.", "",
        "| index | contender | spans | wall s (Ray start) | spans/s wall | spans/s linking phase | spans / linking CPU-s "
        "| index load s | peak RSS MiB per worker |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, rows in result["indexes"].items():
        for name, r in rows.items():
            start = f" ({r['ray_start_s']:.1f})" if "ray_start_s" in r else ""
            phase = r.get("spans_per_s_link", r.get("spans_per_s_job"))
            rss = ", ".join(f"{x:,.0f}" for x in r.get("worker_peak_rss_mib", [r["peak_rss_mib"]]))
            lines.append(f"| {kind} | {name} | {r['spans']:,} | {r['wall_s']:.1f}{start} | {r['spans_per_s_wall']:,.0f} "
                         f"| {phase:,.0f} | {r['spans_per_link_cpu_s']:,.0f} | {r['load_s']:.1f} | {rss} |")
    lines += ["", "The Ray linking phase is the job from the first actor's start to `_SUCCESS` (actor start and index "
              "load included); the local one is `normalize_jsonl` after `Linker.load`. The local process searches "
              "and encodes with 2 threads; a Ray worker reserves 1 CPU and keeps to one thread (Ray sets "
              "OMP_NUM_THREADS=1, which torch, FAISS and the tf-idf search follow).", ""]
    for key, rep in result.get("repetition", {}).items():
        lines.append(f"Repetition ({key} spans): {rep['distinct']:,} distinct texts of {rep['spans']:,} "
                     f"({100 * rep['distinct_share']:.1f}%); `Linker.link` links each distinct text of a batch of "
                     f"{BATCH:,} once, and {100 * rep['distinct_per_batch_local']:.1f}% (local) / "
                     f"{100 * rep['distinct_per_batch_ray']:.1f}% (Ray, per shard) of the spans were a batch's "
                     "distinct texts: the work actually done. A stream with fewer repeats costs more per span.")
    if result.get("repetition"):
        lines.append("")
    for kind, rows in result["indexes"].items():
        local = rows["local"]["spans_per_link_cpu_s"]
        shares = [f"{rows[n]['spans_per_link_cpu_s'] / local:.2f}× ({n})" for n in ("ray-1", "ray-2") if n in rows]
        parts = [f"Ray workers link {' and '.join(shares)} the spans per CPU-second of the local process"]
        raw = result["raw"].get(kind) or result["raw"].get("tfidf" if kind.startswith("tf-idf") else "dense", {})
        if raw.get("ray-1") and raw.get("ray-2"):
            ratios = [two["job_s"] / one["job_s"] for one, two in zip(raw["ray-1"], raw["ray-2"])]
            speedup = 1 / statistics.median(ratios)
            # Below 1.2x the second worker did not get a core of its own (load, the driver): no scaling claim.
            verdict = (f"a {speedup:.2f}× wall-clock speed-up from the second worker (median), on {os.cpu_count()} "
                       "cores that also run the driver" if speedup >= 1.2 else
                       f"{speedup:.2f}× (median): the second worker seldom had a core to itself at this load, so "
                       "wall-clock scaling is not established here, only the per-CPU cost")
            parts.append(f"the 2-worker job took {', '.join(f'{r:.2f}' for r in ratios)}× the 1-worker job's wall time "
                         f"(per round): {verdict}")
        lines.append(f"- {kind}: " + "; ".join(parts) + ".")
    for kind, rows in result["indexes"].items():
        ray = [rows[n]["spans_per_link_cpu_s"] for n in ("ray-1", "ray-2") if n in rows]
        if kind.startswith("dense") and ray:
            local = rows["local"]["spans_per_link_cpu_s"]
            gap = ("Here the local process spent far more CPU per span than a one-thread worker, the likely cause "
                   "being waiting threads that spin under load; it was not isolated here"
                   if local < 0.8 * min(ray) else
                   f"Here both spent about the same CPU per span ({local:,.0f} vs {', '.join(f'{r:,.0f}' for r in ray)} "
                   "spans per CPU-second)")
            lines += ["", f"Dense: the local process lets torch use both cores, a Ray worker one. {gap}. The "
                      "one-thread figure is the one to plan with."]
    lines += [""]
    lines += capacity_plan(result)
    report.write(result, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=["local", "ray"])
    parser.add_argument("--input", type=Path)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--tfidf-spans", type=int, default=100_000)
    parser.add_argument("--dense-spans", type=int, default=4_000)
    parser.add_argument("--dense-names", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dense-runs", type=int, default=3)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--contenders", type=lambda s: s.split(","), default=CONTENDERS,
                        help="Comma-separated subset of local,ray-1,ray-2, run in this order (a long run may skip ray-1).")
    parser.add_argument("--out", type=Path, default=Path("eval/bench/bench_scaleout"), help="the report's path stem")
    parser.add_argument("--note", default="", help="What else ran on the machine (stored in the JSON, shown in the report).")
    args = parser.parse_args()
    if "local" not in args.contenders or not set(args.contenders) <= set(CONTENDERS):
        parser.error(f"--contenders: expected local and a subset of {','.join(CONTENDERS)}, found {','.join(args.contenders)}"
                     " (the report compares Ray with the local process)")
    if args.child:
        print(json.dumps(child_local(args) if args.child == "local" else child_ray(args)))
        return

    mentions = ncbi_mentions()
    result = {"command": command(), "note": args.note, "runs": args.runs, "dense_runs": args.dense_runs, "k": args.k, "indexes": {}, "raw": {}}
    with tempfile.TemporaryDirectory(prefix="linker-scaleout-") as tmp:
        scratch = Path(tmp)
        names = index_names(args.index)
        texts = span_texts(mentions, names, args.tfidf_spans)
        result["repetition"] = {"tfidf": distinct_shares(texts, args.shards)}
        shards, whole = write_spans(scratch / "tfidf", texts, args.shards)
        raw = contenders(args.index, shards, whole, scratch / "tfidf", args.runs, args.k, args.contenders)
        result["raw"]["tfidf"] = raw
        result["indexes"][tfidf_label(args.index)] = {n: summarise(r) for n, r in raw.items()}
        if not args.skip_dense:
            dense, dense_names = build_dense(scratch, args.dense_names)
            texts = span_texts(mentions, dense_names, args.dense_spans)
            result["repetition"]["dense"] = distinct_shares(texts, args.shards)
            shards, whole = write_spans(scratch / "dense_spans", texts, args.shards)
            raw = contenders(dense, shards, whole, scratch / "dense_spans", args.dense_runs, args.k, args.contenders)
            result["raw"]["dense"] = raw
            result["indexes"][dense_label(len(dense_names))] = {
                n: summarise(r) for n, r in raw.items()}
    loads = [r["load_average"][i] for runs in result["raw"].values() for rows in runs.values() for r in rows
             for i in (0, 3)]
    result["load_min"], result["load_max"] = min(loads), max(loads)
    result["capacity_core_hours_1e8"] = {kind: {name: capacity(r["spans_per_link_cpu_s"]) for name, r in rows.items()}
                                         for kind, rows in result["indexes"].items()}
    write_report(result, args.out)


if __name__ == "__main__":
    main()
