"""Memory of tf-idf workers on one machine: the name matrix read into each process vs memory-mapped.

    python -m bench.index_sharing --index indexes/default --rounds 3

Two copies of the index differ only in how `tfidf/names.npz` was written (same matrix, same bytes
of every array):

- read: `scipy.sparse.save_npz(..., compressed=False)`, as indexes were written before: each
  process that loads it reads the matrix into its own memory;
- mapped: `linker.index.tfidf.save_npz_aligned`, what `linker index build` writes now: a load maps
  the arrays read-only, and the processes of a machine share those pages through the page cache.

For each copy, 1 and then 2 worker processes (plain processes, as a Ray actor or a service worker
is one) load the index with `Linker.load` and link `--spans` spans (so that search touches what it
uses), then wait while the parent reads each one's /proc/PID/smaps_rollup: RSS and PSS (a shared
page counts 1/n in each of the n processes that map it). The copies alternate within each of
`--rounds` rounds; the report gives medians and the load average. Writes eval/bench/bench_index_sharing.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import REPO, Report

FIELDS = ("Rss", "Pss", "Shared_Clean", "Private_Clean", "Private_Dirty")


def smaps_rollup(pid: int) -> dict[str, float]:
    """MiB of the fields `FIELDS` of /proc/PID/smaps_rollup."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts and parts[0].rstrip(":") in FIELDS:
            out[parts[0].rstrip(":")] = int(parts[1]) / 1024  # kB
    return out


def child(index: Path, spans: int) -> None:
    """Load, link `spans` names of the index, report, then wait for the parent to close stdin."""
    import pyarrow.parquet as pq

    from linker.link import Linker

    started, cpu = time.perf_counter(), time.process_time()
    linker = Linker.load(index)
    loaded, cpu_loaded = time.perf_counter(), time.process_time()
    names = pq.read_table(index / "concepts.parquet", columns=["name"]).column("name").to_pylist()
    linker.link(names[:: max(1, len(names) // spans)][:spans], k=5)
    print(json.dumps({"pid": os.getpid(), "load_s": loaded - started, "load_cpu_s": cpu_loaded - cpu,
                      "mapped": not linker.index.names.matrix.data.flags.writeable}), flush=True)
    sys.stdin.read()


def variants(index: Path, scratch: Path) -> dict[str, Path]:
    """The two copies of `index` (module docstring), with their manifests' file entries updated."""
    import scipy.sparse as sp

    from linker.index.manifest import file_entry
    from linker.index.tfidf import MATRIX, load_npz_mapped, save_npz_aligned

    matrix = load_npz_mapped(index / MATRIX)
    out = {}
    for name, write in (("read", lambda p: sp.save_npz(p, matrix, compressed=False)), ("mapped", lambda p: save_npz_aligned(p, matrix))):
        folder = scratch / name
        shutil.copytree(index, folder)
        (folder / MATRIX).unlink()
        write(folder / MATRIX)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        manifest["files"][MATRIX] = file_entry(folder, MATRIX)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        out[name] = folder
    return out


def measure(folder: Path, workers: int, spans: int) -> dict:
    load_before = os.getloadavg()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.index_sharing", "--child", str(folder), "--spans", str(spans)],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(workers)]
    try:
        reports = []
        for proc in procs:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"a worker on {folder} exited with {proc.wait()}")
            reports.append(json.loads(line))
        for report in reports:  # every worker is loaded and idle: read them all now
            report["memory_mib"] = smaps_rollup(report["pid"])
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait()
    return {"workers": reports, "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())]}


def summary(runs: list[dict]) -> dict:
    """Medians over rounds: per-worker RSS and PSS (the mean of a round's workers), load seconds."""
    def median(get) -> float:
        return statistics.median(statistics.mean(get(w) for w in run["workers"]) for run in runs)

    return {"rss_mib": median(lambda w: w["memory_mib"]["Rss"]), "pss_mib": median(lambda w: w["memory_mib"]["Pss"]),
            "private_dirty_mib": median(lambda w: w["memory_mib"]["Private_Dirty"]),
            "clean_mib": median(lambda w: w["memory_mib"]["Shared_Clean"] + w["memory_mib"]["Private_Clean"]),
            "load_s": median(lambda w: w["load_s"]), "load_cpu_s": median(lambda w: w["load_cpu_s"]),
            "mapped": all(w["mapped"] for run in runs for w in run["workers"])}


def write_report(report: Report, result: dict) -> None:
    loads = [r["load_average"][i] for runs in result["raw"].values() for r in runs for i in (0, 3)]
    lines = [
        f"Index: {result['index_description']}; `tfidf/names.npz` is {result['matrix_mib']:.1f} MiB. "
        f"{result['rounds']} rounds, the two copies alternated in each, medians; every worker links "
        f"{result['spans']} of the index's names after loading. 1-minute load average {min(loads):.1f}–{max(loads):.1f} over the run. Plain processes, not Ray "
        "actors (an actor is one process: the same pages are shared).", "",
        "| matrix file | workers | RSS MiB per worker | PSS MiB per worker | private dirty MiB per worker "
        "| file-backed clean MiB per worker | load s | load CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in result["summary"].items():
        name, workers = key.rsplit("-", 1)
        lines.append(f"| {name} | {workers} | {row['rss_mib']:.0f} | {row['pss_mib']:.0f} | {row['private_dirty_mib']:.0f} "
                     f"| {row['clean_mib']:.0f} | {row['load_s']:.2f} | {row['load_cpu_s']:.2f} |")
    read1, mapped1 = result["summary"]["read-1"], result["summary"]["mapped-1"]
    read2, mapped2 = result["summary"]["read-2"], result["summary"]["mapped-2"]
    lines += [
        "", "PSS is what a worker costs the machine (a page shared by n processes counts 1/n in each); private dirty "
        "memory is the worker's own (anonymous) memory, which no other process can share and the kernel cannot drop; "
        "file-backed clean pages (libraries, and the mapped matrix) are shared and can be dropped and re-read. "
        f"Mapped, a worker's private dirty memory is {read1['private_dirty_mib'] - mapped1['private_dirty_mib']:.0f} "
        f"MiB smaller with 1 worker ({read1['private_dirty_mib']:.0f} → {mapped1['private_dirty_mib']:.0f}) and "
        f"{read2['private_dirty_mib'] - mapped2['private_dirty_mib']:.0f} MiB with 2 "
        f"({read2['private_dirty_mib']:.0f} → {mapped2['private_dirty_mib']:.0f}); with 2 workers its PSS is "
        f"{read2['pss_mib'] - mapped2['pss_mib']:.0f} MiB smaller ({read2['pss_mib']:.0f} → {mapped2['pss_mib']:.0f}), "
        "the matrix being counted half in each. Load time is the same within the noise of a shared machine (the load "
        "CPU-s column). What stays private: the search's structures built at load from the matrix (the exact search's "
        "transposed shards, as large as the matrix here; maxscore's postings above 500,000 names), the concept table, "
        "the per-name lists and the libraries' heaps.",
    ]
    report.write(result, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.spans)
        return
    report = Report("bench_index_sharing", out=args.out,
                    title="Index sharing: tf-idf workers with the name matrix read vs memory-mapped")
    manifest = json.loads((args.index / "manifest.json").read_text(encoding="utf-8"))
    result = {"rounds": args.rounds, "spans": args.spans,
              "index_description": f"{args.index.name} ({manifest['kind']}, {manifest['counts']['names']:,} names, "
                                   f"{manifest.get('features', '?')} n-gram features)",
              "matrix_mib": (args.index / "tfidf" / "names.npz").stat().st_size / 2**20, "raw": {}}
    with tempfile.TemporaryDirectory(prefix="linker-sharing-") as tmp:
        folders = variants(args.index, Path(tmp))
        for round_ in range(args.rounds):
            for workers in (1, 2):
                for name, folder in folders.items():
                    run = measure(folder, workers, args.spans)
                    print(f"round {round_} {name}-{workers}: {json.dumps(run)}", file=sys.stderr, flush=True)
                    result["raw"].setdefault(f"{name}-{workers}", []).append(run)
    result["summary"] = {key: summary(runs) for key, runs in sorted(result["raw"].items(), key=lambda kv: (kv[0].split("-")[1], not kv[0].startswith("read")))}
    write_report(report, result)


if __name__ == "__main__":
    main()
