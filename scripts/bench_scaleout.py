"""Scale-out benchmark: `linker normalize` in one process vs `--engine ray` at 1 and 2 workers.

    nice -n 5 python scripts/bench_scaleout.py --data ../shared/data --index indexes/default \\
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
the scratch folder). Writes eval/bench_scaleout.{md,json}.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEED = 0


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


def ncbi_mentions(data: Path) -> list[str]:
    from linker.formats.pubtator import read_pubtator

    return [a.text for a in read_pubtator(data / "ncbi_disease" / "NCBItestset_corpus.txt")]


def write_spans(folder: Path, mentions: list[str], names: list[str], n: int, shards: int) -> tuple[Path, Path]:
    """`shards` JSONL shards in folder/shards and the same spans in one file folder/all.jsonl."""
    rng = random.Random(SEED)
    (folder / "shards").mkdir(parents=True)
    per = -(-n // shards)
    with (folder / "all.jsonl").open("w", encoding="utf-8") as whole:
        for s in range(shards):
            with (folder / "shards" / f"part-{s:03d}.jsonl").open("w", encoding="utf-8") as part:
                for i in range(s * per, min(n, (s + 1) * per)):
                    text = rng.choice(mentions) if i % 2 else rng.choice(names)
                    line = json.dumps({"id": f"s{i}", "text": text}, ensure_ascii=False) + "\n"
                    part.write(line)
                    whole.write(line)
    return folder / "shards", folder / "all.jsonl"


def run_child(kind: str, index: Path, source: Path, output: Path, workers: int, k: int) -> dict:
    load_before = os.getloadavg()
    command = [sys.executable, __file__, "--child", kind, "--index", str(index), "--input", str(source),
               "--output", str(output), "--workers", str(workers), "--k", str(k)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    return result


def contenders(index: Path, shards: Path, whole: Path, scratch: Path, runs: int, k: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {"local": [], "ray-1": [], "ray-2": []}
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


def build_dense(data: Path, scratch: Path, names: int) -> tuple[Path, list[str]]:
    """A flat minilm index over `names` MEDIC name rows (seed 0), built in the scratch folder."""
    import pyarrow.parquet as pq

    table = scratch / "medic.parquet"
    subprocess.run([sys.executable, "-m", "linker", "-q", "dict", "build", "--source", "tsv",
                    str(data / "ncbi_disease" / "medic_06Jul2012.txt"), "--out", str(table)], cwd=ROOT, check=True)
    full = pq.read_table(table)
    keep = sorted(random.Random(SEED).sample(range(full.num_rows), min(names, full.num_rows)))
    pq.write_table(full.take(keep), scratch / "medic_sample.parquet")
    subprocess.run([sys.executable, "-m", "linker", "-q", "index", "build", "--dict", str(scratch / "medic_sample.parquet"),
                    "--kind", "dense", "--encoder", "minilm", "--out", str(scratch / "dense")], cwd=ROOT, check=True)
    return scratch / "dense", full.take(keep).column("name").to_pylist()


def capacity(per_cpu_s: float) -> float:
    """Core-hours for 1e8 spans at this many spans per CPU second."""
    return 1e8 / per_cpu_s / 3600


def write_report(result: dict, out: Path, command: str) -> None:
    from linker.fileio import portable_paths

    lines = [
        "# Scale-out: `linker normalize` in one process vs `--engine ray`", "",
        f"Produced by `{command}`.", "",
        f"Machine: {os.cpu_count()} CPU cores shared with other jobs (no GPU); every contender ran in a fresh process, "
        f"alternated within each of {result['runs']} rounds; medians over the rounds. Load average (1/5/15 min) before "
        "and after each run is in the JSON; over the whole run it was "
        f"{result['load_min']:.1f}–{result['load_max']:.1f} (1-minute). Spans: half NCBI-disease test mentions, half names "
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
              "load included); the local one is `normalize_jsonl` after `Linker.load`.", ""]
    lines += result.get("plan", [])
    out.with_suffix(".md").write_text(portable_paths("\n".join(lines) + "\n"), encoding="utf-8")
    out.with_suffix(".json").write_text(portable_paths(json.dumps(result, indent=2)) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=["local", "ray"])
    parser.add_argument("--input", type=Path)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--index", type=Path, default=ROOT / "indexes" / "default")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--tfidf-spans", type=int, default=100_000)
    parser.add_argument("--dense-spans", type=int, default=4_000)
    parser.add_argument("--dense-names", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "bench_scaleout")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_local(args) if args.child == "local" else child_ray(args)))
        return
    import pyarrow.parquet as pq

    command = "python " + " ".join([Path(sys.argv[0]).relative_to(ROOT).as_posix() if Path(sys.argv[0]).is_absolute()
                                    else sys.argv[0], *sys.argv[1:]])
    mentions = ncbi_mentions(args.data)
    result = {"command": command, "runs": args.runs, "k": args.k, "indexes": {}, "raw": {}}
    with tempfile.TemporaryDirectory(prefix="linker-scaleout-") as tmp:
        scratch = Path(tmp)
        names = pq.read_table(args.index / "concepts.parquet", columns=["name"]).column("name").to_pylist()
        shards, whole = write_spans(scratch / "tfidf", mentions, names, args.tfidf_spans, args.shards)
        raw = contenders(args.index, shards, whole, scratch / "tfidf", args.runs, args.k)
        result["raw"]["tfidf"] = raw
        result["indexes"]["tf-idf (default, 150,749 names)"] = {n: summarise(r) for n, r in raw.items()}
        if not args.skip_dense:
            dense, dense_names = build_dense(args.data, scratch, args.dense_names)
            shards, whole = write_spans(scratch / "dense_spans", mentions, dense_names, args.dense_spans, args.shards)
            raw = contenders(dense, shards, whole, scratch / "dense_spans", args.runs, args.k)
            result["raw"]["dense"] = raw
            result["indexes"][f"dense (minilm flat, {args.dense_names:,} MEDIC names)"] = {
                n: summarise(r) for n, r in raw.items()}
    loads = [r["load_average"][i] for runs in result["raw"].values() for rows in runs.values() for r in rows
             for i in (0, 3)]
    result["load_min"], result["load_max"] = min(loads), max(loads)
    result["capacity_core_hours_1e8"] = {kind: {name: capacity(r["spans_per_link_cpu_s"]) for name, r in rows.items()}
                                         for kind, rows in result["indexes"].items()}
    write_report(result, args.out, command)
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
