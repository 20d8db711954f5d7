"""Hostile requests against a real `linker serve`, before and after the issue-10 fixes; writes
eval/reliability/reliability_service.{md,json}.

    python -m bench.reliability_service --index indexes/default --before ../old826 [--clients 4]

`--before` is a checkout of the code to compare with (commit 826a20f: `git worktree add ../old826 826a20f`);
this checkout is "after". For each hostile case and each version a fresh server starts on 127.0.0.1 (a free
port; loopback only), `--clients` well-behaved clients POST one-mention requests (perturbed dictionary
names, as bench.service_load) while the attack runs, a poller times GET /health every 0.1 s, and the
server's RSS is sampled every 0.1 s. Reported per case and version: the answers to the hostile requests
(status and body shape), the server's RSS before and at its peak, the well-behaved clients' p50/p99 and
any of their requests that failed, and the slowest /health. Every loop is bounded (a case stops after
`--case-timeout` seconds). Timings depend on the machine's load: the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.report import REPO as ROOT
from bench.report import Report
from bench.service_load import RssSampler, make_spans, mib, percentile, start_server, stop_server

JSON_HEADERS = {"content-type": "application/json"}


# ----------------------------------------------------------------------------- the hostile cases


def _post(base: str, body: bytes | str | Iterator[bytes], headers=JSON_HEADERS, timeout: float = 600) -> dict:
    """One request; its answer as {status, shape, error} (status None: the connection failed)."""
    try:
        response = httpx.post(f"{base}/link", content=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return {"status": None, "shape": type(exc).__name__, "error": str(exc)[:120]}
    return describe(response)


def describe(response: httpx.Response) -> dict:
    try:
        body = json.loads(response.content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"status": response.status_code, "shape": "not JSON", "error": response.text[:120]}
    if isinstance(body, dict) and "error" in body:
        return {"status": response.status_code, "shape": "{error, field}", "error": str(body["error"])[:120],
                "field": body.get("field")}
    if isinstance(body, dict) and "detail" in body:
        return {"status": response.status_code, "shape": "{detail}", "error": str(body["detail"])[:120]}
    return {"status": response.status_code, "shape": "result" if response.status_code == 200 else "other"}


def chunked(total_bytes: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A JSON body of `total_bytes` of one-word mentions, sent with chunked transfer encoding (no Content-Length)."""
    mention = b'{"text": "nausea"}, '
    block = mention * (chunk // len(mention))
    yield b'{"mentions": ['
    for _ in range(total_bytes // len(block)):
        yield block
    yield b'{"text": "nausea"}]}'


def nfkc_maximal() -> bytes:
    """1,000 mentions of 500 x U+FDFA: within the old limits as sent, 9,000 characters each after NFKC."""
    return json.dumps({"mentions": [{"text": "\ufdfa" * 500, "id": i} for i in range(1000)]}).encode()


def valid_maximal(texts: list[str]) -> bytes:
    """1,000 distinct mentions of ~100 characters: valid under the old limits and the new ones."""
    mentions, i = [], 0
    for n in range(1000):
        text = ""
        while len(text) < 95:
            text += texts[i % len(texts)][:30] + " "
            i += 1
        mentions.append({"text": text[:100].strip(), "id": n})
    return json.dumps({"mentions": mentions}).encode()


def cases(texts: list[str], chunked_mib: int) -> dict[str, tuple[str, Callable[[str], list[dict]]]]:
    """name -> (what is sent, attack(base) -> the answers to the hostile requests)."""
    nfkc, valid = nfkc_maximal(), valid_maximal(texts)

    def concurrently(n: int, body: bytes) -> Callable[[str], list[dict]]:
        def attack(base: str) -> list[dict]:
            with ThreadPoolExecutor(n) as pool:
                return list(pool.map(lambda _: _post(base, body), range(n)))
        return attack

    return {
        "none": ("no attack: 5 s of the well-behaved clients alone (baseline)", lambda base: time.sleep(5) or []),
        "surrogate_text": ('`{"mentions": [{"text": "nausea \\ud800"}]}`',
                           lambda base: [_post(base, '{"mentions": [{"text": "nausea \\ud800"}]}')]),
        "surrogate_id": ('`{"mentions": [{"text": "nausea", "id": "\\udfff"}]}`',
                         lambda base: [_post(base, '{"mentions": [{"text": "nausea", "id": "\\udfff"}]}')]),
        "chunked_body": (f"one {chunked_mib} MiB JSON body of one-word mentions, chunked (no Content-Length)",
                         lambda base: [_post(base, chunked(chunked_mib << 20))]),
        "nfkc_maximal": (f"4 concurrent requests of 1,000 mentions x 500 U+FDFA ({len(nfkc) / 2**20:.1f} MiB each; "
                         "18x longer after NFKC)", concurrently(4, nfkc)),
        "valid_maximal": (f"4 concurrent requests of 1,000 distinct mentions of ~100 characters "
                          f"({len(valid) / 2**20:.2f} MiB each), valid before and after", concurrently(4, valid)),
        "nesting": ("a mention id nested 200,000 lists deep (400 kB)",
                    lambda base: [_post(base, '{"mentions": [{"text": "a", "id": ' + "[" * 200_000 + "]" * 200_000
                                        + "}]}")]),
        "huge_number": ('`"k": ` followed by 5,000 digits', lambda base: [
            _post(base, '{"mentions": [{"text": "a"}], "k": ' + "9" * 5000 + "}")]),
        "wrong_content_type": ("a JSON body sent as text/plain", lambda base: [
            _post(base, '{"mentions": [{"text": "nausea"}]}', headers={"content-type": "text/plain"})]),
        "unknown_path_and_method": ("GET /nope and GET /link", lambda base: [
            describe(httpx.get(f"{base}/nope", timeout=30)), describe(httpx.get(f"{base}/link", timeout=30))]),
    }


# ----------------------------------------------------------------------------- one case against one version


class WellBehaved:
    """`clients` threads POSTing one-mention requests, and a /health poller, until stopped (or `limit` s)."""

    def __init__(self, base: str, texts: list[str], clients: int, limit: float) -> None:
        self.base, self.texts, self.clients = base, texts, clients
        self.deadline = time.monotonic() + limit
        self.stopped = threading.Event()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.health: list[float] = []
        self.threads = [threading.Thread(target=self._client, args=(w,), daemon=True) for w in range(clients)]
        self.threads.append(threading.Thread(target=self._health, daemon=True))

    def __enter__(self) -> WellBehaved:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=120)

    def _running(self) -> bool:
        return not self.stopped.is_set() and time.monotonic() < self.deadline

    def _client(self, worker: int) -> None:
        i = worker
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while self._running():
                started = time.perf_counter()
                try:
                    response = http.post("/link", json={"mentions": [{"text": self.texts[i % len(self.texts)]}]})
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code}: {response.text[:80]}")
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                self.latencies.append(time.perf_counter() - started)
                i += self.clients

    def _health(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while self._running():
                started = time.perf_counter()
                try:
                    if http.get("/health").status_code != 200:
                        self.failures.append("health")
                except httpx.HTTPError:
                    self.failures.append("health")
                self.health.append(time.perf_counter() - started)
                self.stopped.wait(0.1)


def run_case(checkout: Path, index: Path, attack: Callable[[str], list[dict]], texts: list[str], clients: int,
             limit: float, settle: float = 1.0) -> dict:
    proc, base, _ = start_server(index, checkout)
    try:
        httpx.post(f"{base}/link", json={"mentions": [{"text": texts[0]}]}, timeout=60)  # warm caches
        sampler = RssSampler(proc.pid, interval=0.1)
        sampler.start()
        time.sleep(0.3)
        with WellBehaved(base, texts, clients, limit) as load:
            time.sleep(settle)  # the well-behaved clients run before, during and after the attack
            started = time.perf_counter()
            answers = attack(base)
            attack_seconds = time.perf_counter() - started
            time.sleep(settle)
        sampler.stopped.set()
        sampler.join()
        alive = proc.poll() is None and httpx.get(f"{base}/health", timeout=30).status_code == 200
    finally:
        log = stop_server(proc)
    rss = [r for _, r in sampler.samples]
    lat = load.latencies or [float("nan")]
    return {
        "answers": answers,
        "attack_seconds": round(attack_seconds, 2),
        "server_alive_after": alive,
        "tracebacks_in_log": log.count("Traceback"),
        "rss_mib": {"start": mib(rss[0]), "peak": mib(max(rss))},
        "well_behaved": {"requests": len(load.latencies), "failed": len(load.failures),
                         "failures": sorted(set(load.failures))[:5],
                         "p50_ms": round(1000 * percentile(lat, 0.5), 1), "p99_ms": round(1000 * percentile(lat, 0.99), 1),
                         "max_ms": round(1000 * max(lat), 1)},
        "health_max_ms": round(1000 * max(load.health), 1) if load.health else None,
    }


# ----------------------------------------------------------------------------- report


def _answers(answers: list[dict]) -> str:
    if not answers:
        return "–"
    groups: dict[str, int] = {}
    for a in answers:
        status = a["status"] if a["status"] is not None else "no answer"
        key = f"{status} {a['shape']}"
        if a.get("field"):
            key += f" field `{a['field']}`"
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{n}x {key}" if n > 1 else key for key, n in groups.items())


def write_report(report: Report, result: dict) -> None:
    lines = [
        f"Index `{result['index']}` ({result['index_version']}). Before = commit {result['before_commit']}, after = "
        "this checkout (the header's commit). Timings are indicative.",
        "",
        f"Each case starts a fresh server on 127.0.0.1; {result['clients']} well-behaved clients send one-mention "
        "requests before, during and after the attack, and a poller times GET /health every 0.1 s. "
        "RSS is the server's resident memory sampled every 0.1 s (start = idle after one warm-up request).",
        "",
        "| case | version | answer to the hostile request(s) | attack s | RSS start → peak MiB | well-behaved "
        "requests (failed) | well-behaved p50 / p99 ms | slowest /health ms | tracebacks logged |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, case in result["cases"].items():
        lines.append(f"| **{name}**: {case['what']} | | | | | | | | |")
        for version in ("before", "after"):
            r = case[version]
            wb = r["well_behaved"]
            lines.append(
                f"| | {version} | {_answers(r['answers'])} | {r['attack_seconds']} | {r['rss_mib']['start']} → "
                f"{r['rss_mib']['peak']} | {wb['requests']} ({wb['failed']}) | {wb['p50_ms']} / {wb['p99_ms']} | "
                f"{r['health_max_ms']} | {r['tracebacks_in_log']} |")
    lines += ["", "Hostile answers in full (first 120 characters of each error):", ""]
    for name, case in result["cases"].items():
        for version in ("before", "after"):
            for a in case[version]["answers"]:
                lines.append(f"- {name}, {version}: {a['status']} {a['shape']}: {a.get('error', '')!r}")
    report.write(result, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before the fixes")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--chunked-mib", type=int, default=50)
    parser.add_argument("--case-timeout", type=float, default=600.0, help="well-behaved clients stop after this")
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--out", type=Path, default=Path("eval/reliability"))
    args = parser.parse_args()
    index = args.index if args.index.is_absolute() else (Path.cwd() / args.index)
    if not (index / "manifest.json").is_file():
        raise SystemExit(f"{args.index}: no index folder; build it first with `make indexes/default`")
    manifest = json.loads((index / "manifest.json").read_text())
    texts = [s["text"] for s in make_spans(index, 1000)]
    chosen = cases(texts, args.chunked_mib)
    if args.only:
        chosen = {name: chosen[name] for name in args.only.split(",")}
    report = Report("reliability_service", out=args.out,
                    title="Service reliability under hostile requests, before and after issue 10")
    before = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"index": index.name, "index_version": f"{manifest['kind']}, {manifest['counts']['names']:,} names",
              "before_commit": before, "clients": args.clients, "cases": {}}
    for name, (what, attack) in chosen.items():
        result["cases"][name] = {"what": what}
        for version, checkout in (("before", args.before.resolve()), ("after", ROOT)):
            print(f"{name} / {version} ...", file=sys.stderr, flush=True)
            result["cases"][name][version] = run_case(checkout, index, attack, texts, args.clients, args.case_timeout)
    write_report(report, result)


if __name__ == "__main__":
    main()
