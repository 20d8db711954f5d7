"""Issue 34's hostile probe as a before/after report: writes eval/reliability_probe/{report.md,report.json}.

    mkdir -p /tmp/linker-before && git archive ca8b555 | tar -x -C /tmp/linker-before
    python scripts/reliability_probe.py --before /tmp/linker-before [--side before|after|both] [--cases 1a,4b,...]
    python scripts/reliability_probe.py --render-only       # the report again from the cached sides

Every case of issue 34 is a function that makes a fresh folder under /tmp with a tiny real index
(built by the side's own `dict build` + `index build`) and its hostile inputs, runs one `linker`
command in it (cwd = that folder, relative paths, as a user would), and records: the exit code,
the first line of output, whether a traceback appeared, the sha256 of every input (index files
included) before and after, every file written or removed outside the command's output, the peak
RSS of the process tree (sampled every 50 ms: the tree's sum, and the largest VmHWM of one of its
processes), the wall time and, for the service cases, the slowest GET /health while the attack runs
(scripts/reliability_service.py's server, clients and poller). Item 13 builds an HPO + Spanish
index from ../shared/data/hpo, as the issue's reproduction does. A
watchdog kills the process tree when one process passes --rss-cap-gb (default 3 GB) or the run
passes its time limit, so that "before" cases that eat memory or never end cannot take the shared
machine with them; such a run is recorded as killed. Ray cases run a local Ray with one CPU.

"before" runs `python -m linker` with PYTHONPATH = --before (a checkout of ca8b555, the commit the
probe broke), "after" with this repository. Each side's results are cached in
eval/reliability_probe/side_<name>.json, so the sides can be run at different times (and single
cases re-run with --cases); the report is regenerated from both caches after every run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil


def _sibling(name: str):
    """A module of scripts/ (not a package) by its file path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


rel = _sibling("reliability")  # the hostile-CLI harness of issue 10: tiny index, digests, error classes
svc = _sibling("reliability_service")  # real uvicorn server, well-behaved clients, /health poller
load_test = sys.modules["load_test"]  # imported by reliability_service: RssSampler, make_spans, mib

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "eval" / "reliability_probe"
MIB = 1 << 20
# Not counted as output: log lines (linker's and Ray's), Ray's core-worker lines ("[date E pid pid] file.cc:"),
# and Python warnings with their source line (Ray 2.60 warns about its own deprecated arguments).
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]?\d*\s+(DEBUG|INFO|WARNING)\b|\((raylet|\w+ pid=\d+)\)"
                      r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] )")
WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RAY_RESTART = re.compile(r"actor was restarted|low on memory|OutOfMemoryError|killed due to memory", re.I)
RAY_REPEATED = re.compile(r"\[repeated (\d+)x across cluster\]")


def ray_restarts(text: str) -> int:
    """How often Ray said a worker was killed for memory or restarted (its deduplicated lines counted in full)."""
    return sum(int(m.group(1)) if (m := RAY_REPEATED.search(line)) else 1
               for line in text.splitlines() if RAY_RESTART.search(line))


def without_noise(text: str) -> list[str]:
    """The lines of stderr a user reads as linker's answer (see LOG_LINE)."""
    out, skip_source = [], False
    for line in ANSI.sub("", text.replace("\r", "")).splitlines():
        if skip_source and line.startswith((" ", "\t")):
            skip_source = False
            continue
        skip_source = bool(WARNING_LINE.match(line))
        if line.strip() and not skip_source and not LOG_LINE.match(line):
            out.append(line)
    return out


HEALTH_BOUND_MS = 1000  # a service case holds when /health never took longer (issue 34: 35.7 s before)
RSS_GROWTH_BOUND_MIB = 256  # ... and the server grew by less than this (issue 34: up to 1.9 GB before)


# ----------------------------------------------------------------------------- one side


@dataclass
class Side:
    """A version of the code (`pythonpath` holds its `linker` package) and its tiny shared fixtures."""

    name: str
    pythonpath: Path
    work: Path
    scratch: Path
    rss_cap: int
    _models: dict = field(default_factory=dict)

    @property
    def idx(self) -> Path:
        return self.work / "idx"

    def env(self, extra: dict | None = None) -> dict:
        home = self.scratch / "home"
        home.mkdir(exist_ok=True)
        return {**os.environ, "PYTHONPATH": str(self.pythonpath), "HOME": str(home), "MPLCONFIGDIR": str(home / "mpl"),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "RAY_memory_monitor_refresh_ms": "0",  # as the project's Ray tests: other people's memory kills no worker
                **(extra or {})}

    def cli(self, cwd: Path, *args, **options) -> Run:
        return execute([sys.executable, "-m", "linker", *map(_arg, args)], cwd, self.env(options.pop("env", None)),
                       rss_cap=self.rss_cap, **options)

    def python(self, cwd: Path, code: str, *args, timeout: float = 120) -> Run:
        return execute([sys.executable, "-c", code, *map(str, args)], cwd, self.env(), rss_cap=self.rss_cap, timeout=timeout)

    def must(self, cwd: Path, *args, **options) -> Run:
        run = self.cli(cwd, *args, **options)
        if run.exit != 0:
            raise RuntimeError(f"{self.name}: set-up command `linker {' '.join(map(str, args))}` failed: "
                               f"exit {run.exit} {run.last_line}")
        return run

    def encoder(self) -> Path:
        """A tiny random sentence-transformers folder (tests/conftest.py's make_tiny_encoder of this side)."""
        if "encoder" not in self._models:
            folder = self.work / "encoder"
            code = ("import importlib.util, sys\n"
                    "spec = importlib.util.spec_from_file_location('conftest', sys.argv[1])\n"
                    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
                    "m.make_tiny_encoder(__import__('pathlib').Path(sys.argv[2]))\n")
            run = self.python(self.work, code, self.pythonpath / "tests" / "conftest.py", folder)
            if run.exit != 0:
                raise RuntimeError(f"{self.name}: tiny encoder: {run.last_line}")
            self._models["encoder"] = folder
        return self._models["encoder"]

    def reranker(self) -> Path:
        """A tiny re-ranker folder trained by this side's `linker train rerank` on the tiny dictionary."""
        if "reranker" not in self._models:
            self.must(self.work, "train", "rerank", "--dict", "names.parquet", "--encoder", self.encoder(), "--out",
                      "reranker", "--max-queries", 8, "--negatives", 2, "--batch-size", 4, "--epochs", 1,
                      "--checkpoint-every", 0, "--device", "cpu", "--threads", 1, timeout=300)
            self._models["reranker"] = self.work / "reranker"
        return self._models["reranker"]


def _arg(value) -> str:
    return os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)


def make_side(name: str, pythonpath: Path, rss_cap: int) -> Side:
    # Every folder of a run sits right under /tmp as linker-probe-*, the shape reliability.classify
    # strips from messages (and `portable` from the report).
    work = Path(tempfile.mkdtemp(prefix=f"linker-probe-{name}work-"))
    scratch = Path(tempfile.mkdtemp(prefix=f"linker-probe-{name}scratch-"))
    side = Side(name, pythonpath, work, scratch, rss_cap)
    (work / "names.tsv").write_text(rel.NAMES)
    side.must(work, "dict", "build", "--source", "tsv", "names.tsv", "--out", "names.parquet")
    side.must(work, "index", "build", "--dict", "names.parquet", "--out", "idx")
    return side


# ----------------------------------------------------------------------------- one guarded run


@dataclass
class Run:
    exit: int | None  # negative: killed by that signal
    first_line: str  # first line of stderr that is not a log line (else of stdout)
    last_line: str  # the error line, or a traceback's last line (reliability.classify)
    kind: str  # ok, one line, traceback, other (reliability.classify), killed
    traceback: bool
    seconds: float
    peak_tree_mib: float  # the largest sum of the tree's RSS, sampled every 50 ms (at least peak_process_mib)
    peak_process_mib: float  # the largest VmHWM (high-water RSS) of one process of the tree
    killed: str | None = None  # why the watchdog killed the tree
    stderr_lines: int = 0  # all of them, logs included
    ray_restarts: int = 0  # Ray's reports of a worker killed for memory or an actor restarted (stdout and stderr)
    stderr_tail: str = ""
    stdout_head: str = ""


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _memory(p: psutil.Process) -> tuple[int, int]:
    """(resident now, the most it was resident since its exec) in bytes. VmHWM, not ru_maxrss: Linux carries
    ru_maxrss over fork and exec, so a child would report this script's own size if it was ever larger."""
    rss = hwm = 0
    with open(f"/proc/{p.pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def _kill(processes) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)


def execute(argv: list[str], cwd: Path, env: dict, *, rss_cap: int, timeout: float = 120, tree_cap: int | None = None,
            prefix: tuple = (), during: Callable | None = None) -> Run:
    """Run `argv` in `cwd` under the watchdog: the tree is killed when one process passes `rss_cap`
    bytes, the whole tree `tree_cap` (default 2 x rss_cap), or the run `timeout` seconds.
    `during(elapsed, process)` is called at every 50 ms tick (a case's own action while the command runs)."""
    tree_cap = tree_cap or 2 * rss_cap
    logs = Path(tempfile.mkdtemp(prefix="linker-probe-logs-"))
    out_path, err_path = logs / "stdout", logs / "stderr"
    seen: dict[int, psutil.Process] = {}
    peak_tree = peak_proc = 0
    killed = None
    started = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen([*prefix, *argv], cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        root = psutil.Process(proc.pid)
        while True:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed = time.perf_counter() - started
            total = 0
            for p in _tree(root):
                try:
                    rss, hwm = _memory(p)
                except OSError:  # gone between the listing and the read
                    continue
                seen.setdefault(p.pid, p)
                total += rss
                peak_proc = max(peak_proc, hwm)
                if killed is None and rss > rss_cap:
                    killed = f"killed: one process passed {rss_cap / 2**30:.0f} GiB ({rss / 2**30:.1f} GiB)"
            peak_tree = max(peak_tree, total)
            if killed is None and total > tree_cap:
                killed = f"killed: the process tree passed {tree_cap / 2**30:.0f} GiB ({total / 2**30:.1f} GiB)"
            if killed is None and elapsed > timeout:
                killed = f"still running after {timeout:.0f} s, killed"
            if killed is not None:
                _kill(_tree(root))
                _kill(seen.values())
            elif during is not None:
                during(elapsed, root)
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    _kill(p for p in seen.values() if p.is_running())  # what a killed or finished Ray left behind
    peak_tree = max(peak_tree, peak_proc)
    stdout, stderr = out_path.read_bytes(), err_path.read_bytes()
    shutil.rmtree(logs, ignore_errors=True)
    text = os.fsdecode(stderr)
    lines = without_noise(text)
    kind, last = rel.classify(subprocess.CompletedProcess(argv, proc.returncode, stdout, "\n".join(lines).encode()))
    out_lines = without_noise(os.fsdecode(stdout))  # Ray prints its raylet's and workers' lines on stdout
    first = lines[0] if lines else " ".join(" ".join(out_lines[:6]).split())  # stdout: JSON spans several lines
    if killed:
        kind = "killed"
    return Run(proc.returncode, first[:300], last, kind, "Traceback (most recent call last)" in text,
               round(seconds, 2), round(peak_tree / MIB, 1), round(peak_proc / MIB, 1), killed, len(text.splitlines()),
               ray_restarts(ANSI.sub("", text + "\n" + os.fsdecode(stdout))),
               "\n".join(lines[-12:])[-3000:], "\n".join(out_lines[:5])[:1000])


# ----------------------------------------------------------------------------- what a case declares


@dataclass
class Setup:
    """What one variant of a case runs and what it puts at risk."""

    args: list  # `linker` arguments (relative to the case folder)
    inputs: list  # files and folders that must be byte-for-byte intact afterwards
    outputs: list = field(default_factory=list)  # what the command may write (anything else is "outside")
    expect: str = "refuse"  # refuse: exit 1 with one error line; succeed: exit 0; either
    timeout: float = 120
    env: dict = field(default_factory=dict)
    prefix: tuple = ()
    during: Callable | None = None  # during(elapsed, process): called every 50 ms while the command runs
    check: Callable | None = None  # check(folder, run) -> facts; facts["problems"]: what fell
    max_rss_mib: float | None = None  # the largest process must stay below this to hold
    service: Callable | None = None  # a service case: attack(base) -> answers (scripts/reliability_service.py)
    done: Run | None = None  # set-up already gave the answer (e.g. `index build` refused a hostile table)


@dataclass
class Case:
    id: str
    item: str  # issue 34's item
    title: str
    how: str
    variants: dict[str, Callable[[Path, Side], Setup]]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def index_copy(side: Side, d: Path, name: str = "V") -> Path:
    shutil.copytree(side.idx, d / name)
    return d / name


def loads_after(side: Side, index: str, *extra) -> Callable:
    """A check: does the index (and a model named by `extra`) still load after the command?"""
    def check(d: Path, run: Run) -> dict:
        again = side.cli(d, "link", "--index", index, *extra, "hair loss", timeout=120)
        ok, what = again.exit == 0, " with ".join([index, *map(str, extra[1:2])])
        return {"loads_after": ok, "problems": [] if ok else [f"{what} no longer loads ({again.last_line[:80]})"]}
    return check


# ----------------------------------------------------------------------------- item 1: the index is an input


def c1a(d: Path, side: Side) -> Setup:
    index_copy(side, d)
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "hair loss", "headache")
    rel.jsonl(d / "shards" / "b.jsonl", "nausea")
    return Setup(["normalize", "--engine", "ray", "--workers", 1, "--index", "V", "--input", "shards", "--output", "V",
                  "--overwrite"], [d / "V", d / "shards"], [d / "V"], timeout=240, check=loads_after(side, "V"))


def c1b(d: Path, side: Side) -> Setup:
    index_copy(side, d)
    rel.jsonl(d / "a.jsonl", "hair loss")
    return Setup(["normalize", "--index", "V", "--input", "a.jsonl", "--format", "jsonl", "--output", "V/manifest.json",
                  "--overwrite"], [d / "V", d / "a.jsonl"], [d / "V" / "manifest.json"], check=loads_after(side, "V"))


def c1c(d: Path, side: Side) -> Setup:
    index_copy(side, d)
    rel.jsonl(d / "a.jsonl", "hair loss")
    return Setup(["link", "--index", "V", "--input", "a.jsonl", "--output", "V/concepts.parquet", "--overwrite"],
                 [d / "V", d / "a.jsonl"], [d / "V" / "concepts.parquet"], check=loads_after(side, "V"))


def c1d_rerank(d: Path, side: Side) -> Setup:
    index_copy(side, d)
    shutil.copytree(side.reranker(), d / "R")
    rel.jsonl(d / "a.jsonl", "hair loss")
    return Setup(["link", "--index", "V", "--rerank", "R", "--input", "a.jsonl", "--output", "R/model.safetensors",
                  "--overwrite"], [d / "V", d / "R", d / "a.jsonl"], [d / "R" / "model.safetensors"], timeout=180,
                 check=loads_after(side, "V", "--rerank", "R"))


def c1d_encoder(d: Path, side: Side) -> Setup:
    shutil.copytree(side.encoder(), d / "E")
    write(d / "E" / ".linker-output", '{"written_by": "linker"}\n')  # as a folder from `linker train sap` carries it
    shutil.copyfile(side.work / "names.parquet", d / "names.parquet")
    return Setup(["index", "build", "--dict", "names.parquet", "--kind", "dense", "--encoder", "E", "--out", "E",
                  "--overwrite"], [d / "E", d / "names.parquet"], [d / "E"], timeout=180)


# ----------------------------------------------------------------------------- item 2: a glob with ..


def _victim_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ["v1", "v2"], "text": ["hair loss", "nausea"],
                             "patient_notes": ["years of follow-up", "do not lose"]}), path)


def c2a(d: Path, side: Side) -> Setup:
    (d / "in" / "x").mkdir(parents=True)
    _victim_parquet(d / "victim" / "data.parquet")
    index_copy(side, d, "idx")

    def check(d: Path, run: Run) -> dict:
        import pyarrow.parquet as pq

        return {"victim_columns_after": pq.read_schema(d / "victim" / "data.parquet").names}
    return Setup(["normalize", "--engine", "ray", "--workers", 1, "--index", "idx", "--input",
                  "in/*/../../victim/*.parquet", "--output", "out"], [d / "victim", d / "idx"], [d / "out"],
                 expect="either", timeout=240, check=check)


def c2b(d: Path, side: Side) -> Setup:
    (d / "in" / "x").mkdir(parents=True)
    rel.jsonl(write(d / "victim" / "secret.jsonl", ""), "hair loss", "nausea")
    index_copy(side, d, "idx")
    return Setup(["normalize", "--engine", "ray", "--workers", 1, "--index", "idx", "--input",
                  "in/*/../../victim/*.jsonl", "--output", "out"], [d / "victim", d / "idx"], [d / "out"],
                 expect="either", timeout=240)


# ----------------------------------------------------------------------------- item 3: index-folder files


def _with_prior(entry) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        index = index_copy(side, d / "indexes")
        write(d / "outside.json", json.dumps({"specs": [], "counts": {"C0012833": 99}, "names": {}}))
        rel.set_manifest(index, lambda m: m.update(prior=entry))
        return Setup(["link", "--index", "indexes/V", "hair loss"], [index, d / "outside.json"])
    return setup


def _prior_file(name: str) -> dict:
    return {"file": name, "specs": ["tsv:train.tsv"], "mentions": 1, "concepts": 1, "names": 0, "name_rows": 0,
            "gold_ids_not_in_dictionary": 0}


def c3b(d: Path, side: Side) -> Setup:
    index = index_copy(side, d)
    (index / "calibration.json").symlink_to("/dev/zero")
    rel.set_manifest(index, lambda m: m.update(calibration={
        "scorer": "retriever", "method": "isotonic", "fitted_on": "tsv:heldin.tsv", "mentions": 40,
        "fitted_at": "2025-01-01T00:00:00+00:00"}))
    return Setup(["link", "--index", "V", "hair loss"], [index])


def c3c(d: Path, side: Side) -> Setup:
    import numpy as np

    index = index_copy(side, d)
    path = index / "tfidf" / "idf.npy"
    idf = np.load(path)
    np.save(path, np.full_like(idf, np.nan))
    size, sha = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    rel.set_manifest(index, lambda m: m["files"]["tfidf/idf.npy"].update(size=size, sha256=sha))
    return Setup(["link", "--index", "V", "hair loss"], [index])


# ----------------------------------------------------------------------------- item 4: the service


def _service(body: bytes) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        index = index_copy(side, d)
        return Setup([], [index], service=lambda base: [svc._post(base, body)], timeout=300)
    return setup


ITEMS = 1_398_000  # issue 34: 1.4M items, within the service's 4 MiB body cap
BODY_NUMBERS = b'{"mentions":[' + b",".join([b"1"] * ITEMS) + b"]}"
BODY_OBJECTS = b'{"mentions":[' + b",".join([b"{}"] * ITEMS) + b"]}"


# ----------------------------------------------------------------------------- item 5: resume


def _ray_args(index: str, source: str, out: str = "out") -> list:
    return ["normalize", "--engine", "ray", "--workers", 1, "--index", index, "--input", source, "--output", out]


def _rows(folder: Path) -> tuple[int, list[str]]:
    import pyarrow.parquet as pq

    files = sorted(folder.rglob("*.parquet"))
    return sum(pq.read_metadata(f).num_rows for f in files), [f.relative_to(folder).as_posix() for f in files]


def c5a(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "hair loss", "headache", "nausea")
    rel.jsonl(d / "shards" / "b.jsonl", "dizziness", "alopecia")
    side.must(d, *_ray_args("idx", "shards"), timeout=240)
    (d / "shards" / "a.jsonl").rename(d / "shards" / "c.jsonl")

    def check(d: Path, run: Run) -> dict:
        rows, files = _rows(d / "out")
        reported = "a.parquet" in run.stderr_tail or "a.jsonl" in run.stderr_tail
        facts = {"rows_in_output": rows, "spans_in_input": 5, "output_files": files, "stale_output_reported": reported,
                 "success_marker": (d / "out" / "_SUCCESS").exists()}
        if run.exit == 0 and rows != 5 and not reported:
            facts["problems"] = [f"exit 0 with {rows} rows for 5 spans, a.parquet (input gone) not reported"]
        return facts
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], expect="either", timeout=240,
                 check=check)


def c5b(d: Path, side: Side) -> Setup:
    import pyarrow.parquet as pq

    index_copy(side, d, "idx")
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "nausea", "dizziness")
    rel.jsonl(d / "shards" / "b.jsonl", "hair loss")
    side.must(d, *_ray_args("idx", "shards"), timeout=240)
    size = (d / "shards" / "a.jsonl").stat().st_size
    rel.jsonl(d / "shards" / "a.jsonl", "vomits", "headaches")  # same byte size, other texts
    assert (d / "shards" / "a.jsonl").stat().st_size == size

    def check(d: Path, run: Run) -> dict:
        path = d / "out" / "a.parquet"
        texts = sorted(pq.read_table(path).column("text").to_pylist()) if path.is_file() else []
        facts = {"output_texts_of_a": texts, "input_texts_of_a": ["headaches", "vomits"]}
        if run.exit == 0 and texts != ["headaches", "vomits"]:
            facts["problems"] = [f"exit 0, a.parquet still holds the old texts {texts}"]
        return facts
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], expect="either", timeout=240,
                 check=check)


# ----------------------------------------------------------------------------- item 6: small inputs, big memory


def c6a(d: Path, side: Side) -> Setup:
    import pyarrow as pa
    import pyarrow.parquet as pq

    index_copy(side, d, "idx")
    (d / "shards").mkdir()
    text = ("headache " * (40_000_000 // 9 + 1))[:40_000_000]
    pq.write_table(pa.table({"id": ["s1"], "text": [text]}), d / "shards" / "big.parquet", compression="zstd",
                   compression_level=22, use_dictionary=False)
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], timeout=240, max_rss_mib=1024)


def c6b(d: Path, side: Side) -> Setup:
    import zipfile

    index_copy(side, d, "idx")
    text = ("headache " * (30_000_000 // 9 + 1))[:30_000_000].rstrip()
    ann = f"T1\tDisease 0 {len(text)}\t{text}\n#1\tAnnotatorNotes T1\tC0018681\n"
    with zipfile.ZipFile(d / "corpus.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("corpus/doc1.txt", text)
        archive.writestr("corpus/doc1.ann", ann)
    return Setup(["eval", "--index", "idx", "--dataset", "brat:corpus.zip"], [d / "corpus.zip", d / "idx"],
                 max_rss_mib=1024)


def c6c(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    text = ("headache " * (3_000_000 // 9 + 1))[:3_000_000].rstrip()
    write(d / "doc.ann", f"T1\tDisease 0 {len(text)}\t{text}\n")
    return Setup(["normalize", "--index", "idx", "--format", "brat", "--input", "doc.ann", "--output", "out.ann"],
                 [d / "doc.ann", d / "idx"], [d / "out.ann"])


def c6d(d: Path, side: Side) -> Setup:
    chunk = b"a" * MIB
    with gzip.open(d / "names.tsv.gz", "wb", compresslevel=9) as handle:
        handle.write(b"concept_id\tname\nC1\t")
        for _ in range(1024):
            handle.write(chunk)
        handle.write(b"\n")
    return Setup(["dict", "build", "--source", "tsv", "names.tsv.gz", "--out", "t.parquet"], [d / "names.tsv.gz"],
                 [d / "t.parquet"], max_rss_mib=1024)


# ----------------------------------------------------------------------------- item 7: retried forever


def c7_threshold(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "hair loss", "nausea")
    # Ray's memory monitor kills a worker once the node is above the threshold: 1% is below what any
    # machine uses, so every attempt is killed "for memory" (issue 34's reproduction).
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], timeout=120,
                 env={"RAY_memory_usage_threshold": "0.01", "RAY_memory_monitor_refresh_ms": "100"})


def c7_oom_kill(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "hair loss", "nausea")
    killed: list[int] = []

    def during(elapsed: float, process: psutil.Process) -> None:
        # What the kernel's OOM killer does to a worker that takes too much: SIGKILL, every time it
        # comes back. Only this command's own Ray workers are touched.
        for p in _tree(process)[1:]:
            with contextlib.suppress(psutil.Error):
                if p.pid not in killed and "ShardWorker" in " ".join(p.cmdline()):
                    p.kill()
                    killed.append(p.pid)

    def check(d: Path, run: Run) -> dict:
        return {"shard_workers_killed": len(killed)}
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], timeout=120, during=during,
                 check=check)


# ----------------------------------------------------------------------------- item 8: output injection


def _hostile_table(side: Side, d: Path, change: Callable) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(side.work / "names.parquet")
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    change(columns)
    pq.write_table(pa.table(columns, schema=table.schema), d / "hostile.parquet")
    return d / "hostile.parquet"


READ_BRAT = ("import sys\nfrom linker.formats.brat import read_brat\n"
             "doc = read_brat(sys.argv[1])\nprint(len(doc.lines))\n")


def _brat_variant(change: Callable | None, db: str | None = None) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        rel.brat_folder(d / "docs")
        table = _hostile_table(side, d, change) if change else shutil.copyfile(side.work / "names.parquet",
                                                                                d / "names.parquet")
        built = side.cli(d, "index", "build", "--dict", Path(table).name, "--out", "idx")

        def check(d: Path, run: Run) -> dict:
            out = d / "out" / "doc1.ann"
            if run.exit != 0 or not out.is_file():
                return {}
            raw = out.read_bytes()
            lines = raw.decode("utf-8", "replace").split("\n")
            controls = sorted({f"\\x{b:02x}" for b in raw if b < 32 and b not in (9, 10)})
            expected = 2 + 2 + 1  # the two T lines, two N lines, the final newline
            back = side.python(d, READ_BRAT, out)
            facts = {"output_lines": len(lines), "expected_lines": expected, "reads_back": back.exit == 0,
                     "reader_says": back.last_line[:160], "control_characters_written": controls}
            facts["problems"] = ([f"{len(lines) - 1} lines written for 4"] if len(lines) != expected else []) + \
                ([] if back.exit == 0 else ["linker's brat reader rejects the file it wrote"]) + \
                ([f"raw control characters {' '.join(controls)} written into the .ann"] if controls else [])
            return facts
        args = ["normalize", "--index", "idx", "--format", "brat", "--input", "docs", "--output", "out",
                *(["--db", db] if db is not None else [])]
        return Setup(args, [d / "docs", Path(table)], [d / "out", d / "idx"], expect="either", check=check,
                     done=built if built.exit != 0 else None)
    return setup


def _map(column: str, fn: Callable[[str], str]) -> Callable[[dict], None]:
    return lambda columns: columns.update({column: [fn(v) for v in columns[column]]})


INJECTED = "\rT99\tDisease 0 8\theadache"
CONTROL = ("\x00", "\x01", "\x0b")


def _nul_names(columns: dict) -> None:
    columns["name"] = [n[:2] + "\x00" + n[2:] + "\x01" for n in columns["name"]]


def _control_names(columns: dict) -> None:
    columns["name"] = [n[:2] + CONTROL[i % 3] + n[2:] for i, n in enumerate(columns["name"])]
    columns["source"] = ["meddra"] * len(columns["name"])


READ_XML = "import sys\nfrom linker.formats.ade_xml import read_ade_xml\nread_ade_xml(sys.argv[1])\n"


def c8b(d: Path, side: Side) -> Setup:
    shutil.copyfile(side.pythonpath / "tests" / "fixtures" / "normalize" / "xml" / "TESTDRUG.xml", d / "label.xml")
    table = _hostile_table(side, d, _control_names)
    built = side.cli(d, "index", "build", "--dict", table.name, "--out", "idx")

    def check(d: Path, run: Run) -> dict:
        out = d / "out.xml"
        if run.exit != 0 or not out.is_file():
            return {}
        try:
            ET.parse(out)
            well_formed, why = True, ""
        except ET.ParseError as exc:
            well_formed, why = False, str(exc)
        back = side.python(d, READ_XML, out)
        facts = {"well_formed": well_formed, "parser_says": why, "reads_back": back.exit == 0}
        facts["problems"] = ([] if well_formed else [f"not well-formed XML ({why})"]) + \
            ([] if back.exit == 0 else ["linker's ADE XML reader rejects the file it wrote"])
        return facts
    return Setup(["normalize", "--index", "idx", "--format", "ade-xml", "--input", "label.xml", "--output", "out.xml"],
                 [d / "label.xml", table], [d / "out.xml", d / "idx"], expect="either", check=check,
                 done=built if built.exit != 0 else None)


# ----------------------------------------------------------------------------- item 9: one bad shard


def _shards_with(bad_name: str, bad: bytes) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        index_copy(side, d, "idx")
        for name, text in (("b", "hair loss"), ("c", "nausea"), ("d", "headache")):
            rel.jsonl(write(d / "shards" / f"{name}.jsonl", ""), text)
        write(d / "shards" / bad_name, bad)

        def check(d: Path, run: Run) -> dict:
            _, files = _rows(d / "out") if (d / "out").is_dir() else (0, [])
            named = bad_name in run.last_line
            facts = {"outputs_written": files, "error_names_the_shard": named}
            good = [f for f in files if f in ("b.parquet", "c.parquet", "d.parquet")]
            problems = [] if len(good) == 3 else [f"{3 - len(good)} of the 3 good shards not linked"]
            if run.exit != 0 and not named:
                problems.append(f"the message does not name {bad_name}")
            facts["problems"] = problems
            return facts
        return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx"], [d / "out"], timeout=240, check=check)
    return setup


def _truncated_gz() -> bytes:
    raw = "".join(json.dumps({"id": i, "text": f"hair loss {i}"}) + "\n" for i in range(2000)).encode()
    packed = gzip.compress(raw)
    return packed[: len(packed) // 2]


# ----------------------------------------------------------------------------- item 10: other inputs overwritten


def c10a(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    shutil.copyfile(side.pythonpath / "tests" / "fixtures" / "eval" / "pubtator_slice.txt", d / "corpus.txt")
    write(d / "report.md", "hedache||headache\nnausia||nausea\n")
    # --overwrite: the report's own files may be replaced; the typo list is an input all the same
    return Setup(["eval", "--index", "idx", "--dataset", "pubtator:corpus.txt#typos=report.md", "--report", "report",
                  "--overwrite"],
                 [d / "report.md", d / "corpus.txt", d / "idx"],
                 [d / "report.json", d / "report.png", d / "report.coverage.png"],
                 expect="either", timeout=180)


def c10b(d: Path, side: Side) -> Setup:
    index = index_copy(side, d)
    gold = write(index / "calibration.json", "".join(f"{cid}\t{text}\n" for cid, text in (
        ("C0018681", "headache"), ("C0002170", "hair loss"), ("C0027497", "nausea"), ("C0012833", "dizziness"),
        ("C0002170", "alopecia"), ("C0018681", "head ache"), ("C0027497", "nauseous"), ("C0012833", "dizzy"))))
    return Setup(["calibrate", "--index", "V", "--dataset", "tsv:V/calibration.json"], [gold], [index],
                 expect="either", timeout=180)


# ----------------------------------------------------------------------------- item 11: a race


def c11(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    phrases = ["hair loss", "headache", "nausea", "dizziness", "alopecia"]
    rel.jsonl(d / "a.jsonl", *[f"{phrases[i % 5]} {i % 97}" for i in range(60_000)])
    notes = b"my notes, written while linker ran\n"
    state = {"created_at": None}

    def during(elapsed: float, _process) -> None:
        # The window: after the start-of-run check (the output's temporary exists: linking has begun).
        if state["created_at"] is None and any(p.name.startswith(".out.jsonl") for p in d.iterdir()):
            (d / "out.jsonl").write_bytes(notes)
            state["created_at"] = round(elapsed, 2)

    def check(d: Path, run: Run) -> dict:
        if state["created_at"] is None:
            return {"race_window": "missed (no temporary seen while the command ran)",
                    "problems": ["inconclusive: the window was missed"]}
        kept = (d / "out.jsonl").read_bytes() == notes
        return {"user_file_created_after_s": state["created_at"], "user_file_intact": kept,
                "problems": [] if kept else ["the file created after the check was replaced without --overwrite"]}
    return Setup(["normalize", "--index", "idx", "--format", "jsonl", "--input", "a.jsonl", "--output", "out.jsonl"],
                 [d / "a.jsonl", d / "idx"], [d / "out.jsonl"], expect="either", during=during, check=check)


# ----------------------------------------------------------------------------- item 12: tracebacks


def c12a(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(write(d / "shards" / "a.jsonl", ""), "hair loss")
    write(d / "out" / ".linker-output", '{"written_by": "linker"}\n')
    write(d / "out" / ".linker-job.json", '{"index": {"name": "idx", "manifest_sha2')
    return Setup(_ray_args("idx", "shards"), [d / "shards", d / "idx", d / "out"], [], timeout=180)


def c12b(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(d / "a.jsonl", "hair loss")
    return Setup(["normalize", "--index", "idx", "--format", "jsonl", "--input", "a.jsonl", "--output", "o.jsonl",
                  "--max-line-bytes", "99999999999999999999999"], [d / "a.jsonl", d / "idx"], [d / "o.jsonl"])


def c12c(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    return Setup(["serve", "--index", "idx", "--port", "70000"], [d / "idx"], timeout=90)


def c12d(d: Path, side: Side) -> Setup:
    index_copy(side, d, "idx")
    rel.jsonl(d / "a.jsonl", *[f"hair loss {i}" for i in range(3000)])
    (d / "full").mkdir()
    # A 64 KiB tmpfs mounted on full/ in a private user+mount namespace: the disk is full there only.
    prefix = ("unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
              'mount -t tmpfs -o size=64k tmpfs full && exec "$@"', "sh")

    def check(d: Path, run: Run) -> dict:
        named = "full/o.jsonl" in run.last_line
        return {"error_names_the_file": named, "problems": [] if named or run.exit == 0 else
                ["the disk-full message does not name full/o.jsonl"]}
    return Setup(["normalize", "--index", "idx", "--format", "jsonl", "--input", "a.jsonl", "--output", "full/o.jsonl"],
                 [d / "a.jsonl", d / "idx"], [d / "full"], prefix=prefix, check=check)


# ----------------------------------------------------------------------------- items 13, 14: own commands


def c13(d: Path, side: Side) -> Setup:
    hpo = ROOT.parent / "shared" / "data" / "hpo"
    side.must(d, "dict", "build", "--source", "obo", hpo / "hp.obo.2025-01-16.gz", hpo / "hp-es.babelon.tsv",
              "--lang", "en,es", "--out", "hpo-es.parquet", timeout=600)
    side.must(d, "index", "build", "--dict", "hpo-es.parquet", "--out", "idx", timeout=600)

    def check(d: Path, run: Run) -> dict:
        written = sorted(p.name for p in d.glob("report.*"))
        return {"report_files": written, "problems": [] if {"report.md", "report.json"} <= set(written) else
                ["no report written (report.md and report.json)"]}
    return Setup(["eval", "--index", "idx", "--suite", "capabilities", "--dict-sample", 300, "--seed", 1, "--report",
                  "report"], [d / "idx", d / "hpo-es.parquet"], [d / "report.md", d / "report.json", d / "report.png"],
                 expect="succeed", timeout=600, check=check)


def c14(d: Path, side: Side) -> Setup:
    shutil.copytree(side.pythonpath / "tests" / "fixtures" / "meddra" / "MedDRA_26_1_English", d / "MedDRA_26_1_English")
    return Setup(["dict", "build", "--source", "meddra", "MedDRA_26_1_English", "--out", "MedDRA_26_1_English.parquet"],
                 [d / "MedDRA_26_1_English"], [d / "MedDRA_26_1_English.parquet",
                                               d / "MedDRA_26_1_English.hierarchy.parquet"], expect="succeed")


# ----------------------------------------------------------------------------- the list

CASES: list[Case] = [
    Case("1a", "1", "Ray output onto the index folder", "`normalize --engine ray --index V --input shards --output V "
         "--overwrite`", {"": c1a}),
    Case("1b", "1", "output onto the index's manifest", "`normalize --index V --input a.jsonl --format jsonl --output "
         "V/manifest.json --overwrite`", {"": c1b}),
    Case("1c", "1", "output onto the index's concept table", "`link --index V --input a.jsonl --output "
         "V/concepts.parquet --overwrite`", {"": c1c}),
    Case("1d", "1", "output onto a model folder", "`link --rerank R ... --output R/model.safetensors --overwrite`; "
         "`index build --kind dense --encoder E --out E --overwrite` (E marked as linker's, as `train sap` writes it)",
         {"rerank": c1d_rerank, "encoder": c1d_encoder}),
    Case("2a", "2", "Ray glob with .. (Parquet)", "`normalize --engine ray --input 'in/*/../../victim/*.parquet' "
         "--output out`; victim/data.parquet has a column patient_notes", {"": c2a}),
    Case("2b", "2", "Ray glob with .. (JSONL)", "`--input 'in/*/../../victim/*.jsonl' --output out`", {"": c2b}),
    Case("3a", "3", "manifest prior.file not confined", "`link --index indexes/V`, manifest 'prior' = "
         "{file: /etc/passwd | ../../outside.json | /dev/zero} or a plain string",
         {"/etc/passwd": _with_prior(_prior_file("/etc/passwd")),
          "../../outside.json": _with_prior(_prior_file("../../outside.json")),
          "plain string": _with_prior("concept_prior.json"), "/dev/zero": _with_prior(_prior_file("/dev/zero"))}),
    Case("3b", "3", "calibration.json a symlink to /dev/zero", "`link --index V`, manifest lists a calibration",
         {"": c3b}),
    Case("3c", "3", "NaN idf.npy, checksums updated", "`link --index V`", {"": c3c}),
    Case("4a", "4", "service: 1.4M numbers as mentions", f"`POST /link` `{{\"mentions\":[1,1,…]}}` ({ITEMS:,} items, "
         f"{len(BODY_NUMBERS) / MIB:.1f} MiB)", {"": _service(BODY_NUMBERS)}),
    Case("4b", "4", "service: 1.4M empty objects as mentions", f"`POST /link` `{{\"mentions\":[{{}},{{}},…]}}` "
         f"({ITEMS:,} items, {len(BODY_OBJECTS) / MIB:.1f} MiB)", {"": _service(BODY_OBJECTS)}),
    Case("5a", "5", "Ray resume after a shard is renamed", "run, `mv shards/a.jsonl shards/c.jsonl`, run again",
         {"": c5a}),
    Case("5b", "5", "Ray resume after a shard is edited in place", "run, rewrite shards/a.jsonl with other texts of "
         "the same byte size, run again", {"": c5b}),
    Case("6a", "6", "Parquet shard with one 40M-character text", "`normalize --engine ray` on a zstd Parquet shard",
         {"": c6a}),
    Case("6b", "6", "brat zip with one 30M-character span", "`eval --dataset brat:corpus.zip`", {"": c6b}),
    Case("6c", "6", "brat .ann line of 3 MB", "`normalize --format brat --input doc.ann`", {"": c6c}),
    Case("6d", "6", ".tsv.gz holding one 1 GiB line", "`dict build --source tsv names.tsv.gz`", {"": c6d}),
    Case("7", "7", "Ray worker killed for memory", "`normalize --engine ray`: RAY_memory_usage_threshold=0.01 (Ray's "
         "memory monitor kills workers), or every ShardWorker process SIGKILLed as it appears (as the OOM killer would)",
         {"threshold 0.01": c7_threshold, "SIGKILL": c7_oom_kill}),
    Case("8a", "8", "brat output injection", "`normalize --format brat`: concept id with \\r, source with \\n, "
         "`--db` with \\n, NUL and \\x01 in names",
         {"id \\r": _brat_variant(_map("concept_id", lambda v: v + INJECTED)),
          "source \\n": _brat_variant(_map("source", lambda v: v + INJECTED.replace("\r", "\n"))),
          "--db \\n": _brat_variant(None, db="umls" + INJECTED.replace("\r", "\n")),
          "names NUL/\\x01": _brat_variant(_nul_names)}),
    Case("8b", "8", "ADE XML output injection", "`normalize --format ade-xml`, MedDRA names with \\x00, \\x01, \\x0b",
         {"": c8b}),
    Case("9a", "9", "Ray: a truncated .jsonl.gz shard", "a.jsonl.gz cut in half, and 3 good shards b, c, d",
         {"": _shards_with("a.jsonl.gz", _truncated_gz())}),
    Case("9b", "9", "Ray: a non-gzip file named .gz", "a.jsonl.gz holding plain JSONL, and 3 good shards",
         {"": _shards_with("a.jsonl.gz", b'{"text": "hair loss"}\n')}),
    Case("10a", "10", "eval --report onto the typos= file", "`eval --dataset pubtator:corpus.txt#typos=report.md "
         "--report report --overwrite`", {"": c10a}),
    Case("10b", "10", "calibrate onto its own gold file", "`calibrate --index V --dataset tsv:V/calibration.json`",
         {"": c10b}),
    Case("11", "11", "output created after the start-of-run check", "`normalize ... --output out.jsonl`; out.jsonl "
         "created by someone else once linking has begun", {"": c11}),
    Case("12a", "12", "corrupt .linker-job.json", "`normalize --engine ray --output out`, out/.linker-job.json cut",
         {"": c12a}),
    Case("12b", "12", "--max-line-bytes 99999999999999999999999", "`normalize --format jsonl`", {"": c12b}),
    Case("12c", "12", "serve --port 70000", "`serve --index idx --port 70000`", {"": c12c}),
    Case("12d", "12", "disk full", "`normalize --output full/o.jsonl`, full/ a 64 KiB tmpfs", {"": c12d}),
    Case("13", "13", "capability suite chart", "`eval --suite capabilities --dict-sample 300 --seed 1 --report report` "
         "on an HPO + Spanish tf-idf index (../shared/data/hpo)", {"": c13}),
    Case("14", "14", "dict build --out named after its input folder", "`dict build --source meddra "
         "MedDRA_26_1_English --out MedDRA_26_1_English.parquet`", {"": c14}),
]
PROBE_CASES = [c for c in CASES if c.item not in ("13", "14")]  # the 29 the hostile probe broke (items 1-12)


# ----------------------------------------------------------------------------- running a case


def snapshot(folder: Path) -> dict[str, str]:
    """relative path -> sha256 (regular files) or the link target (symlinks), never following links."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            path = Path(base) / name
            mode = path.lstat().st_mode
            key = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode):
                out[key] = "-> " + os.readlink(path)
            elif stat.S_ISREG(mode):
                h = hashlib.sha256()
                with path.open("rb") as handle:
                    for block in iter(lambda: handle.read(MIB), b""):
                        h.update(block)
                out[key] = h.hexdigest()
    return out


def _inside(relative: str, outputs: list[str]) -> bool:
    """Within an output, or a temporary beside one (`.<name>.linker-tmp-*`, left by a killed run)."""
    parent, _, name = relative.rpartition("/")
    return any(relative == f or relative.startswith(f + "/") or
               (f.rpartition("/")[0] == parent and name.startswith(f".{f.rpartition('/')[2]}.linker-tmp"))
               for f in outputs)


def run_variant(case: Case, label: str, setup_fn: Callable, side: Side) -> dict:
    d = Path(tempfile.mkdtemp(prefix="linker-probe-case-"))
    try:
        setup = setup_fn(d, side)
        inputs = [Path(p) for p in setup.inputs]
        before_inputs = rel.digest(inputs)
        before_all = snapshot(d)
        result: dict = {"variant": label, "args": [str(a) for a in setup.args]}
        if setup.service is not None:
            run, service = run_service(side, setup, d)
            result["service"] = service
        elif setup.done is not None:
            run, result["note"] = setup.done, "refused by the set-up command (`index build` of the hostile table)"
        else:
            run = side.cli(d, *setup.args, env=setup.env, timeout=setup.timeout, prefix=setup.prefix, during=setup.during)
        after_inputs = rel.digest(inputs)
        after_all = snapshot(d)
        # intact: every input file as it was; a new file (inside an input folder or not) is "outside" unless
        # it lies in the command's output
        changed = sorted(Path(k).relative_to(d).as_posix() for k in before_inputs
                         if before_inputs[k] != "absent" and before_inputs[k] != after_inputs.get(k))
        outputs = [Path(p).relative_to(d).as_posix() for p in setup.outputs]
        outside = sorted(k for k in set(before_all) | set(after_all) if before_all.get(k) != after_all.get(k)
                         and not _inside(k, outputs) and k not in changed)
        facts = setup.check(d, run) if setup.check and setup.done is None else {}
        result.update(run=asdict(run), intact=not changed, changed=changed[:20], outside=outside[:20], facts=facts)
        result["problems"] = problems(setup, run, result)
        result["held"] = not result["problems"]
        return result
    except (Exception, SystemExit) as exc:  # a case that cannot be set up is reported, not fatal to the run
        return {"variant": label, "error": f"{type(exc).__name__}: {exc}"[:500], "held": None, "problems": ["set-up failed"]}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def problems(setup: Setup, run: Run, result: dict) -> list[str]:
    out: list[str] = []
    if run.killed:
        out.append(run.killed)
    if run.traceback:
        out.append("traceback")
    if not result["intact"]:
        out.append("input changed: " + ", ".join(result["changed"][:3]))
    if result["outside"]:
        out.append("written outside its output: " + ", ".join(result["outside"][:3]))
    service = result.get("service")
    if service is not None:
        statuses = [a["status"] for a in service["answers"]]
        if any(s is None or s >= 500 or s < 400 for s in statuses):
            out.append(f"hostile request answered {statuses}")
        if service["health_max_ms"] is None or service["health_max_ms"] > HEALTH_BOUND_MS:
            out.append(f"/health took {service['health_max_ms']} ms")
        if service["rss_mib"]["peak"] - service["rss_mib"]["start"] > RSS_GROWTH_BOUND_MIB:
            out.append(f"server RSS grew {service['rss_mib']['peak'] - service['rss_mib']['start']:.0f} MiB")
        if service["well_behaved"]["failed"]:
            out.append(f"{service['well_behaved']['failed']} well-behaved requests failed")
        return out
    if not run.killed:
        if setup.expect == "refuse" and run.exit != 1:
            out.append(f"exit {run.exit}, expected a refusal")
        if setup.expect == "succeed" and run.exit != 0:
            out.append(f"exit {run.exit}, expected success")
        if run.exit not in (0, None) and run.kind != "one line" and not run.traceback:
            out.append("no single `error:` line")
    if setup.max_rss_mib is not None and run.peak_process_mib > setup.max_rss_mib and not run.killed:
        out.append(f"a process reached {run.peak_process_mib:.0f} MiB")
    out += result["facts"].get("problems", [])
    return out


class ServerGuard(threading.Thread):
    """Kills a child process of this script that passes the RSS cap (the service cases' server)."""

    def __init__(self, cap: int) -> None:
        super().__init__(daemon=True)
        self.cap, self.stopped, self.killed = cap, threading.Event(), None

    def run(self) -> None:
        me = psutil.Process()
        while not self.stopped.wait(0.05):
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    rss = p.memory_info().rss
                    if rss > self.cap:
                        self.killed = f"killed: the server passed {self.cap / 2**30:.0f} GiB ({rss / 2**30:.1f} GiB)"
                        p.kill()


def run_service(side: Side, setup: Setup, d: Path) -> tuple[Run, dict]:
    """The attack against a real `linker serve` of this side (scripts/reliability_service.py's run_case:
    2 well-behaved clients and a /health poller every 0.1 s before, during and after it)."""
    texts = [s["text"] for s in load_test.make_spans(d / "V", 1000)]
    guard = ServerGuard(side.rss_cap)
    guard.start()
    started = time.perf_counter()
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(side.pythonpath)  # the server runs `python -m linker` in the side's checkout too
    try:
        service = svc.run_case(side.pythonpath, d / "V", setup.service, texts, clients=2, limit=setup.timeout)
    finally:
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)
        guard.stopped.set()
        guard.join()
    answer = service["answers"][0] if service["answers"] else {"status": None, "shape": "none"}
    line = f"HTTP {answer['status']} {answer['shape']}" + (f": {answer['error']}" if answer.get("error") else "")
    run = Run(answer["status"], line[:300], line[:160], "service", service["tracebacks_in_log"] > 0,
              round(time.perf_counter() - started, 2), service["rss_mib"]["peak"], service["rss_mib"]["peak"],
              guard.killed)
    return run, service


def run_case(case: Case, side: Side) -> dict:
    started = time.perf_counter()
    variants = [run_variant(case, label, fn, side) for label, fn in case.variants.items()]
    held = None if any(v["held"] is None for v in variants) else all(v["held"] for v in variants)
    return {"id": case.id, "item": case.item, "title": case.title, "how": case.how, "variants": variants, "held": held,
            "seconds": round(time.perf_counter() - started, 1), "date": now()}


# ----------------------------------------------------------------------------- caches and report


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def portable(text: str, sides: dict[str, str]) -> str:
    """No machine paths in the report: the case folders go, the --before checkout is <before>,
    the repository and ../shared become relative (linker.fileio.portable_paths)."""
    for path, name in {**sides, sys.base_prefix + "/": "<python>/"}.items():  # <python>: tracebacks' stdlib files
        text = text.replace(path, name)
    text = re.sub(r"/tmp/linker-probe-[^/\s\"']+/", "", text)
    try:
        from linker.fileio import portable_paths
    except ImportError:  # the working tree's linker mid-edit: the plain replacements still hold
        return text.replace(str(ROOT.parent / "shared"), "../shared").replace(str(ROOT) + "/", "")
    return portable_paths(text, root=ROOT)


def cell(text: str, limit: int = 110) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"  # cut before escaping: never half an escape
    return text.replace("|", "\\|").replace("`", "'")


def summary(case: dict) -> dict:
    """One line of a case: its variants' worst (a failing one first)."""
    variants = case["variants"]
    runs = [v for v in variants if "run" in v]
    if not runs:
        return {"exit": "set-up failed", "line": variants[0].get("error", ""), "intact": "?", "outside": "?",
                "peak": "?", "health": "", "seconds": ""}
    worst = next((v for v in runs if not v["held"]), runs[0])
    r = worst["run"]
    line = (f"Traceback … {r['last_line']}" if r["traceback"] and r["kind"] != "service" else r["first_line"])
    if r["killed"]:
        line = f"{r['killed']}; {line}" if line else r["killed"]
    exits = "/".join(str(v["run"]["exit"]) for v in runs)
    health = "/".join(str(v["service"]["health_max_ms"]) for v in runs if "service" in v)
    return {"exit": exits, "line": (f"[{worst['variant']}] " if len(variants) > 1 else "") + line,
            "intact": "yes" if all(v["intact"] for v in runs) else "**no**",
            "outside": ", ".join(o for v in runs for o in v["outside"])[:80] or "none",
            "peak": f"{max(v['run']['peak_tree_mib'] for v in runs):,.0f} / {max(v['run']['peak_process_mib'] for v in runs):,.0f}",
            "health": health, "seconds": f"{sum(v['run']['seconds'] for v in runs):.1f}"}


def details(v: dict) -> str:
    """A variant's run in one line: exit, time, output, its own facts, the service figures."""
    r = v["run"]
    parts = [f"exit {r['exit']}, {r['seconds']} s, {r['stderr_lines']} stderr lines"]
    if r.get("ray_restarts"):
        parts.append(f"Ray reported {r['ray_restarts']} worker kills or actor restarts")
    parts.append(f"`{cell(r['last_line'] or r['first_line'] or '(nothing but log lines)', 200)}`")
    if v.get("note"):
        parts.append(v["note"])
    facts = {k: val for k, val in v["facts"].items() if k != "problems"}
    if facts:
        parts.append(f"facts: `{cell(json.dumps(facts, ensure_ascii=True), 300)}`")
    if "service" in v:
        s, wb = v["service"], v["service"]["well_behaved"]
        parts.append(f"service: {svc._answers(s['answers'])}, attack {s['attack_seconds']} s, RSS {s['rss_mib']['start']} "
                     f"→ {s['rss_mib']['peak']} MiB, well-behaved requests {wb['requests']} (failed {wb['failed']}), "
                     f"p99 {wb['p99_ms']} ms, max {wb['max_ms']} ms")
    return "; ".join(parts)


def verdict(case: dict | None) -> str:
    if case is None:
        return "not run"
    return {True: "held", False: "**fell**", None: "set-up failed"}[case["held"]]


NOTES = [
    "- 3a (/dev/zero), 3b, 6a, 6d: the watchdog kills the process at the RSS cap; the issue's runs went on (22 GB "
    "and a kernel kill; MemoryError; a Ray worker at 3.4 GB and exit 0; 8.4 GB, then std::bad_alloc and exit 134). "
    "Reaching the cap from a small input is the defect either way.",
    "- 4a, 4b: /health and RSS below the issue's 35.7 s and 1.9 GB (this machine, a tiny index, 2 well-behaved "
    "clients); the same mechanism: the whole body is parsed into objects on the event loop before any limit applies.",
    "- 7: the issue saw 37 restarts in 235 s; here each variant is stopped after 120 s (Ray's count of restarts, and "
    "the ShardWorker processes killed, are in the variant list).",
    "- 8a, names with NUL and \\x01: no extra lines, and linker's reader reads the file back (it splits lines on "
    "\\n and \\r only), but the .ann holds the raw control characters: counted as fallen (issue 34: escape or "
    "refuse what the format cannot hold). The injected T lines come from the other three variants.",
    "- 9a: the traceback ends the job after one good shard was linked (the issue: none of the 3); which shards "
    "finish first is Ray's scheduling.",
    "- 10a: run with --overwrite (the report's own files may be replaced); without it ca8b555 refuses because "
    "report.md exists.",
    "- 13: ca8b555 writes report.md and report.json before the chart fails (the issue says no report is written); "
    "exit 1 with a traceback, no PNG.",
    "- 1d (--encoder): the model folder carries linker's marker, as a folder from `linker train` does; ca8b555 "
    "refuses to replace a folder without it.",
]


def render(cache: dict[str, dict], before_label: str) -> str:
    by_id = {side: {c["id"]: c for c in data.get("cases", [])} for side, data in cache.items()}
    lines = ["# Issue 34: the hostile probe's cases before and after", "",
             "Generated by `scripts/reliability_probe.py` (the report is rewritten from the cached sides after every run):",
             "", "    mkdir -p /tmp/linker-before && git archive ca8b555 | tar -x -C /tmp/linker-before",
             "    python scripts/reliability_probe.py --before /tmp/linker-before --side both", "",
             f"Before = commit {before_label} (the code the probe broke), run with PYTHONPATH on an extracted copy; after = "
             "this repository's working tree. Each case runs one `linker` command (or, 4a/4b, one request to a real "
             "`linker serve`) in a fresh folder with a tiny index built by that side's own code.", ""]
    for side in ("before", "after"):
        data = cache.get(side, {})
        if not data.get("runs"):
            lines.append(f"- **{side}**: not run yet.")
            continue
        total = sum(c["seconds"] for c in data["cases"])
        lines.append(f"- **{side}**: {data['runs'][-1]['code']}; {len(data['cases'])} case(s), {total:.0f} s of case "
                     f"time in all ({total / 60:.1f} min; set-up of the side's tiny index not included). Runs:")
        for run in data["runs"]:
            lines.append(f"  - {run['date']}: {run['code']}, {run['seconds']:.0f} s for case(s) {', '.join(run['cases'])}; "
                         f"load average {run['load_start']} at the start, {run['load_end']} at the end; {run['machine']}; "
                         f"RSS cap {run['rss_cap_gib']} GiB.")
    count = {side: sum(1 for c in by_id.get(side, {}).values() if c["id"] in {p.id for p in PROBE_CASES})
             for side in ("before", "after")}
    held = {side: sum(1 for c in by_id.get(side, {}).values() if c["held"] and c["id"] in {p.id for p in PROBE_CASES})
            for side in ("before", "after")}
    lines += ["", f"Cases: {len(PROBE_CASES)} from the hostile probe (issue 34 items 1–12) plus items 13 and 14 "
              f"(defects of the project's own commands), {len(CASES)} in all, "
              f"{sum(len(c.variants) for c in CASES)} runs with the variants. Of the {len(PROBE_CASES)} probe cases, "
              f"held before: {held['before']}/{count['before']}, after: {held['after']}/{count['after']}.", "",
              "Counting: item 1 = 1a–1d (1d: --rerank and --encoder), 2 = 2a (Parquet) and 2b (JSONL), 3 = 3a "
              "(prior.file: /etc/passwd, ../../outside.json, a plain string, /dev/zero), 3b (calibration.json -> "
              "/dev/zero), 3c (NaN idf.npy), 4 = 4a and 4b (the two bodies), 5 = 5a (renamed) and 5b (edited), 6 = "
              "6a–6d, 7 (two ways to kill the worker), 8 = 8a (brat: id \\r, source \\n, --db \\n, NUL/\\x01 names) and 8b (ADE XML), 9 = 9a "
              "(truncated .gz) and 9b (not gzip), 10 = 10a and 10b, 11, 12 = 12a–12d: 29. If 4 and 5 are each "
              "counted as one case, 4a+4b and 5a+5b merge and items 1–14 make 29 instead.", "",
              "Columns: exit code (one per variant; negative = killed by that signal; 4a/4b: the HTTP status); the first line of output "
              "(stderr without log lines, else stdout; for a traceback its last line; for a multi-variant case the "
              "first variant that fell); inputs intact = the sha256 of every input file (index and model folders "
              "included) unchanged; written outside = files created, changed or removed in the case folder outside the "
              "command's output (a new file inside an input folder included; a changed input file counts under intact); peak RSS = the process tree (its RSS summed, sampled every 50 ms) / "
              "the high-water RSS (VmHWM) of its largest process, MiB; /health = the slowest GET /health during the attack (ms); s = the measured command's wall time (variants "
              "summed). A watchdog kills the "
              f"tree when one process passes the RSS cap or the run its time limit. A case **held** when: no "
              "traceback, not killed, inputs intact, nothing written outside, exit 1 with one `error:` line where the "
              "input must be refused (exit 0 where it must succeed), and the case's own check (listed below); service "
              f"cases: every hostile answer 4xx, /health under {HEALTH_BOUND_MS} ms, the server's RSS growth under "
              f"{RSS_GROWTH_BOUND_MIB} MiB, no well-behaved request failed.", "",
              "| id | case | side | exit | first line of output | inputs intact | written outside | peak RSS tree / "
              "largest (MiB) | /health max (ms) | s | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in CASES:
        for side in ("before", "after"):
            c = by_id.get(side, {}).get(case.id)
            name = f"**{case.title}**: {cell(case.how, 200)}" if side == "before" else ""
            if c is None:
                lines.append(f"| {case.id if side == 'before' else ''} | {name} | {side} | | not run | | | | | | |")
                continue
            s = summary(c)
            lines.append(f"| {case.id if side == 'before' else ''} | {name} | {side} | {s['exit']} | `{cell(s['line'])}` | "
                         f"{s['intact']} | {cell(s['outside'], 60)} | {s['peak']} | {s['health']} | {s['seconds']} | "
                         f"{verdict(c)} |")
    lines += ["", "## Where the before side differs from the issue's figures", "", *NOTES, "",
              "## Every variant", "", "What fell (or `held`), the case's own facts, and the full last line.", ""]
    for case in CASES:
        for side in ("before", "after"):
            c = by_id.get(side, {}).get(case.id)
            if c is None:
                continue
            for v in c["variants"]:
                label = f"{case.id}{' ' + v['variant'] if v['variant'] else ''}, {side}"
                if "run" not in v:
                    lines.append(f"- {label}: set-up failed: `{cell(v.get('error', ''), 300)}`")
                    continue
                lines.append(f"- {label}: {'; '.join(v['problems']) or 'held'}; {details(v)}")
    lines.append("")
    return "\n".join(lines)


def save(path: Path, text: str) -> None:
    """Written whole or not at all (a temporary beside it, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(cache: dict, before_label: str, before_path: str | None) -> None:
    sides = {before_path + "/": "<before>/"} if before_path else {}
    OUT.mkdir(parents=True, exist_ok=True)
    for side, data in cache.items():
        save(OUT / f"side_{side}.json", portable(json.dumps(data, indent=1, ensure_ascii=True), sides) + "\n")
    report = {"before_label": before_label, "case_count": {"probe": len(PROBE_CASES), "all": len(CASES)},
              "cases": [{"id": c.id, "item": c.item, "title": c.title, "how": c.how} for c in CASES], **cache}
    save(OUT / "report.json", portable(json.dumps(report, indent=1, ensure_ascii=True), sides) + "\n")
    save(OUT / "report.md", portable(render(cache, before_label), sides))


def load_cache() -> dict:
    cache = {}
    for side in ("before", "after"):
        path = OUT / f"side_{side}.json"
        if path.is_file():
            cache[side] = json.loads(path.read_text())
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="extracted checkout of the code before (ca8b555)")
    parser.add_argument("--before-label", default="ca8b555")
    parser.add_argument("--side", choices=("before", "after", "both"), default="both")
    parser.add_argument("--cases", default="", help="comma-separated case ids (default: all)")
    parser.add_argument("--rss-cap-gb", type=float, default=3.0, help="the watchdog's per-process RSS cap")
    parser.add_argument("--render-only", action="store_true", help="rewrite the report from the cached sides")
    args = parser.parse_args()
    cache = load_cache()
    if args.render_only:
        write_outputs(cache, args.before_label, str(args.before.resolve()) if args.before else None)
        print((OUT / "report.md").read_text())
        return
    wanted = [c for c in CASES if not args.cases or c.id in args.cases.split(",")]
    unknown = set(filter(None, args.cases.split(","))) - {c.id for c in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(c.id for c in CASES)}")
    names = ["before", "after"] if args.side == "both" else [args.side]
    if "before" in names and (args.before is None or not (args.before / "linker").is_dir()):
        raise SystemExit("--before must be an extracted checkout holding linker/ (see the docstring)")
    sides: list[Side] = []
    try:
        for name in names:
            path = args.before.resolve() if name == "before" else ROOT
            started, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
            try:
                side = make_side(name, path, int(args.rss_cap_gb * 2**30))
            except RuntimeError as exc:  # the side's own dict or index build fails: nothing to probe
                print(f"{name}: {exc}", file=sys.stderr)
                continue
            sides.append(side)
            data = cache.setdefault(name, {"cases": [], "runs": []})
            for case in wanted:
                print(f"{name} {case.id} {case.title} ...", file=sys.stderr, flush=True)
                result = run_case(case, side)
                data["cases"] = [c for c in data["cases"] if c["id"] != case.id] + [result]
                data["cases"].sort(key=lambda c: [c2.id for c2 in CASES].index(c["id"]))
                s = summary(result)
                print(f"  {verdict(result)}: exit {s['exit']}, {s['line'][:140]}", file=sys.stderr, flush=True)
                write_outputs(cache, args.before_label, str(args.before.resolve()) if args.before else None)
            dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
            data.setdefault("runs", []).append({
                "code": f"commit {args.before_label}" if name == "before" else
                f"commit {git('rev-parse', '--short', 'HEAD')}" + (" + uncommitted changes" if dirty else ""),
                "date": now(), "seconds": round(time.perf_counter() - started, 1),
                "cases": [c.id for c in wanted], "load_start": load_start,
                "load_end": [round(x, 2) for x in os.getloadavg()],
                "machine": f"{os.cpu_count()} CPU cores shared with other work, "
                           f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, Python {platform.python_version()}",
                "rss_cap_gib": args.rss_cap_gb,
            })
            latest: set[str] = set()  # keep the runs that gave at least one case's current result
            for run in reversed(data["runs"]):
                run["current"] = bool(set(run["cases"]) - latest)
                latest |= set(run["cases"])
            data["runs"] = [run for run in data["runs"] if run.pop("current")]
            write_outputs(cache, args.before_label, str(args.before.resolve()) if args.before else None)
    finally:
        for side in sides:
            shutil.rmtree(side.work, ignore_errors=True)
            shutil.rmtree(side.scratch, ignore_errors=True)
    print(f"wrote {(OUT / 'report.md').relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
