"""Load test of `linker serve` and `linker normalize`; writes eval/service/service_load.{md,json}.

    python -m bench.service_load --index indexes/default [--seconds 10] [--sizes 1,10] [--clients 8] [--spans 10000]

1. Starts `linker serve` on 127.0.0.1 (a free port, loopback only), waits for /health, then
   `--clients` concurrent clients POST /link for `--seconds` per request size (1 and 10
   mentions per request by default); reports requests/s, mentions/s, p50/p99 latency, failed
   requests, and the server's RSS sampled every second (start / 1/4 / 1/2 / end / max) to show
   whether memory is steady. The server is stopped at the end.
2. Writes `--spans` spans (dictionary names of the index, perturbed: case, a dropped or swapped
   character, word order, a plural s; seed 0) to a JSONL file and times `linker normalize` on it
   end to end (index loading included), with the process's peak RSS; it also reports how many
   perturbed names came back with their own concept at rank 1 (a sanity check, not an evaluation).

Everything stops by itself. Timings depend on the machine's load: the load average before and
after is recorded next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import pyarrow.parquet as pq

from bench.report import REPO as ROOT
from bench.report import Report
SEED = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perturb(name: str, rng: random.Random) -> str:
    """One of the lexical variations a linker must survive (case, typo, word order, plural)."""
    kind = rng.randrange(6)
    if kind == 0:
        return name.lower()
    if kind == 1 and len(name) > 4:  # drop one inner character
        i = rng.randrange(1, len(name) - 1)
        return name[:i] + name[i + 1 :]
    if kind == 2 and len(name) > 4:  # swap two adjacent inner characters
        i = rng.randrange(1, len(name) - 2)
        return name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    if kind == 3 and " " in name:  # move the first word to the end
        first, rest = name.split(" ", 1)
        return f"{rest} {first}"
    if kind == 4:
        return name + "s"
    return name.upper()


def make_spans(index: Path, n: int) -> list[dict]:
    table = pq.read_table(index / "concepts.parquet", columns=["concept_id", "name"])
    ids, names = table.column("concept_id").to_pylist(), table.column("name").to_pylist()
    rng = random.Random(SEED)
    rows = rng.sample(range(len(names)), min(n, len(names)))
    return [{"id": f"s{i}", "text": perturb(names[r], rng), "source_concept": ids[r]} for i, r in enumerate(rows)]


class RssSampler(threading.Thread):
    """Samples a process's resident memory every `interval` seconds until stopped."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopped.is_set():
            try:
                self.samples.append((time.monotonic() - start, self.process.memory_info().rss))
            except psutil.Error:
                return
            self.stopped.wait(self.interval)


def mib(n: int) -> float:
    return round(n / 2**20, 1)


async def drive(base: str, texts: list[str], clients: int, seconds: float, per_request: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def client(worker: int) -> None:
        nonlocal failures
        i = worker
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            while time.monotonic() < deadline:
                mentions = [{"text": texts[(i + j) % len(texts)], "id": i + j} for j in range(per_request)]
                i += clients * per_request
                started = time.perf_counter()
                try:
                    response = await http.post("/link", json={"mentions": mentions, "k": 5})
                    ok = response.status_code == 200 and len(response.json()["results"]) == per_request
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                failures += not ok

    await asyncio.gather(*(client(w * per_request) for w in range(clients)))
    return latencies, failures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


STARTUP_LIMIT = 900  # seconds; a dense index's server starts in ~15 s on a quiet machine, minutes on a loaded one


def start_server(index: Path) -> tuple[subprocess.Popen, str, float]:
    """`linker serve` of `index`; returns (process, base URL, start-up seconds) once /health answers. Its stderr
    goes to a temporary file (a pipe nobody reads could fill and block it)."""
    port = free_port()
    started = time.perf_counter()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "linker", "serve", "--index", str(index.resolve()), "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
    )
    proc.log = log
    base = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"server exited: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base, time.perf_counter() - started
        except httpx.TransportError:
            time.sleep(0.2)
        if time.perf_counter() - started > STARTUP_LIMIT:
            stop_server(proc)
            raise SystemExit(f"server did not answer /health within {STARTUP_LIMIT} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def drive_sizes(base: str, texts: list[str], clients: int, seconds: float, sizes: list[int]) -> list[dict]:
    """A run of `seconds` per request size: throughput and latency percentiles."""
    runs = []
    for size in sizes:
        wall = time.perf_counter()
        latencies, failures = asyncio.run(drive(base, texts, clients, seconds, size))
        wall = time.perf_counter() - wall
        runs.append({
            "mentions_per_request": size,
            "seconds": round(wall, 1),
            "requests": len(latencies),
            "failed_requests": failures,
            "requests_per_second": round(len(latencies) / wall, 1),
            "mentions_per_second": round(size * len(latencies) / wall, 1),
            "latency_ms": {
                "p50": round(1000 * statistics.median(latencies), 1),
                "p99": round(1000 * percentile(latencies, 0.99), 1),
                "max": round(1000 * max(latencies), 1),
            },
        })
    return runs


def service_phase(index: Path, texts: list[str], clients: int, seconds: float, sizes: list[int]) -> dict:
    """One server process; a run of `seconds` per request size in `sizes`; RSS sampled across all runs."""
    proc, base, startup = start_server(index)
    try:
        sampler = RssSampler(proc.pid)
        sampler.start()
        runs = drive_sizes(base, texts, clients, seconds, sizes)
        sampler.stopped.set()
        sampler.join()
    finally:
        stop_server(proc)
    rss = [r for _, r in sampler.samples]
    return {
        "clients": clients,
        "k": 5,
        "startup_seconds": round(startup, 1),
        "runs": runs,
        # "start" is the idle server right after /health answered; a leak would keep growing
        # from the first quarter to the end, a warm-up (allocator arenas of the threadpool,
        # the Linker's preferred-name cache) levels off.
        "server_rss_mib": {
            "start": mib(rss[0]),
            "quarter": mib(rss[len(rss) // 4]),
            "middle": mib(rss[len(rss) // 2]),
            "end": mib(rss[-1]),
            "max": mib(max(rss)),
            "samples": len(rss),
        },
    }


def batch_phase(index: Path, spans: list[dict]) -> dict:
    with tempfile.TemporaryDirectory(prefix="linker-load-") as tmp:
        src, out = Path(tmp) / "spans.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in spans), encoding="utf-8")
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "linker", "-q", "normalize", "--index", str(index), "--input", str(src),
             "--format", "jsonl", "--output", str(out), "--k", "1"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        sampler = RssSampler(proc.pid, interval=0.2)
        sampler.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - started
        sampler.stopped.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"linker normalize failed: {err.decode(errors='replace')}")
        records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    top1 = sum(1 for r in records if r["candidates"] and r["candidates"][0]["concept_id"] == r["source_concept"])
    rss = [r for _, r in sampler.samples]
    return {
        "spans": len(spans),
        "output_lines": len(records),
        "linked": sum(1 for r in records if r["candidates"]),
        "seconds_total": round(wall, 1),
        "spans_per_second_incl_index_load": round(len(spans) / wall, 1),
        "peak_rss_mib": mib(max(rss)) if rss else None,
        "perturbed_name_top1_own_concept": round(top1 / len(records), 4),
    }


def write_report(report: Report, result: dict) -> None:
    s, b = result["service"], result["batch"]
    lines = [
        f"Index `{result['index']}` ({result['index_version']}).",
        "",
        f"## HTTP service (`linker serve`, {s['clients']} concurrent clients on loopback, k={s['k']})",
        "",
        "| mentions/request | seconds | requests | failed | requests/s | mentions/s | p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['mentions_per_request']} | {r['seconds']} | {r['requests']:,} | {r['failed_requests']} | "
            f"{r['requests_per_second']} | {r['mentions_per_second']} | {r['latency_ms']['p50']} | "
            f"{r['latency_ms']['p99']} | {r['latency_ms']['max']} |"
            for r in s["runs"]
        ],
        "",
        "Server RSS (MiB), sampled every second over all runs: idle after start-up, then at 1/4, 1/2 and the end:",
        "",
        "| start | 1/4 | 1/2 | end | max |",
        "|---:|---:|---:|---:|---:|",
        "| " + " | ".join(str(s["server_rss_mib"][key]) for key in ("start", "quarter", "middle", "end", "max")) + " |",
        "",
        f"Server start-up (index load and verification) took {s['startup_seconds']} s.",
        "",
    ]
    if b is not None:
        lines += [
            f"## Batch (`linker normalize --format jsonl --k 1`, {b['spans']:,} perturbed dictionary names)",
            "",
            "| spans | linked | seconds (incl. index load) | spans/s | peak RSS MiB | perturbed name -> own concept at rank 1 |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {b['spans']:,} | {b['linked']:,} | {b['seconds_total']} | {b['spans_per_second_incl_index_load']} | "
            f"{b['peak_rss_mib']} | {b['perturbed_name_top1_own_concept']:.1%} |",
        ]
    report.write(result, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=ROOT / "indexes" / "default")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per request size")
    parser.add_argument("--sizes", default="1,10", help="mentions per request, one run each (comma-separated)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--spans", type=int, default=10_000, help="batch spans; 0 skips the batch phase")
    parser.add_argument("--out", type=Path, default=Path("eval/service/service_load"), help="the report's path stem")
    args = parser.parse_args()
    if not (args.index / "manifest.json").is_file():
        raise SystemExit(f"{args.index}: no index folder; build it first with `make indexes/default`")
    report = Report(args.out.name, out=args.out.parent, title="Service and batch load test")
    manifest = json.loads((args.index / "manifest.json").read_text())
    spans = make_spans(args.index, args.spans or 1000)  # the service phase needs texts too
    result = {
        "index": args.index.name,
        "index_version": f"{manifest['kind']} built {manifest['built_at']}, {manifest['counts']['names']:,} names",
    }
    result["service"] = service_phase(args.index, [s["text"] for s in spans], args.clients, args.seconds,
                                      [int(x) for x in args.sizes.split(",")])
    result["batch"] = batch_phase(args.index, spans) if args.spans else None
    write_report(report, result)


if __name__ == "__main__":
    main()
