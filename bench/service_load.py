"""Load test of `linker serve` beside the library it serves, and of `linker normalize`: eval/service/NAME.{md,json}.

    python -m bench.service_load --index indexes/default [--seconds 10] [--sizes 1,10] [--clients 8] [--rounds 3]
        [--baseline DIR] [--baseline-index DIR] [--library-batch 500] [--spans 10000] [--annotate 0]
        [--out eval/service/service_load]

1. Starts `linker serve` of this checkout on 127.0.0.1 (a free port, loopback only) and, with `--baseline DIR`, the
   same command run from the source tree DIR (`git archive COMMIT | tar -x -C DIR`): before beside after, on one
   index, machine and load. `--baseline-index DIR` serves another index as "before" (this checkout's code, or
   the `--baseline` tree's): an index before and after a change of `make demo`'s recipe. Waits for /health, then warms each server up (its first calls load lazy parts).
2. `--rounds` rounds, each: for every request size, the library's batched rate (one `Linker.link` call of
   `--library-batch` mentions in this process, at its default threads and at one BLAS thread, the service's), then
   every server with `--clients` closed-loop clients for `--seconds` (requests/s, mentions/s, p50/p99 latency,
   failed requests); then one client sending one mention at a time to every server, and the library's one-mention
   call. Servers take turns first from round to round; the 1-minute load average is recorded at every measurement.
   The report gives medians over rounds and, per round, the service's mentions/s over the library's best.
3. The server's RSS is sampled every second (start / 1/4 / 1/2 / end / max) to show whether memory is steady.
4. Writes `--spans` spans (dictionary names of the index, perturbed: case, a dropped or swapped character, word
   order, a plural s; seed 0) to a JSONL file and times `linker normalize` on it end to end (index loading
   included), with the process's peak RSS and how many perturbed names came back with their own concept at rank 1
   (a sanity check, not an evaluation). `--spans 0` skips it.
5. `--annotate N`: after the /link rounds, every server in turns answers POST /annotate, one of the first N PHEE
   development sentences a request, from `--clients` clients and then from one, `--rounds` rounds.

Everything stops by itself. Timings depend on the machine's load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from bench import data
from bench.report import REPO as ROOT
from bench.report import Report

SEED = 0
WARM_UP_SECONDS = 5  # per server, not measured: the first calls load the index's lazy parts
STARTUP_LIMIT = 900  # seconds; a dense index's server starts in ~15 s on a quiet machine, minutes on a loaded one


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

    def summary(self) -> dict:
        # "start" is the idle server right after /health answered; a leak would keep growing from the first
        # quarter to the end, a warm-up (allocator arenas, the Linker's preferred-name cache) levels off.
        rss = [r for _, r in self.samples] or [0]
        return {"start": mib(rss[0]), "quarter": mib(rss[len(rss) // 4]), "middle": mib(rss[len(rss) // 2]),
                "end": mib(rss[-1]), "max": mib(max(rss)), "samples": len(rss)}


def mib(n: int) -> float:
    return round(n / 2**20, 1)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ----------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A running `linker serve`: its label ("service", or "before" / "after" with a baseline), process, URL, RSS."""

    label: str
    tree: Path
    proc: subprocess.Popen
    base: str
    startup_seconds: float
    log: Any = None
    sampler: RssSampler | None = None
    runs: list = field(default_factory=list)


def start_server(index: Path, label: str = "service", tree: Path = ROOT) -> Server:
    """`linker serve` of `index` run from the source tree `tree`, once /health answers. Its stderr goes to a
    temporary file (a pipe nobody reads could fill and block it)."""
    port = free_port()
    started = time.perf_counter()
    log = tempfile.TemporaryFile()
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree != ROOT else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "linker", "serve", "--index", str(index.resolve()), "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
    server = Server(label, tree, proc, f"http://127.0.0.1:{port}", 0.0, log)
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"server ({label}, {tree}) exited: {log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                server.startup_seconds = round(time.perf_counter() - started, 1)
                server.sampler = RssSampler(proc.pid)
                server.sampler.start()
                return server
        except httpx.TransportError:
            time.sleep(0.2)
        if time.perf_counter() - started > STARTUP_LIMIT:
            stop_server(server)
            raise SystemExit(f"server ({label}) did not answer /health within {STARTUP_LIMIT} s")


def rel_index(path: Path) -> str:
    """An index folder as the report names it: relative to the repository when inside it, else its name."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else f"<scratch>/{path.name}"


def stop_server(server: Server) -> None:
    if server.sampler is not None:
        server.sampler.stopped.set()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


async def drive(base: str, texts: list[str], clients: int, seconds: float, per_request: int,
                route: str = "/link") -> tuple[list[float], int]:
    """Closed-loop clients for `seconds`: (each request's latency, failed requests). /link sends `per_request`
    mentions a request at k = 5, /annotate `per_request` documents; a request fails unless it gets 200 and a
    result for each."""
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def client(worker: int) -> None:
        nonlocal failures
        i = worker
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            while time.monotonic() < deadline:
                items = [{"text": texts[(i + j) % len(texts)], "id": i + j} for j in range(per_request)]
                body = {"mentions": items, "k": 5} if route == "/link" else {"texts": items}
                i += clients * per_request
                started = time.perf_counter()
                try:
                    response = await http.post(route, json=body)
                    ok = response.status_code == 200 and len(response.json()["results"]) == per_request
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                failures += not ok

    await asyncio.gather(*(client(w * per_request) for w in range(clients)))
    return latencies, failures


def service_run(server: Server, texts: list[str], clients: int, seconds: float, size: int,
                route: str = "/link") -> dict:
    """`clients` closed-loop clients of `size` mentions (documents, for /annotate) a request for `seconds`."""
    load = load1()
    wall = time.perf_counter()
    latencies, failures = asyncio.run(drive(server.base, texts, clients, seconds, size, route))
    wall = time.perf_counter() - wall
    return {
        "server": server.label, "mentions_per_request": size, "clients": clients, "load": load,
        "seconds": round(wall, 1), "requests": len(latencies), "failed_requests": failures,
        "requests_per_second": round(len(latencies) / wall, 1),
        "mentions_per_second": round(size * len(latencies) / wall, 1),
        "latency_ms": {"p50": round(1000 * statistics.median(latencies), 1),
                       "p99": round(1000 * percentile(latencies, 0.99), 1),
                       "max": round(1000 * max(latencies), 1)},
    }


# ----------------------------------------------------------------------------- the library, in this process


# The library's thread settings: its defaults, and numpy's BLAS on one thread (the service's share on 2 cores).
SETTINGS = (("default_threads", None), ("one_blas_thread", 1))


class Library:
    """The index's `Linker` in this process: the rate a caller gets from one batched call, and one mention's call."""

    def __init__(self, index: Path, texts: list[str]) -> None:
        from linker.link import Linker  # imported here: the report and the servers need none of the library

        self.linker = Linker.load(index)
        self.texts = texts
        self._next = 0

    def _take(self, n: int) -> list[str]:
        """The next `n` texts of the pool, so that calls do not repeat the last call's texts."""
        out = [self.texts[(self._next + i) % len(self.texts)] for i in range(n)]
        self._next = (self._next + n) % len(self.texts)
        return out

    def batched(self, n: int) -> dict:
        """mentions/s of one `Linker.link` call of `n` mentions: at the library's default threads, and with numpy's
        BLAS on one thread (as the service runs its calls); the better of the two is the library's rate."""
        out = {"load": load1(), "mentions": n}
        for setting, threads in SETTINGS:
            texts = self._take(n)
            with threadpool_limits(threads, user_api="blas"):
                started = time.perf_counter()
                self.linker.link(texts, k=5)
                out[setting] = round(n / (time.perf_counter() - started), 1)
        out["mentions_per_second"] = max(out[setting] for setting, _ in SETTINGS)
        return out

    def one(self, seconds: float) -> dict:
        """p50 and p99 of one-mention calls, back to back for `seconds`, the two settings in turns; the better's."""
        load, latencies = load1(), {setting: [] for setting, _ in SETTINGS}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for setting, threads in SETTINGS:
                [text] = self._take(1)
                with threadpool_limits(threads, user_api="blas"):
                    started = time.perf_counter()
                    self.linker.link([text], k=5)
                    latencies[setting].append(time.perf_counter() - started)
        best = min(latencies.values(), key=statistics.median)
        return {"load": load, "calls": sum(map(len, latencies.values())),
                **{f"{setting}_p50_ms": round(1000 * statistics.median(xs), 1) for setting, xs in latencies.items()},
                "p50_ms": round(1000 * statistics.median(best), 1), "p99_ms": round(1000 * percentile(best, 0.99), 1)}


def in_turns(servers: list[Server], number: int) -> list[Server]:
    """The servers in round `number`'s order: who goes first takes turns."""
    return servers[number % len(servers):] + servers[: number % len(servers)]


def run_rounds(servers: list[Server], library: Library, texts: list[str], args: argparse.Namespace) -> dict:
    """Library and servers measured in turns, `args.rounds` times (see the module docstring). The library's rate of
    a round is the mean of its batched calls just before and just after the servers' runs, which halves the error
    of a load that drifts."""
    library_runs, sequential, library_one = [], [], []
    for number in range(args.rounds):
        order = in_turns(servers, number)
        for size in args.sizes:
            first = library.batched(args.library_batch)
            for server in order:
                server.runs.append({"round": number, **service_run(server, texts, args.clients, args.seconds, size)})
            last = library.batched(args.library_batch)
            rate = round((first["mentions_per_second"] + last["mentions_per_second"]) / 2, 1)
            library_runs.append({"round": number, "size": size, "mentions_per_second": rate, "calls": [first, last]})
            print(f"round {number} size {size}: " + ", ".join(f"{s.label} {s.runs[-1]['mentions_per_second']}"
                                                               for s in order)
                  + f" mentions/s, library {rate}", file=sys.stderr)
        library_one.append({"round": number, **library.one(args.seconds)})
        for server in order:
            sequential.append({"round": number, **service_run(server, texts, 1, args.seconds, 1)})
    return {"library_batched": library_runs, "library_one_mention": library_one, "sequential": sequential}


def annotate_texts(n: int) -> list[str]:
    """The first `n` sentences of PHEE's development split: case-report sentences, as /annotate's users send."""
    from linker.extract.data import read_phee

    if (reason := data.skip_reason("phee")) is not None:
        raise SystemExit(f"--annotate: {reason}")
    return [d.text for d in read_phee(data.get("phee").path("dev"))][:n]


def annotate_rounds(servers: list[Server], docs: list[str], args: argparse.Namespace) -> list[dict]:
    """POST /annotate, one document a request: `args.clients` closed-loop clients, then one client, every server in
    turns (who goes first alternates), `args.rounds` rounds, after a warm-up that loads each server's tagger."""
    for server in servers:
        service_run(server, docs, 1, WARM_UP_SECONDS, 1, "/annotate")
    runs = []
    for number in range(args.rounds):
        order = in_turns(servers, number)
        for clients in (args.clients, 1):
            for server in order:
                runs.append({"round": number, **service_run(server, docs, clients, args.seconds, 1, "/annotate")})
        print(f"round {number} /annotate: " + ", ".join(f"{r['server']} {r['clients']} clients "
                                                        f"{r['mentions_per_second']}" for r in runs[-2 * len(order):])
              + " documents/s", file=sys.stderr)
    return runs


def annotate_summary(servers: list[Server], runs: list[dict], clients: int) -> list[dict]:
    rows = []
    for server in servers:
        for c in (clients, 1):
            mine = [r for r in runs if r["server"] == server.label and r["clients"] == c]
            rows.append({"server": server.label, "clients": c,
                         "documents_per_second": statistics.median(r["mentions_per_second"] for r in mine),
                         **over_rounds(mine)})
    return rows


def over_rounds(runs: list[dict]) -> dict:
    """What every summary row states of its runs (one per round): the median p50 and p99, the failed requests,
    and the load averages they ran at."""
    return {"p50_ms": statistics.median(r["latency_ms"]["p50"] for r in runs),
            "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs),
            "failed_requests": sum(r["failed_requests"] for r in runs),
            "load": [min(r["load"] for r in runs), max(r["load"] for r in runs)]}


def summarise(servers: list[Server], rounds: dict, sizes: list[int]) -> list[dict]:
    """Per server and size: medians over rounds, and the median of each round's service / library ratio."""
    rows = []
    for server in servers:
        for size in sizes:
            runs = [r for r in server.runs if r["mentions_per_request"] == size]
            library = {r["round"]: r["mentions_per_second"] for r in rounds["library_batched"] if r["size"] == size}
            ratios = [r["mentions_per_second"] / library[r["round"]] for r in runs]
            rows.append({
                "server": server.label, "mentions_per_request": size,
                "mentions_per_second": statistics.median(r["mentions_per_second"] for r in runs),
                **over_rounds(runs),
                "library_mentions_per_second": statistics.median(library.values()),
                "of_library": round(statistics.median(ratios), 3),
            })
        seq = [r for r in rounds["sequential"] if r["server"] == server.label]
        rows.append({"server": server.label, "mentions_per_request": 1, "clients": 1, **over_rounds(seq),
                     "library_p50_ms": statistics.median(r["p50_ms"] for r in rounds["library_one_mention"])})
    return rows


def service_phase(index: Path, texts: list[str], args: argparse.Namespace) -> dict:
    """The servers (this checkout's, and the baseline's) and the library, measured in turns."""
    compared = args.baseline is not None or args.baseline_index is not None
    servers = [start_server(index, "after" if compared else "service")]
    try:
        if compared:
            servers.insert(0, start_server(args.baseline_index or index, "before", args.baseline or ROOT))
        for server in servers:
            service_run(server, texts, args.clients, WARM_UP_SECONDS, max(args.sizes))
        library = Library(index, texts)
        library.batched(min(args.library_batch, 50))  # its first call loads lazy parts too
        rounds = run_rounds(servers, library, texts, args)
        if args.annotate:
            rounds["annotate"] = annotate_rounds(servers, annotate_texts(args.annotate), args)
    finally:
        for server in servers:
            stop_server(server)
    return {
        "clients": args.clients, "k": 5, "rounds": args.rounds, "seconds_per_run": args.seconds,
        "library_batch": args.library_batch,
        "servers": {s.label: {"tree": "this checkout" if s.tree == ROOT else f"--baseline {s.tree.name}",
                              "index": rel_index(args.baseline_index if s.label == "before" and args.baseline_index
                                                 else index),
                              "startup_seconds": s.startup_seconds, "server_rss_mib": s.sampler.summary(),
                              "runs": s.runs} for s in servers},
        **rounds,
        "summary": summarise(servers, rounds, args.sizes),
        **({"annotate_summary": annotate_summary(servers, rounds["annotate"], args.clients)} if args.annotate else {}),
    }


# ----------------------------------------------------------------------------- batch (`linker normalize`)


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
    return {
        "spans": len(spans),
        "output_lines": len(records),
        "linked": sum(1 for r in records if r["candidates"]),
        "seconds_total": round(wall, 1),
        "spans_per_second_incl_index_load": round(len(spans) / wall, 1),
        "peak_rss_mib": sampler.summary()["max"] if sampler.samples else None,
        "perturbed_name_top1_own_concept": round(top1 / len(records), 4),
    }


# ----------------------------------------------------------------------------- report


def service_lines(s: dict) -> list[str]:
    rows = [r for r in s["summary"] if "clients" not in r]
    seq = [r for r in s["summary"] if "clients" in r]
    load = lambda r: f"{r['load'][0]}-{r['load'][1]}"  # noqa: E731
    lines = [
        f"## HTTP service (`linker serve`, {s['clients']} concurrent clients on loopback, k={s['k']})",
        "",
        f"Medians of {s['rounds']} rounds of {s['seconds_per_run']} s per server and size. The library's rate: a "
        f"`Linker.link` call of {s['library_batch']} mentions in the bench's process, the better of its default "
        "threads and one BLAS thread, just before and just after the servers' runs of the round (their mean); "
        "*of library* is the median of each round's ratio.",
        "",
        "| server | mentions/request | mentions/s | p50 ms | p99 ms | failed | library mentions/s | of library "
        "| load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *[f"| {r['server']} | {r['mentions_per_request']} | {r['mentions_per_second']} | {r['p50_ms']} | "
          f"{r['p99_ms']} | {r['failed_requests']} | {r['library_mentions_per_second']} | {r['of_library']:.0%} | "
          f"{load(r)} |"
          for r in rows],
        "",
        "One client, one mention a request, one after another (the library: one-mention `Linker.link` calls, the "
        "better of its two thread settings):",
        "",
        "| server | p50 ms | p99 ms | failed | library p50 ms | load |",
        "|---|---:|---:|---:|---:|---|",
        *[f"| {r['server']} | {r['p50_ms']} | {r['p99_ms']} | {r['failed_requests']} | {r['library_p50_ms']} | "
          f"{load(r)} |" for r in seq],
        "",
        *annotate_lines(s),
        "Server RSS (MiB), sampled every second over all runs: idle after start-up, then at 1/4, 1/2 and the end:",
        "",
        "| server | start | 1/4 | 1/2 | end | max | start-up s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {label} ({v['tree']}, {v.get('index', 'the index above')}) | " + " | ".join(str(v["server_rss_mib"][key]) for key in
                                                   ("start", "quarter", "middle", "end", "max"))
          + f" | {v['startup_seconds']} |" for label, v in s["servers"].items()],
        "",
    ]
    return lines


def annotate_lines(s: dict) -> list[str]:
    if "annotate_summary" not in s:
        return []
    return [
        f"/annotate, one PHEE development sentence a request (tagged, its adverse events linked and decided), "
        f"{s['clients']} closed-loop clients and then one; medians of {s['rounds']} rounds of {s['seconds_per_run']} s:",
        "",
        "| server | clients | documents/s | p50 ms | p99 ms | failed | load |",
        "|---|---:|---:|---:|---:|---:|---|",
        *[f"| {r['server']} | {r['clients']} | {r['documents_per_second']} | {r['p50_ms']} | {r['p99_ms']} | "
          f"{r['failed_requests']} | {r['load'][0]}-{r['load'][1]} |" for r in s["annotate_summary"]],
        "",
    ]


def write_report(report: Report, result: dict, baseline: Path | None = None) -> None:
    note = [result["note"], ""] if result["note"] else []
    lines = [f"Index `{result['index']}` ({result['index_version']}).", "", *note, *service_lines(result["service"])]
    b = result["batch"]
    if b is not None:
        lines += [
            f"## Batch (`linker normalize --format jsonl --k 1`, {b['spans']:,} perturbed dictionary names)",
            "",
            "| spans | linked | seconds (incl. index load) | spans/s | peak RSS MiB "
            "| perturbed name -> own concept at rank 1 |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {b['spans']:,} | {b['linked']:,} | {b['seconds_total']} | {b['spans_per_second_incl_index_load']} | "
            f"{b['peak_rss_mib']} | {b['perturbed_name_top1_own_concept']:.1%} |",
        ]
    # a --baseline tree is a scratch folder of this machine: written as <scratch>, never as its absolute path
    report.write(result, lines, scratch=baseline.resolve() if baseline is not None else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=ROOT / "indexes" / "default")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per server, size and round")
    parser.add_argument("--sizes", default="1,10", help="mentions per request, one run each (comma-separated)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of library and servers in turns")
    parser.add_argument("--baseline", type=Path, help="a source tree whose `linker serve` is measured as 'before'")
    parser.add_argument("--baseline-index", type=Path, help="an index served as 'before' (by this checkout, or "
                        "the --baseline tree)")
    parser.add_argument("--library-batch", type=int, default=500, help="mentions in the library's batched call")
    parser.add_argument("--note", default="", help="a line for the report: what the trees are, e.g. their commits")
    parser.add_argument("--spans", type=int, default=10_000, help="batch spans; 0 skips the batch phase")
    parser.add_argument("--annotate", type=int, default=0,
                        help="PHEE development sentences sent to /annotate, one a request; 0 (default) skips it")
    parser.add_argument("--out", type=Path, default=Path("eval/service/service_load"), help="the report's path stem")
    args = parser.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",")]
    if not (args.index / "manifest.json").is_file():
        raise SystemExit(f"{args.index}: no index folder; build it first with `make indexes/default`")
    if args.baseline is not None and not (args.baseline / "linker" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: expected a source tree with linker/__init__.py")
    report = Report(args.out.name, out=args.out.parent, title="Service and batch load test")
    manifest = json.loads((args.index / "manifest.json").read_text())
    spans = make_spans(args.index, args.spans or 1000)  # the service phase needs texts too
    result = {
        "index": args.index.name,
        "index_version": f"{manifest['kind']} built {manifest['built_at']}, {manifest['counts']['names']:,} names",
        "note": args.note,
        "service": service_phase(args.index, [s["text"] for s in spans], args),
    }
    result["batch"] = batch_phase(args.index, spans) if args.spans else None
    write_report(report, result, args.baseline)


if __name__ == "__main__":
    main()
