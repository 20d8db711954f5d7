"""Issue 44's hostile probe (round 3), before and after: eval/reliability_probe/round3/report.{md,json}.

    python -m bench.probe --side before           # commit 2bb6c2a, extracted to /tmp/linker-before when missing
    python -m bench.probe --side after            # a copy of this working tree (linker/, tests/, recipes/)
    python -m bench.probe --side after --cases 6,10:RAY_ADDRESS   # cases (or case:variant) again
    python -m bench.probe render                  # the report again from the cached sides

Each variant runs one `python -m linker ...` (PYTHONPATH = the side's tree) in a fresh folder under /tmp, with
relative paths, and records the exit code, first line, sha256 of every input and victim file, files written outside
its output, peak RSS under a watchdog (RSS cap, time limit), wall and CPU seconds, and the case's own facts. Fixtures
are built by each side's own code; shipped model folders are only touched in a per-case copy of the package. Each
side is cached in round3/side_<name>.json. The machinery is issue 34's scripts/reliability_probe.py (commit 33b63a3).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "eval" / "reliability_probe" / "round3"
BEFORE, BEFORE_PATH = "2bb6c2a", Path("/tmp/linker-before")
MIB = 1 << 20
NAMES = ("concept_id\tname\tlang\nC0002170\tAlopecia\ten\nC0002170\tHair loss\ten\nC0018681\tHeadache\ten\n"
         "C0027497\tNausea\ten\nC0012833\tDizziness\ten\n")
DOC = "Nausea after cisplatin."
LINK_BOUND_MS = 2000  # case 6 holds when no /link during the flood took longer
MANY_DOCS_BOUND_MIB = 1024  # case 5b holds when no process of the run grew past this
TAC = """<?xml version="1.0" encoding="UTF-8"?>
<Label drug="testdrug" track="TAC2017_ADR">
  <Text>
    <Section name="adverse reactions" id="{sid}">Patients had severe rash and nausea after the drug.</Section>
  </Text>
  <Mentions>
    <Mention id="M1" section="{sid}" type="AdverseReaction" start="20" len="4" str="rash" />
  </Mentions>
  <Relations />
  <Reactions />
</Label>
"""
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]?\d*\s+(DEBUG|INFO|WARNING)\b|\((raylet|\w+ pid=\d+)\)"
                      r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] )")
WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ----------------------------------------------------------------------------- one guarded run


@dataclass
class Run:
    exit: int | None  # negative: killed by that signal; None: a service case
    first_line: str  # first line of stderr that is not a log line (else of stdout)
    last_line: str  # the error line, or a traceback's last line
    traceback: bool
    seconds: float
    peak_tree_mib: float  # the largest sum of the tree's RSS, sampled every 50 ms
    peak_process_mib: float  # the largest VmHWM of one process of the tree
    killed: str | None = None
    one_line: bool = False  # exit 1 (2: a usage error) with exactly one `error: ` line
    stdout_head: str = ""
    rss_timeline: list = field(default_factory=list)  # (seconds, largest process MiB) every ~5 s
    cpu_seconds: float | None = None  # user + system of the process (and the children it waited for)


def lines_of(text: str) -> list[str]:
    """The lines a user reads as linker's answer: no log lines, no Python warnings with their source line."""
    out, skip = [], False
    for line in ANSI.sub("", text.replace("\r", "")).splitlines():
        if skip and line.startswith((" ", "\t")):
            skip = False
            continue
        skip = bool(WARNING_LINE.match(line))
        if line.strip() and not skip and not LOG_LINE.match(line):
            out.append(line)
    return out


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes: VmHWM, not ru_maxrss, which Linux carries over fork and exec."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status", "rb") as status:
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


def execute(argv: list[str], cwd: Path, env: dict, *, rss_cap: int, timeout: float = 120,
            during: Callable | None = None) -> Run:
    """`argv` in `cwd` under the watchdog (one process over `rss_cap`, the tree over twice that, or `timeout` s:
    the tree is killed); `during(elapsed, process)` runs every 50 ms tick."""
    logs = Path(tempfile.mkdtemp(prefix="linker-probe-logs-"))
    seen: dict[int, psutil.Process] = {}
    peak_tree = peak_proc = 0
    killed, timeline, next_mark = None, [], 0.0
    started = time.perf_counter()
    with (logs / "out").open("wb") as out, (logs / "err").open("wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        root = psutil.Process(proc.pid)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed, total, largest = time.perf_counter() - started, 0, 0
            for p in _tree(root):
                try:
                    rss, hwm = _memory(p.pid)
                except OSError:
                    continue
                seen.setdefault(p.pid, p)
                total, largest, peak_proc = total + rss, max(largest, rss), max(peak_proc, hwm)
                if killed is None and rss > rss_cap:
                    killed = f"killed: one process passed {rss_cap / 2**30:.0f} GiB ({rss / 2**30:.1f} GiB)"
            peak_tree = max(peak_tree, total)
            if elapsed >= next_mark:
                timeline.append((round(elapsed, 1), round(largest / MIB)))
                next_mark += 5.0
            if killed is None and total > 2 * rss_cap:
                killed = f"killed: the process tree passed {2 * rss_cap / 2**30:.0f} GiB"
            if killed is None and elapsed > timeout:
                killed = f"still running after {timeout:.0f} s, killed"
            if killed is not None:
                _kill(_tree(root))
                _kill(seen.values())
            elif during is not None:
                during(elapsed, root)
            time.sleep(0.05)
    code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    # The child's own high water from the kernel (KiB on Linux): a run that ends before the first 50 ms sample
    # would otherwise show no memory at all.
    peak_proc = max(peak_proc, usage.ru_maxrss * 1024)
    _kill(p for p in seen.values() if p.is_running())  # what a killed run (Ray) left behind
    stdout, stderr = (logs / "out").read_bytes(), (logs / "err").read_bytes()
    shutil.rmtree(logs, ignore_errors=True)
    text = os.fsdecode(stderr)
    lines, out_lines = lines_of(text), lines_of(os.fsdecode(stdout))
    traceback = "Traceback (most recent call last)" in text
    first = lines[0] if lines else " ".join(" ".join(out_lines[:6]).split())
    last = lines[-1] if lines else ""
    one = code in (1, 2) and len(lines) == 1 and lines[0].startswith("error: ")
    return Run(code, first[:300], last[:300], traceback, round(seconds, 2), round(max(peak_tree, peak_proc) / MIB, 1),
               round(peak_proc / MIB, 1), killed, one, "\n".join(out_lines[:5])[:600], timeline,
               round(usage.ru_utime + usage.ru_stime, 2))


# ----------------------------------------------------------------------------- one side


@dataclass
class Side:
    """A version of the code (`path` holds its `linker/`, `tests/` and `recipes/`) and its tiny shared fixtures."""

    name: str
    path: Path
    work: Path
    rss_cap: int
    made: dict = field(default_factory=dict)

    def env(self, extra: dict | None = None) -> dict:
        home = self.work / "home"
        home.mkdir(exist_ok=True)
        return {**os.environ, "PYTHONPATH": str(self.path), "HOME": str(home), "MPLCONFIGDIR": str(home / "mpl"),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1", "RAY_memory_monitor_refresh_ms": "0",
                **(extra or {})}

    def cli(self, cwd: Path, *args, env: dict | None = None, timeout: float = 120, during=None) -> Run:
        return execute([sys.executable, "-m", "linker", *map(_arg, args)], cwd, self.env(env), rss_cap=self.rss_cap,
                       timeout=timeout, during=during)

    def must(self, cwd: Path, *args, **options) -> Run:
        run = self.cli(cwd, *args, **options)
        if run.exit != 0:
            raise RuntimeError(f"set-up `linker {' '.join(map(_arg, args))}`: exit {run.exit} {run.last_line}")
        return run

    def index(self, kind: str = "idx") -> Path:
        """The tiny tf-idf index (idx: 5 names), or one of tests/fixtures/obo/hp_slice.obo (hpo)."""
        if kind not in self.made:
            if kind == "idx":
                write(self.work / "names.tsv", NAMES)
                self.must(self.work, "dict", "build", "--source", "tsv", "names.tsv", "--out", "names.parquet")
            else:
                self.must(self.work, "dict", "build", "--source", "obo", self.path / "tests/fixtures/obo/hp_slice.obo",
                          "--out", "hpo.parquet")
            self.must(self.work, "index", "build", "--dict", "names.parquet" if kind == "idx" else "hpo.parquet",
                      "--kind", "tfidf", "--out", kind)
            self.made[kind] = self.work / kind
        return self.made[kind]

    def encoder(self) -> Path:
        """A tiny random sentence-transformers folder: this side's tests/conftest.py make_tiny_encoder."""
        if "encoder" not in self.made:
            code = ("import importlib.util, pathlib, sys\nspec = importlib.util.spec_from_file_location('c', sys.argv[1])\n"
                    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
                    "m.make_tiny_encoder(pathlib.Path(sys.argv[2]))\n")
            run = execute([sys.executable, "-c", code, str(self.path / "tests" / "conftest.py"),
                           str(self.work / "encoder")], self.work, self.env(), rss_cap=self.rss_cap)
            if run.exit != 0:
                raise RuntimeError(f"tiny encoder: {run.last_line}")
            self.made["encoder"] = self.work / "encoder"
        return self.made["encoder"]


def _arg(value) -> str:
    return os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def docs(path: Path, *records: dict) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


# ----------------------------------------------------------------------------- what a case declares


@dataclass
class Setup:
    args: list  # `linker` arguments, relative to the case folder (or to `cwd` in it)
    inputs: list  # files and folders that must be byte-for-byte intact afterwards (victims included)
    outputs: list = field(default_factory=list)  # what the command may write (relative; a trailing * = a prefix)
    expect: str = "refuse"  # refuse: exit 1 with one `error:` line; succeed: exit 0; either
    timeout: float = 120
    env: dict = field(default_factory=dict)
    cwd: str = ""
    during: Callable | None = None
    check: Callable | None = None  # check(d, run) -> facts; facts["problems"]: what fell
    time_ok: bool = False  # stopped at its time limit: judged by its check alone (the memory cases)
    service: Callable | None = None  # service(d) -> (Run, facts): a case against a real `linker serve`


@dataclass
class Case:
    id: str
    title: str
    how: str
    variants: dict[str, Callable[[Path, Side], Setup]]


# ----------------------------------------------------------------------------- 1: a document id is an output path


def _ids(*ids: str, victim: str = "v/n.txt", annotate: bool = False) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        names = [i.replace("{abs}", str(d)) for i in ids]
        texts = [DOC, "Rash and headache after amoxicillin."]
        docs(d / "a.jsonl", *({"id": n, "text": texts[i % 2]} for i, n in enumerate(names)))
        inputs = [d / "a.jsonl"] + ([write(d / victim, "keep\n")] if victim else [])
        index = ["--index", side.index()] if annotate else []

        def check(d: Path, run: Run) -> dict:
            written = sorted(p.read_text() for p in (d / "out").rglob("*.txt")) if (d / "out").is_dir() else []
            facts = {"documents_in_output": len(written)}
            if len(ids) > 1 and run.exit == 0 and written != sorted(texts):
                facts["problems"] = [f"exit 0 with {len(written)} of the 2 documents in out/ (one output lost)"]
            return facts
        return Setup(["annotate" if annotate else "extract", *index, "--input", "a.jsonl", "--output", "out",
                      "--format", "brat"], inputs, ["out"], expect="either", check=check)
    return setup


def c1_xml(d: Path, side: Side) -> Setup:
    write(d / "label.xml", TAC.format(sid="/../../victimdir/sec"))
    return Setup(["extract", "--input", "label.xml", "--output", "out", "--format", "brat"],
                 [d / "label.xml", write(d / "victimdir" / "sec.txt", "keep\n")], ["out"], expect="either")


# ----------------------------------------------------------------------------- 2: a tampered dense work folder


def c2(d: Path, side: Side) -> Setup:
    words = ("acute chronic severe mild recurrent familial congenital progressive bilateral left".split(),
             "pain swelling rash nausea fever cough headache ulcer lesion stenosis hernia fracture".split(),
             "skin liver kidney lung heart brain eye ear bone muscle joint nerve".split())
    rows = [f"C{i // 3}\t{a} {b} of the {c} type {n}\ten" for i, (a, b, c, n) in enumerate(
        (a, b, c, n) for a in words[0] for b in words[1] for c in words[2] for n in range(14))]
    write(d / "big.tsv", "concept_id\tname\tlang\n" + "\n".join(rows) + "\n")
    side.must(d, "dict", "build", "--source", "tsv", "big.tsv", "--out", "big.parquet")
    (d / "big.tsv").unlink()
    args = ["index", "build", "--dict", "big.parquet", "--kind", "dense", "--encoder", side.encoder(), "--compile",
            "off", "--precision", "fp32", "--out", "didx"]

    def kill_after_first_chunk(elapsed: float, process: psutil.Process) -> None:
        if any(p.parent != d / "didx" for p in d.rglob("progress.json")):
            _kill(_tree(process))
    first = side.cli(d, *args, timeout=300, during=kill_after_first_chunk)
    tampered = []
    for path in d.rglob("progress.json"):
        saved = json.loads(path.read_text())
        chunks = math.ceil(saved.get("rows", len(rows)) / saved.get("chunk_rows", 8192))
        done = saved.get("done")  # the format's own shape: a list of chunks, or chunk -> digest (copied from chunk 0)
        forged = {str(c): next(iter(done.values())) for c in range(chunks)} if isinstance(done, dict) and done \
            else list(range(chunks))
        path.write_text(json.dumps({**saved, "done": forged}))
        tampered.append({"file": path.relative_to(d).as_posix(), "done_before": saved.get("done"), "chunks": chunks})

    def check(d: Path, run: Run) -> dict:
        import numpy as np
        facts = {"names": len(rows), "first_run": f"exit {first.exit} after {first.seconds} s"
                 + (" (killed once progress.json appeared)" if first.exit and first.exit < 0 else ""),
                 "tampered": tampered}
        path = d / "didx" / "dense" / "embeddings.npy"
        if run.exit == 0 and path.is_file():
            vectors = np.load(path, mmap_mode="r")
            zero = int((np.abs(np.asarray(vectors, dtype=np.float32)).sum(axis=1) == 0).sum())
            facts["zero_vectors"] = zero
            if zero:
                facts["problems"] = [f"exit 0 with {zero:,} of {len(vectors):,} name vectors all zero"]
        if not tampered:
            facts["problems"] = ["inconclusive: no progress.json to tamper with"]
        return facts
    return Setup(args, [d / "big.parquet"], ["didx", ".dense-partial*", ".didx*"], expect="either", timeout=300,
                 check=check)


# ----------------------------------------------------------------------------- 3, 4, 9: recipes


def recipe(d: Path, side: Side, dictionaries: str = "", name: str = "tiny", index: str = "", folder: str = "") -> Path:
    """A tiny tf-idf recipe over the MedDRA fixture (English) and the meddra-tiny spans, copied into `folder`."""
    base = d / folder
    shutil.copytree(side.path / "recipes" / "examples" / "meddra-tiny", base / "spans")
    shutil.copytree(side.path / "tests" / "fixtures" / "meddra" / "MedDRA_26_1_English", base / "fx" / "MedDRA_26_1_English")
    meddra = '{ source = "meddra", paths = ["fx/MedDRA_26_1_English"], meddra_target = "pt" }'
    dictionaries = dictionaries or f'[dictionary.meddra]\nsources = [{meddra}, {{ mentions = "train" }}]\n'
    return write(base / "recipe.toml", f"""[recipe]
name = {json.dumps(name)}

[datasets]
train = "tsv:spans/train.tsv"
dev = "tsv:spans/dev.tsv"
test = "tsv:spans/test.tsv"

{dictionaries.replace("MEDDRA", meddra)}
[index]
kind = "tfidf"
prior = ["train"]
{index}
[calibrate]
dataset = "dev"

[evaluate]
test = "test"
train = ["train"]
k = [1, 3]
""")


def chain(levels: int, times: int = 1) -> str:
    """Dictionaries d0 .. d<levels>, each including the next `times` times; the last holds the MedDRA source."""
    include = '{ dictionary = "d%d" }'
    tables = [f"[dictionary.d{i}]\nsources = [{', '.join([include % (i + 1)] * times)}]\n" for i in range(levels)]
    return "\n".join([*tables, f"[dictionary.d{levels}]\nsources = [MEDDRA]\n"])


def _recipe_out(where: str) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        recipe(d, side)
        inputs = [d / "spans", d / "fx"]
        if where.startswith("idx"):
            shutil.copytree(side.index(), d / "idx")
            inputs.append(d / "idx")
        if where.startswith("linker-en"):
            shutil.copytree(side.path / "linker" / "models" / "linker-en", d / "linker-en")
            inputs.append(d / "linker-en")
        return Setup(["recipe", "run", "recipe.toml", "--out", where, "--device", "cpu"], inputs, [where])
    return setup


def _recipe_name(absolute: bool) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        recipe(d, side, name=str(d / "abs") if absolute else "../../../x", folder="w")
        return Setup(["recipe", "run", "recipe.toml", "--device", "cpu"], [d / "w" / "spans", d / "w" / "fx"],
                     ["w/out"], expect="either", cwd="w")
    return setup


def c3_tampered(d: Path, side: Side) -> Setup:
    import pyarrow as pa
    import pyarrow.parquet as pq

    recipe(d, side)
    side.must(d, "recipe", "run", "recipe.toml", "--out", "o", "--device", "cpu")
    path = next((d / "o" / "stages").glob("dictionary.meddra-*/concepts.parquet"))
    table = pq.read_table(path)
    row = table.slice(0, 1).to_pylist()[0]
    pq.write_table(pa.concat_tables([table, pa.Table.from_pylist([{**row, "concept_id": "TAMPERED"}],
                                                                 schema=table.schema)]), path)
    text = (d / "recipe.toml").read_text()  # another index option: the index stage runs again, on the cached dictionary
    write(d / "recipe.toml", text.replace('prior = ["train"]\n', 'prior = ["train"]\ntfidf = { ngram_min = 2 }\n'))

    def check(d: Path, run: Run) -> dict:
        final = d / "o" / "index" / "concepts.parquet"
        used = final.is_file() and "TAMPERED" in pq.read_table(final).column("concept_id").to_pylist()
        facts = {"tampered": path.relative_to(d).as_posix() + " (a row with concept_id TAMPERED added)",
                 "tampered_row_in_o/index": used}
        if run.exit == 0 and used:
            facts["problems"] = ["exit 0: the new index was built from the tampered cached dictionary"]
        return facts
    return Setup(["recipe", "run", "recipe.toml", "--out", "o", "--device", "cpu"], [d / "spans", d / "fx"], ["o"],
                 expect="either", check=check)


def _recipe_cmd(dictionaries: str, command: str = "plan", timeout: float = 60, expect: str = "refuse") -> Callable:
    def setup(d: Path, side: Side) -> Setup:
        recipe(d, side, dictionaries, index='dictionary = "d0"')
        return Setup(["recipe", command, "recipe.toml", "--out", "o"], [d / "recipe.toml", d / "spans", d / "fx"],
                     ["o"], expect=expect, timeout=timeout)
    return setup


# ----------------------------------------------------------------------------- 5: memory


def c5_big(d: Path, side: Side) -> Setup:
    sentence = "Patient developed nausea and hair loss after cisplatin. "
    write(d / "big.txt", (sentence * (50_000_000 // len(sentence) + 1))[:50_000_000])
    return Setup(["extract", "--input", "big.txt", "--output", "o.jsonl"], [d / "big.txt"], ["o.jsonl"],
                 expect="either", timeout=300, time_ok=True)


def c5_many(d: Path, side: Side) -> Setup:
    write(d / "many.jsonl", '{"text": "nausea"}\n' * 1_000_000)

    def check(d: Path, run: Run) -> dict:
        facts = {"largest_process_mib_every_30_s": [mib for _, mib in run.rss_timeline[::6]]}
        if run.peak_process_mib > MANY_DOCS_BOUND_MIB:
            facts["problems"] = [f"a process reached {run.peak_process_mib:,.0f} MiB (bound {MANY_DOCS_BOUND_MIB:,})"]
        return facts
    return Setup(["extract", "--input", "many.jsonl", "--output", "o.jsonl"], [d / "many.jsonl"], ["o.jsonl"],
                 expect="either", timeout=300, time_ok=True, check=check)


# ----------------------------------------------------------------------------- 6, 10b: the service


@contextlib.contextmanager
def server(side: Side, d: Path, index: Path):
    """`linker serve` of this side on a free loopback port, its peak RSS sampled; yields (base URL, peaks)."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (d / ".server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "linker", "serve", "--index", str(index), "--port", str(port)],
                            cwd=d, env=side.env(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    peaks, stop = {"start": None, "peak": 0, "killed": None}, threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(psutil.Error, OSError):
                rss = _memory(proc.pid)[0]
                peaks["peak"] = max(peaks["peak"], rss // MIB)
                if rss > side.rss_cap:
                    peaks["killed"] = f"killed: the server passed {side.rss_cap / 2**30:.0f} GiB"
                    proc.kill()
    sampler = threading.Thread(target=sample, daemon=True)
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`linker serve` did not start: {(d / '.server.log').read_text()[-300:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        peaks["start"] = _memory(proc.pid)[0] // MIB
        sampler.start()
        yield base, peaks
    finally:
        stop.set()
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        proc.kill()
        proc.wait()
        log.close()
        peaks["tracebacks_in_log"] = (d / ".server.log").read_text(errors="replace").count("Traceback")
        (d / ".server.log").unlink()


def _service_run(line: str, started: float, peaks: dict, traceback: bool) -> Run:
    return Run(None, line, line, traceback, round(time.perf_counter() - started, 2), peaks["peak"], peaks["peak"],
               peaks["killed"])


def c6_flood(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index(), d / "idx")

    def attack(d: Path) -> tuple[Run, dict]:
        import httpx

        started = time.perf_counter()
        text = ("Patient developed nausea and hair loss after cisplatin; headache resolved. " * 120)[:8000]
        with server(side, d, d / "idx") as (base, peaks):
            link = lambda http: http.post(base + "/link", json={"mentions": [{"text": "hair loss"}]})  # noqa: E731
            with httpx.Client(timeout=60) as http:
                quiet = [_timed(lambda: link(http))[0] for _ in range(5)]
            answers: list = []

            def post() -> None:
                with httpx.Client(timeout=300) as http:
                    answers.append(_timed(lambda: http.post(base + "/annotate", json={"texts": [{"text": text}]})))
            threads = [threading.Thread(target=post, daemon=True) for _ in range(48)]
            for t in threads:
                t.start()
            flood_started, during = time.perf_counter(), []
            with httpx.Client(timeout=60) as http:
                while any(t.is_alive() for t in threads) and time.perf_counter() - flood_started < 300:
                    during.append(_timed(lambda: link(http)))
                    time.sleep(0.1)
            for t in threads:
                t.join(5)
            flood = round(time.perf_counter() - flood_started, 1)
        statuses = Counter(str(status) for _, status in answers)
        ms = sorted(m for m, _ in during)
        facts = {"annotate_statuses": dict(statuses), "annotate_429": statuses.get("429", 0), "flood_seconds": flood,
                 "link_quiet_p50_ms": _pct(sorted(quiet), 0.5), "link_requests_during": len(ms),
                 "link_p50_ms": _pct(ms, 0.5), "link_p99_ms": _pct(ms, 0.99), "link_max_ms": ms[-1] if ms else None,
                 "link_failed": sum(1 for _, s in during if s != 200), "server_rss_mib": [peaks["start"], peaks["peak"]]}
        problems = [f"/link took up to {facts['link_max_ms']:,.0f} ms during the flood (bound {LINK_BOUND_MS:,})"] \
            if not ms or ms[-1] > LINK_BOUND_MS else []
        problems += [f"{facts['link_failed']} /link requests failed"] if facts["link_failed"] else []
        problems += [f"/annotate answered {k}" for k in statuses if k not in ("200", "429", "503")]
        facts["problems"] = problems
        line = (f"48 x /annotate: {dict(statuses)}; /link during the flood p50 {facts['link_p50_ms']} ms, p99 "
                f"{facts['link_p99_ms']} ms, max {facts['link_max_ms']} ms")
        return _service_run(line, started, peaks, peaks["tracebacks_in_log"] > 0), facts
    return Setup([], [d / "idx"], [], service=attack, timeout=400)


def _timed(call) -> tuple[float, int | str]:
    started = time.perf_counter()
    try:
        status = call().status_code
    except Exception as exc:  # noqa: BLE001 - a refused or reset connection is an answer here
        status = type(exc).__name__
    return round((time.perf_counter() - started) * 1000, 1), status


def _pct(ordered: list[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else None


def c10_annotate_counts(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index(), d / "idx")

    def ask(d: Path) -> tuple[Run, dict]:
        import httpx

        started, facts, problems = time.perf_counter(), {}, []
        with server(side, d, d / "idx") as (base, peaks):
            for n in (33, 101):
                texts = [f"Case {i}: {'severe ' * (i % 4)}nausea and hair loss after cisplatin." for i in range(n)]
                response = httpx.post(base + "/annotate", json={"texts": [{"text": t} for t in texts]}, timeout=300)
                body = response.json()
                facts[f"{n}_texts"] = {"status": response.status_code,
                                       "answer": body.get("error") or f"{len(body.get('results', []))} results"}
                if n == 33:
                    results = body.get("results", [])
                    wrong = [i for i, r in enumerate(results) for s in r["spans"] if texts[i][s["start"]:s["end"]] != s["text"]]
                    facts["33_texts"]["spans_not_in_their_text"] = len(wrong)
                    if response.status_code != 200 or len(results) != 33 or wrong:
                        problems.append(f"33 texts: HTTP {response.status_code}, {len(results)} results, "
                                        f"{len(wrong)} spans not in their own text")
                elif response.status_code != 413 or "100" not in str(body.get("error")):
                    problems.append(f"101 texts: HTTP {response.status_code} {str(body.get('error'))[:80]}")
        facts["problems"] = problems
        line = "; ".join(f"{n}: HTTP {f['status']} {f['answer']}" for n, f in facts.items() if n != "problems")
        return _service_run(line[:300], started, peaks, peaks["tracebacks_in_log"] > 0), facts
    return Setup([], [d / "idx"], [], service=ask, timeout=300)


# ----------------------------------------------------------------------------- 7, 8, 9e: shipped model folders


def package(d: Path, side: Side) -> dict:
    """A copy of this side's `linker` package in d/pkg; the env that imports it."""
    shutil.copytree(side.path / "linker", d / "pkg" / "linker", ignore=shutil.ignore_patterns("__pycache__"))
    return {"PYTHONPATH": str(d / "pkg")}


def tiny_training(d: Path) -> list:
    for i in range(6):
        write(d / "phee" / f"{i}.txt", f"Rash developed after amoxicillin {i}.")
        write(d / "phee" / f"{i}.ann", "T1\tEffect 0 4\tRash\nT2\tDrug 21 32\tamoxicillin\n"
                                       "T3\tAdverse_event 5 14\tdeveloped\nE1\tAdverse_event:T3\n")
    for name in "ABCDE":
        write(d / "tac" / f"{name}.xml", TAC.format(sid="S1"))
    return ["train", "extractor", "--phee-train", "phee", "--phee-dev", "phee", "--tac", "tac", "--epochs", 1,
            "--threads", 1, "--max-seconds", 20]


def _shipped(kind: str) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        env, models = package(d, side), "pkg/linker/models"
        docs(d / "a.jsonl", {"id": "d1", "text": DOC})
        train = tiny_training(d)
        args = {"weights": ["extract", "--input", "a.jsonl", "--output", f"{models}/linker-en/weights.safetensors",
                            "--overwrite"],
                "multi": ["extract", "--input", "a.jsonl", "--output", f"{models}/linker-multi/x.jsonl"],
                "train": [*train, "--out", f"{models}/linker-en", "--overwrite"],
                "tune": [*train, "--out", f"{models}/linker-en", "--tune-only"]}[kind]
        return Setup(args, [d / models, d / "a.jsonl"], [], env=env, timeout=300)
    return setup


def _tagger(change: Callable[[dict], str | None]) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        shutil.copytree(side.path / "linker" / "models" / "linker-ae", d / "tagger")
        manifest = json.loads((d / "tagger" / "manifest.json").read_text())
        text = change(manifest)
        write(d / "tagger" / "manifest.json", text if text is not None else json.dumps(manifest, indent=1))
        docs(d / "a.jsonl", {"id": "d1", "text": DOC})
        return Setup(["extract", "--model", "tagger", "--input", "a.jsonl", "--output", "o.jsonl"],
                     [d / "tagger", d / "a.jsonl"], ["o.jsonl"])
    return setup


def _set(key: str, value) -> Callable[[dict], None]:
    return lambda m: m.update({key: value})


def _deep(m: dict) -> str:
    m["threshold"] = "DEEP"
    return json.dumps(m).replace('"DEEP"', "[" * 100_000 + "]" * 100_000)


def c10_weights_link(d: Path, side: Side) -> Setup:
    shutil.copytree(side.path / "linker" / "models" / "linker-ae", d / "tagger")
    (d / "tagger" / "weights.safetensors").unlink()
    (d / "tagger" / "weights.safetensors").symlink_to("/dev/zero")
    docs(d / "a.jsonl", {"id": "d1", "text": DOC})
    return Setup(["extract", "--model", "tagger", "--input", "a.jsonl", "--output", "o.jsonl"], [d / "a.jsonl"],
                 ["o.jsonl"], timeout=90, check=_not_missing("tagger/weights.safetensors"))


# ----------------------------------------------------------------------------- 9, 10, 11: one-off inputs


def c9_deep_label(d: Path, side: Side) -> Setup:
    write(d / "deep.xml", TAC.format(sid="S1").replace("<Reactions />", "<x>" * 200_000 + "</x>" * 200_000))
    return Setup(["extract", "--input", "deep.xml", "--output", "out", "--format", "ade-xml"], [d / "deep.xml"],
                 ["out"], expect="either")


def c9_nul(d: Path, side: Side) -> Setup:
    docs(d / "a.jsonl", {"id": "a\x00b", "text": DOC})
    return Setup(["extract", "--input", "a.jsonl", "--output", "out", "--format", "brat"], [d / "a.jsonl"], ["out"],
                 expect="either")


def c10_newline(d: Path, side: Side) -> Setup:
    write(d / "nl.txt", "Patient developed severe\nnausea and vomiting after cisplatin. She had hair\nloss and skin\nrash.\n")
    read_back = ("import sys\nfrom linker.formats.brat import read_brat\nprint(len(read_brat(sys.argv[1]).entities))\n")

    def check(d: Path, run: Run) -> dict:
        if run.exit != 0:
            return {"problems": [f"exit {run.exit}: the spans it found could not be written as brat"]}
        back = execute([sys.executable, "-c", read_back, str(d / "out" / "nl.ann")], d, side.env(), rss_cap=side.rss_cap)
        ok = back.exit == 0
        return {"reads_back": ok, "reader": back.first_line[:160],
                "problems": [] if ok else ["linker's brat reader rejects the .ann it wrote"]}
    return Setup(["extract", "--input", "nl.txt", "--output", "out", "--format", "brat", "--style", "phrases"],
                 [d / "nl.txt"], ["out"], expect="either", check=check)


def _ray(by_env: bool) -> Callable[[Path, Side], Setup]:
    def setup(d: Path, side: Side) -> Setup:
        shutil.copytree(side.index(), d / "idx")
        docs(d / "shards" / "a.jsonl", {"id": 1, "text": "hair loss"})

        def check(d: Path, run: Run) -> dict:
            named = "127.0.0.1:1" in run.last_line
            return {"names_the_address": named, "problems": [] if named or run.exit == 0 else
                    ["the error line does not name the address 127.0.0.1:1"]}
        return Setup(["normalize-ray", "--index", "idx", "--input", "shards", "--output", "out", "--workers", 1,
                      *([] if by_env else ["--address", "127.0.0.1:1"])], [d / "idx", d / "shards"], ["out"],
                     env={"RAY_ADDRESS": "127.0.0.1:1"} if by_env else {}, timeout=90, check=check)
    return setup


def _not_missing(what: str) -> Callable[[Path, Run], dict]:
    return lambda d, run: {"problems": [f"says {what} does not exist"] if "no such file" in run.last_line else []}


def c10_dev_zero(d: Path, side: Side) -> Setup:
    return Setup(["extract", "--input", "/dev/zero", "--output", "o.jsonl"], [], ["o.jsonl"], timeout=60,
                 check=_not_missing("/dev/zero"))


def c10_lay(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index(), d / "idx")
    write(d / "lay.tsv", "text\tconcept_ids\torigin\nhair loss\tC0002170\tx\nheadache\t|\tx\n")

    def check(d: Path, run: Run) -> dict:
        counted = bool(re.search(r"\| lay\.tsv \| all \| 2 \|", run.stdout_head))
        return {"row_without_id_scored": counted, "problems": [
            "exit 0: the row without a concept id is scored as a mention (n = 2)"] if run.exit == 0 and counted else []}
    return Setup(["eval", "--index", "idx", "--dataset", "lay:lay.tsv"], [d / "lay.tsv", d / "idx"], [],
                 expect="either", check=check)


def c11_hpo_brat(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index("hpo"), d / "hpo")
    write(d / "c.txt", "The patient developed headache and alopecia after cisplatin.\n")

    def check(d: Path, run: Run) -> dict:
        ann = "".join(p.read_text() for p in (d / "out").glob("*.ann")) if (d / "out").is_dir() else ""
        refs = re.findall(r"Reference T\d+ (\S+)", ann)
        return {"references": refs, "problems": [f"an HPO index's codes written as {refs[0]}"]
                if any(r.startswith("MedDRA:") for r in refs) else []}
    return Setup(["annotate", "--index", "hpo", "--input", "c.txt", "--output", "out", "--format", "brat"],
                 [d / "hpo", d / "c.txt"], ["out"], expect="either", check=check)


def c11_brat_jsonl(d: Path, side: Side) -> Setup:
    docs(d / "a.jsonl", {"id": "d1", "text": DOC})

    def check(d: Path, run: Run) -> dict:
        folder = (d / "out" / "c.jsonl").is_dir()
        return {"c.jsonl_is_a_folder": folder,
                "problems": ["exit 0: a brat folder named out/c.jsonl"] if run.exit == 0 and folder else []}
    return Setup(["extract", "--input", "a.jsonl", "--output", "out/c.jsonl", "--format", "brat"], [d / "a.jsonl"],
                 ["out"], expect="either", check=check)


def c11_uncalibrated(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index(), d / "idx")
    write(d / "gold.tsv", "C0002170\thair loss\nC0018681\theadache\n")

    def check(d: Path, run: Run) -> dict:
        said = "calibrated confidence" in run.stdout_head + run.first_line and "no calibration" in run.stdout_head
        return {"problems": ["reports an ECE 'of the calibrated confidence' for an index with no calibration"]
                if said else []}
    return Setup(["eval", "--index", "idx", "--dataset", "tsv:gold.tsv"], [d / "idx", d / "gold.tsv"], [],
                 expect="succeed", check=check)


def c11_broken_line(d: Path, side: Side) -> Setup:
    shutil.copytree(side.index(), d / "idx")
    write(d / "broken.jsonl", json.dumps({"id": "a", "text": DOC}) + '\n{"id": "b", "text": "Rash\n')

    def check(d: Path, run: Run) -> dict:
        missing = side.cli(d, "annotate", "--index", "idx", "--input", "missing.jsonl", "--output", "o2.jsonl")
        facts = {"wall_s_broken_line": run.seconds, "wall_s_missing_file": missing.seconds,
                 "cpu_s_broken_line": run.cpu_seconds, "cpu_s_missing_file": missing.cpu_seconds,
                 "missing_file_says": missing.last_line[:120], "names_line_2": "broken.jsonl:2" in run.last_line}
        slow = run.cpu_seconds > missing.cpu_seconds + 1  # CPU seconds: the shared machine's load moves wall time
        facts["problems"] = ([f"the broken line's error took {run.cpu_seconds:.1f} CPU s, a missing file's "
                              f"{missing.cpu_seconds:.1f}"] if slow else []) \
            + ([] if facts["names_line_2"] else ["the error does not name broken.jsonl:2"])
        return facts
    return Setup(["annotate", "--index", "idx", "--input", "broken.jsonl", "--output", "o.jsonl"],
                 [d / "broken.jsonl", d / "idx"], ["o.jsonl", "o2.jsonl"], check=check)


# ----------------------------------------------------------------------------- the list

CASES: list[Case] = [
    Case("1", "a document id becomes an output path",
         "`extract --input a.jsonl --output out --format brat` with id `../v/n` (v/n.txt holds `keep`), an absolute "
         "id, `a/b/../../../x`; a TAC label with `<Section id=\"/../../victimdir/sec\">`; ids `A` and `a/../A`; "
         "`annotate --index idx` with id `../v/n`",
         {"../v/n": _ids("../v/n"), "absolute": _ids("{abs}/abs/n", victim="abs/n.txt"),
          "a/b/../../../x": _ids("a/b/../../../x", victim="x.txt"), "TAC section id": c1_xml,
          "A and a/../A": _ids("A", "a/../A", victim=""), "annotate ../v/n": _ids("../v/n", annotate=True)}),
    Case("2", "tampered dense-build work folder",
         "`index build --kind dense --encoder <tiny> --compile off --precision fp32 --out didx` on 20,160 names "
         "(3 chunks of 8,192), killed once its work folder's progress.json appears, every chunk marked done there, "
         "run again", {"": c2}),
    Case("3", "recipe outputs",
         "`recipe run recipe.toml --out X` with X inside the dataset folder (spans/o), an index (idx/o), a model "
         "folder (linker-en/o); `[recipe] name` `../../../x` or absolute (no --out); the cached dictionary stage "
         "given a TAMPERED row, then run with another index option",
         {"--out spans/o": _recipe_out("spans/o"), "--out idx/o": _recipe_out("idx/o"),
          "--out linker-en/o": _recipe_out("linker-en/o"), "name ../../../x": _recipe_name(False),
          "name absolute": _recipe_name(True), "tampered stage": c3_tampered}),
    Case("4", "recipe plan, 26 levels of double includes",
         "`recipe plan` on d0 .. d26, each dictionary including the next twice (limit 30 s: fell on timeout)",
         {"": _recipe_cmd(chain(26, 2), timeout=30, expect="either")}),
    Case("5", "memory", "`extract --input big.txt` (one 50 MB document, limit 300 s, RSS cap 3 GiB); `extract "
         f"--input many.jsonl` (1,000,000 one-word documents, limit 300 s, bound {MANY_DOCS_BOUND_MIB:,} MiB)",
         {"50 MB document": c5_big, "1M documents": c5_many}),
    Case("6", "POST /annotate flood", "`serve --index idx`; 48 concurrent POST /annotate of one 8,000-character text "
         f"while POST /link of one mention is timed back to back (bound {LINK_BOUND_MS:,} ms)", {"": c6_flood}),
    Case("7", "shipped model folders (a copy of the package)",
         "with PYTHONPATH = a copy: `extract --output pkg/linker/models/linker-en/weights.safetensors --overwrite`; "
         "`--output pkg/linker/models/linker-multi/x.jsonl`; `train extractor ... --out pkg/linker/models/linker-en "
         "--overwrite` (tiny PHEE and TAC folders)",
         {"weights": _shipped("weights"), "linker-multi/x.jsonl": _shipped("multi"), "train": _shipped("train")}),
    Case("8", "tagger manifest", "`extract --model tagger` on a copy of linker-ae whose manifest has threshold "
         "AdverseEvent NaN, stride 0 / -1, max_length 2, threshold AdverseEvent \"0.8\", labels [], a 100,000-deep array",
         {"NaN": _tagger(lambda m: json.dumps({**m, "threshold": {**m["threshold"], "AdverseEvent": float("nan")}})),
          "stride 0": _tagger(_set("stride", 0)), "stride -1": _tagger(_set("stride", -1)),
          "max_length 2": _tagger(_set("max_length", 2)),
          "string threshold": _tagger(lambda m: m["threshold"].update(AdverseEvent="0.8")),
          "labels []": _tagger(_set("labels", [])), "deep array": _tagger(_deep)}),
    Case("9", "tracebacks", "`recipe plan` with d0 including d1 defined later; 1,500 chained dictionaries; "
         "`extract --format ade-xml` of a label with 200,000 nested elements; a NUL in a document id (brat); "
         "`train extractor --tune-only --out pkg/linker/models/linker-en` (a copy)",
         {"defined later": _recipe_cmd(chain(1), expect="either"),
          "1,500 chained": _recipe_cmd(chain(1500), expect="either"), "deep label": c9_deep_label, "NUL id": c9_nul,
          "--tune-only on an encoder": _shipped("tune")}),
    Case("10", "unclear or wrong", "`extract --format brat --style phrases` of spans across newlines; /annotate of 33 "
         "and of 101 texts; `normalize-ray` with RAY_ADDRESS=127.0.0.1:1 / --address 127.0.0.1:1; `extract --input "
         "/dev/zero`; a tagger whose weights.safetensors links to /dev/zero; `eval --dataset lay:` with a row `|`",
         {"newline span": c10_newline, "/annotate 33, 101": c10_annotate_counts, "RAY_ADDRESS": _ray(True),
          "--address": _ray(False), "/dev/zero": c10_dev_zero, "weights -> /dev/zero": c10_weights_link,
          "lay row without id": c10_lay}),
    Case("11", "first hour", "`annotate --format brat` on an HPO index (tests' hp_slice.obo); `extract --format brat "
         "--output out/c.jsonl`; `eval` on an uncalibrated index; `annotate` of a JSONL with a broken line 2 "
         "(seconds to the error vs a missing file)",
         {"HPO brat": c11_hpo_brat, "brat to c.jsonl": c11_brat_jsonl, "uncalibrated eval": c11_uncalibrated,
          "broken line": c11_broken_line}),
]


# ----------------------------------------------------------------------------- running a case


def snapshot(folder: Path) -> dict[str, str]:
    """relative path -> sha256 (regular files), '-> target' (symlinks), never following links."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(base, x))]:
            path = Path(base) / name
            mode, key = path.lstat().st_mode, path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode):
                out[key] = "-> " + os.readlink(path)
            elif stat.S_ISREG(mode):
                out[key] = _sha(path)
    return out


def _inside(key: str, outputs: list[str]) -> bool:
    """In an output, in its temporary beside it (`.<name>...`), or under a prefix pattern `name*`."""
    for f in outputs:
        if f.endswith("*"):
            if key.startswith(f[:-1]):
                return True
            continue
        parent, _, name = f.rpartition("/")
        if key == f or key.startswith(f + "/") or ((not parent or key.startswith(parent + "/"))
                                                   and key[len(parent) + bool(parent):].startswith("." + name)):
            return True
    return False


def run_variant(label: str, make: Callable, side: Side) -> dict:
    d = Path(tempfile.mkdtemp(prefix="linker-probe-case-"))
    result: dict = {"variant": label}
    try:
        started = time.perf_counter()
        setup = make(d, side)
        result["setup_seconds"] = round(time.perf_counter() - started, 1)
        result["command"] = re.sub(r"/tmp/linker-probe-[^/\s\"'`|]+/", "", "linker " + shlex.join(map(_arg, setup.args))
                                   if setup.args else "(requests to `linker serve --index idx`)")
        if setup.cwd:
            result["command"] = f"(in {setup.cwd}/) " + result["command"]
        digests = lambda: {k: v for p in setup.inputs for k, v in snapshot_of(Path(p)).items()}  # noqa: E731
        inputs, before = digests(), snapshot(d)
        if setup.service is not None:
            run, facts = setup.service(d)
        else:
            run = side.cli(d / setup.cwd, *setup.args, env=setup.env, timeout=setup.timeout, during=setup.during)
            facts = None
        now_inputs = digests()
        changed = sorted(k for k, v in inputs.items() if now_inputs.get(k, "absent") != v)
        after = snapshot(d)
        outside = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                         and not _inside(k, setup.outputs) and str(d / k) not in changed)
        if facts is None:
            facts = setup.check(d, run) if setup.check else {}
        result.update(run=asdict(run), intact=not changed, changed=[str(Path(k).relative_to(d)) if k.startswith(str(d))
                                                                     else k for k in changed][:10],
                      outside=outside[:10], facts=facts)
        result["problems"] = problems(setup, run, result)
        result["held"] = not result["problems"]
    except Exception as exc:  # noqa: BLE001 - a case that cannot be set up is reported, not fatal to the run
        result.update(error=f"{type(exc).__name__}: {exc}"[:500], held=None, problems=["set-up failed"])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return result


def snapshot_of(path: Path) -> dict[str, str]:
    """Absolute path -> digest of a file or of every file of a folder; 'absent' when there is none."""
    if path.is_dir() and not path.is_symlink():
        return {str(path / k): v for k, v in snapshot(path).items()} or {str(path): "empty"}
    if path.is_symlink():
        return {str(path): "-> " + os.readlink(path)}
    return {str(path): _sha(path) if path.is_file() else "absent"}


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def problems(setup: Setup, run: Run, result: dict) -> list[str]:
    out: list[str] = []
    if run.killed and not (setup.time_ok and run.killed.startswith("still running")):
        out.append(run.killed)
    if run.traceback:
        out.append("traceback")
    if not result["intact"]:
        out.append("input changed: " + ", ".join(result["changed"][:3]))
    if result["outside"]:
        out.append("written outside its output: " + ", ".join(result["outside"][:3]))
    if not run.killed and setup.service is None:
        if setup.expect == "refuse" and not run.one_line:
            out.append(f"exit {run.exit}, expected a refusal in one `error:` line")
        if setup.expect == "succeed" and run.exit != 0:
            out.append(f"exit {run.exit}, expected success")
        if run.exit not in (0, None) and not run.one_line and not run.traceback and setup.expect != "refuse":
            out.append("no single `error:` line")
    return out + list(result["facts"].get("problems", []))


def run_case(case: Case, side: Side) -> dict:
    started = time.perf_counter()
    variants = []
    for label, make in case.variants.items():
        print(f"  {side.name} {case.id} {label} ...", file=sys.stderr, flush=True)
        variants.append(run_variant(label, make, side))
        v = variants[-1]
        print(f"    {verdict(v['held'])}: {v.get('error') or v['run']['first_line'][:150]}", file=sys.stderr, flush=True)
    held = None if any(v["held"] is None for v in variants) else all(v["held"] for v in variants)
    return {"id": case.id, "title": case.title, "variants": variants, "held": held,
            "seconds": round(time.perf_counter() - started, 1), "date": now()}


# ----------------------------------------------------------------------------- caches and the report


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def verdict(held) -> str:
    return {True: "held", False: "**fell**", None: "set-up failed"}[held]


def portable(text: str, side_paths: dict[str, str]) -> str:
    for path, name in {**side_paths, sys.base_prefix + "/": "<python>/", str(REPO) + "/": ""}.items():
        text = text.replace(path, name)
    return re.sub(r"/tmp/linker-probe-[^/\s\"'`|]+/", "", text)


def cell(text, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("`", "'")


def render(cache: dict) -> list[str]:
    lines = ["Before = commit 2bb6c2a (extracted with `git archive`), after = a copy of this working tree (linker/, "
             "tests/, recipes/); each run as `python -m linker` with PYTHONPATH on the side's tree. Commands:", "",
             f"    mkdir -p {BEFORE_PATH} && git archive {BEFORE} | tar -x -C {BEFORE_PATH}   # done by --side before",
             "    python -m bench.probe --side before", "    python -m bench.probe --side after",
             "    python -m bench.probe render", ""]
    for name in ("before", "after"):
        for run in cache.get(name, {}).get("runs", []) or [None]:
            lines.append(f"- **{name}**: not run yet." if run is None else
                         f"- **{name}**: {run['code']}, {run['date']}: {run['seconds']:.0f} s for case(s) "
                         f"{', '.join(run['cases'])} (fixtures' set-up included); load average {run['load_start']} at "
                         f"the start, {run['load_end']} at the end; {run['machine']}.")
    lines += ["", "Each variant runs one command (listed under the table) in a fresh folder. Columns, before / after: "
              "exit code (negative: killed by that signal; n/a: a service case); first line of output (stderr "
              "without log lines, else stdout; a traceback's last line; the watchdog's kill first); inputs intact = "
              "the sha256 of every input and victim file unchanged; written outside = files created, changed or "
              "removed in the case folder outside the command's output; peak RSS = the largest process's high-water "
              "RSS (MiB); s = wall seconds. A variant **held** when it was not killed by the watchdog (a time limit "
              "excepted for case 5), printed no traceback, left its inputs intact, wrote nothing outside its output, "
              "refused in one `error:` line where a refusal is expected (3 --out, 7, 8, 9 --tune-only, 10 Ray, "
              "/dev/zero, weights, 11 broken line) and passed the case's own check (its problems below).", "",
              "| case | variant | exit | first line before | first line after | inputs intact | written outside | "
              "peak RSS MiB | s | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {n: {(c["id"], v["variant"]): v for c in cache.get(n, {}).get("cases", []) for v in c["variants"]}
          for n in ("before", "after")}
    both = lambda key, show: " / ".join(show(by[n][key]) if key in by[n] else "–" for n in ("before", "after"))  # noqa: E731
    ran = lambda show: lambda v: show(v["run"], v) if "run" in v else "set-up failed"  # noqa: E731
    for case in CASES:
        for i, label in enumerate(case.variants):
            key = (case.id, label)
            firsts = [f"`{cell(first_of(by[n][key]), 110)}`" if key in by[n] else "not run" for n in ("before", "after")]
            lines.append("| " + " | ".join([
                f"{case.id} {case.title}" if i == 0 else "", label, both(key, ran(lambda r, v: "n/a" if r["exit"] is None else str(r["exit"]))), *firsts,
                both(key, ran(lambda r, v: "yes" if v["intact"] else "**no**")),
                cell(both(key, ran(lambda r, v: ", ".join(v["outside"][:2]) or "none")), 80),
                both(key, ran(lambda r, v: f"{r['peak_process_mib']:,.0f}")),
                both(key, ran(lambda r, v: f"{r['seconds']:.0f}")), both(key, lambda v: verdict(v["held"]))]) + " |")
    lines += ["", "## Every variant", "", "The command (in a fresh case folder), then per side what fell (or `held`), the "
              "last line and the case's own facts.", ""]
    for case in CASES:
        lines += [f"### {case.id} {case.title}", "", case.how + ".", ""]
        for label in case.variants:
            command = next((by[n][(case.id, label)].get("command") for n in by if (case.id, label) in by[n]), None)
            lines.append(f"- {label or case.title}: `{command or 'not run'}`")
            for name in ("before", "after"):
                v = by[name].get((case.id, label))
                if v is None:
                    continue
                facts = {k: val for k, val in v.get("facts", {}).items() if k != "problems"}
                lines.append(f"  - {name}: {'; '.join(v['problems']) or 'held'}" + (
                    f"; `{cell(v['error'], 300)}`" if "error" in v else
                    f"; last line `{cell(v['run']['last_line'] or v['run']['first_line'] or '(none)', 220)}`"
                    + (f"; facts `{cell(json.dumps(facts, ensure_ascii=True), 500)}`" if facts else "")))
        lines.append("")
    return lines


def first_of(v: dict) -> str:
    if "run" not in v:
        return v.get("error", "")
    r = v["run"]
    first = f"Traceback … {r['last_line']}" if r["traceback"] else r["first_line"]
    return f"{r['killed']}; {first}" if r["killed"] else first


def write_report(cache: dict) -> None:
    sides = {str(BEFORE_PATH) + "/": "<before>/"}
    body = render(cache)
    try:  # the shared writer imports the working tree's linker: fall back to plain files while it is mid-edit
        from bench.report import Report
        report = Report("report", out=OUT, title="Issue 44: the hostile probe's regression report (round 3)")
        report.meta["command"] = "python -m bench.probe render"
        cases = [{"id": c.id, "title": c.title, "how": c.how, "variants": list(c.variants)} for c in CASES]
        text = portable(json.dumps({"before": BEFORE, "cases": cases, **cache}, default=str), sides)
        report.write(json.loads(text), [portable(line, sides) for line in body])
    except ImportError:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "report.json").write_text(portable(json.dumps({"before": BEFORE, **cache}, indent=1), sides) + "\n")
        (OUT / "report.md").write_text("# Issue 44: the hostile probe's regression report (round 3)\n\n"
                                       + portable("\n".join(body), sides) + "\n")


def save(data: dict, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    text = portable(json.dumps(data, indent=1, ensure_ascii=True, default=str), {str(BEFORE_PATH) + "/": "<before>/"})
    (OUT / f".side_{name}.json.tmp").write_text(text + "\n")
    os.replace(OUT / f".side_{name}.json.tmp", OUT / f"side_{name}.json")


def load_cache() -> dict:
    return {n: json.loads((OUT / f"side_{n}.json").read_text()) for n in ("before", "after")
            if (OUT / f"side_{n}.json").is_file()}


def side_tree(name: str, given: Path | None) -> tuple[Path, str, Path | None]:
    """(PYTHONPATH, code label, a temporary copy to remove). After: a copy, so no shipped file is ever touched."""
    if name == "before":
        path = given or BEFORE_PATH
        if not (path / "linker").is_dir():
            path.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
        return path, f"commit {BEFORE}", None
    copy = Path(tempfile.mkdtemp(prefix="linker-probe-aftertree-"))
    for part in ("linker", "tests", "recipes"):
        shutil.copytree((given or REPO) / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return copy, f"commit {git('rev-parse', '--short', 'HEAD')}{dirty}", copy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=("run", "render"), default="run")
    parser.add_argument("--side", choices=("before", "after"), help="which code to probe (run)")
    parser.add_argument("--path", type=Path, help=f"the side's tree (before: default {BEFORE_PATH}; after: this repo)")
    parser.add_argument("--cases", default="", help="comma-separated case ids, or id:variant (default: all)")
    parser.add_argument("--rss-cap-gb", type=float, default=3.0, help="the watchdog's per-process RSS cap")
    args = parser.parse_args(argv)
    cache = load_cache()
    if args.action == "render":
        write_report(cache)
        return
    if args.side is None:
        parser.error("run needs --side before|after")
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    unknown = {w.split(":")[0] for w in wanted} - {c.id for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(c.id for c in CASES)}")
    path, code, remove = side_tree(args.side, args.path)
    work = Path(tempfile.mkdtemp(prefix=f"linker-probe-{args.side}work-"))
    side = Side(args.side, path.resolve(), work, int(args.rss_cap_gb * 2**30))
    data = cache.setdefault(args.side, {"cases": [], "runs": []})
    started, load_start, ran = time.perf_counter(), [round(x, 2) for x in os.getloadavg()], []
    try:
        for case in CASES:
            picked = [w.partition(":")[2] for w in wanted if w.split(":")[0] == case.id]
            if wanted and not picked:
                continue
            if any(picked):
                case = Case(case.id, case.title, case.how, {k: v for k, v in case.variants.items() if k in picked})
            print(f"{args.side} {case.id} {case.title}", file=sys.stderr, flush=True)
            result = run_case(case, side)
            old = next((c for c in data["cases"] if c["id"] == case.id), None)
            if old is not None and any(picked):  # some variants again: the others are kept
                keep = [v for v in old["variants"] if v["variant"] not in case.variants]
                order = list(next(c for c in CASES if c.id == case.id).variants)
                result["variants"] = sorted(keep + result["variants"], key=lambda v: order.index(v["variant"]))
                result["held"] = None if any(v["held"] is None for v in result["variants"]) else \
                    all(v["held"] for v in result["variants"])
            data["cases"] = sorted([c for c in data["cases"] if c["id"] != case.id] + [result],
                                   key=lambda c: [x.id for x in CASES].index(c["id"]))
            ran.append(case.id + (":" + ",".join(picked) if any(picked) else ""))
            save(data, args.side)
        covered = lambda c: c in ran or c.split(":")[0] in ran  # noqa: E731 - runs whose results were all replaced go
        data["runs"] = [r for r in data["runs"] if not all(map(covered, r["cases"]))] + [{
            "code": code, "date": now(), "seconds": round(time.perf_counter() - started, 1), "cases": ran,
            "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()],
            "machine": f"{os.cpu_count()} CPU cores shared with other work, "
                       f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, RSS cap {args.rss_cap_gb} GiB"}]
        save(data, args.side)
        write_report(cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
    print(f"{args.side}: {time.perf_counter() - started:.0f} s; wrote {OUT.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
