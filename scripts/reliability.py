"""Hostile CLI and file cases, run against an older checkout and this one; writes eval/reliability/reliability.{md,json}.

    git archive 826a20f | tar -x -C /tmp/linker-before      # the code before issue 10
    python scripts/reliability.py --before /tmp/linker-before [--kills 5] [--huge-mb 50] [--before-huge-mb 5,10]

Every case runs `python -m linker ...` in a fresh temporary folder, once with PYTHONPATH set to the
`--before` checkout and once with this repository, and records the exit code, whether stderr was
one `error:` line or a traceback, and whether every input (and every file the case declares
precious) is byte-for-byte intact afterwards. Each side builds its own tiny index with its own
code. Permission cases run as user 65534 via `setpriv` (root ignores permissions). The `kill -9`
cases start `index build` and `normalize` over a previous output, kill them at seeded random
moments, and count intact previous outputs and leftover temporaries before and after the next run.
The 50 MB JSONL line is measured as peak RSS (`ru_maxrss` of the CLI process); the old code is
measured on smaller lines (`--before-huge-mb`), because its peak grows with the line and the
shared machine has no room for several GB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = "concept_id\tname\tlang\nC0002170\tAlopecia\ten\nC0002170\tHair loss\ten\nC0018681\tHeadache\ten\n" \
        "C0027497\tNausea\ten\nC0012833\tDizziness\ten\n"
TEXT = "Patient had severe headache and hair loss.\n"
ANN = "T1\tAE 19 27\theadache\nT2\tAE 32 41\thair loss\n"
RSS_PROBE = ("import resource, sys\nfrom linker.cli.main import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
             "    print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr, flush=True)\n")


@dataclass
class Side:
    name: str
    pythonpath: Path
    work: Path  # holds this side's index, built once

    def run(self, args: list, cwd: Path, *, user: bool = False, probe: bool = False,
            timeout: int = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(self.pythonpath), "HOME": str(cwd)}
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if user else []
        command = [sys.executable, "-c", RSS_PROBE] if probe else [sys.executable, "-m", "linker"]
        return subprocess.run([*prefix, *command, *map(os.fsdecode, args)], cwd=cwd, env=env, capture_output=True,
                              timeout=timeout)


@dataclass
class Outcome:
    exit: int
    stderr: str  # the error line, or the traceback's last line
    kind: str  # "ok", "one line", "traceback", "other"
    intact: bool  # every precious file unchanged
    notes: list[str] = field(default_factory=list)


def digest(paths: list[Path]) -> dict[str, str]:
    out = {}
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
        if not files:
            out[str(path)] = "absent"
    return out


def classify(run: subprocess.CompletedProcess) -> tuple[str, str]:
    # the cases' temporary folders are left out of the recorded messages
    err = re.sub(r"/tmp/linker-[a-z]+-[^/ ']+/", "", os.fsdecode(run.stderr).replace("\r", ""))
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("PEAK_KIB")
             and " INFO " not in line and " WARNING " not in line]
    if "Traceback (most recent call last)" in err:
        return "traceback", lines[-1][:160] if lines else ""
    if run.returncode == 0:
        return "ok", ""
    if len(lines) == 1 and lines[0].startswith("error: "):
        return "one line", lines[0][:160]
    return "other", (lines[-1] if lines else "")[:160]


# ----------------------------------------------------------------------------- cases
# Each case: (name, what it does, setup(folder, side) -> (args, precious paths, run options)).


def jsonl(path: Path, *texts: str) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def brat_folder(path: Path, ann: str = ANN, text: str = TEXT) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "doc1.txt").write_text(text, encoding="utf-8")
    (path / "doc1.ann").write_text(ann, encoding="utf-8")
    return path


def norm(side: Side, *args) -> list:
    return ["normalize", "--index", side.work / "idx", *args]


def copy_index(side: Side, folder: Path) -> Path:
    shutil.copytree(side.work / "idx", folder / "idx")
    return folder / "idx"


def set_manifest(index: Path, change: Callable[[dict], None]) -> None:
    manifest = json.loads((index / "manifest.json").read_text())
    change(manifest)
    (index / "manifest.json").write_text(json.dumps(manifest))


def alter_with_checksum(index: Path, relative: str) -> None:
    path = index / relative
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] + b"\x00garbage\xff" * 4)
    size, sha = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    set_manifest(index, lambda m: m["files"][relative].update(size=size, sha256=sha))


def case_brat_onto_txt(d: Path, side: Side):
    docs = brat_folder(d / "d")
    return norm(side, "--format", "brat", "--input", docs / "doc1.ann", "--output", docs / "doc1.txt"), [docs], {}


def case_overwrite_parent(d: Path, side: Side):
    brat_folder(d / "out" / "in")
    (d / "out" / "unrelated.txt").write_text("keep")
    return norm(side, "--format", "brat", "--input", d / "out" / "in", "--output", d / "out", "--overwrite"), \
        [d / "out"], {}


def case_jsonl_in_place(d: Path, side: Side):
    src = jsonl(d / "a.jsonl", "hair loss")
    return norm(side, "--format", "jsonl", "--input", src, "--output", src), [src], {}


def case_symlink_output(d: Path, side: Side):
    src = jsonl(d / "a.jsonl", "hair loss")
    (d / "link.jsonl").symlink_to(src)
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "link.jsonl"), [src], {}


def case_output_inside_input(d: Path, side: Side):
    docs = brat_folder(d / "docs")
    return norm(side, "--format", "brat", "--input", docs, "--output", docs / "normalised"), [docs], {"absent": True}


def case_existing_output_file(d: Path, side: Side):
    src, out = jsonl(d / "in.jsonl", "hair loss"), d / "report.jsonl"
    out.write_text("my notes, not an output of linker\n")
    return norm(side, "--format", "jsonl", "--input", src, "--output", out), [src, out], {}


def case_dict_build_over_table(d: Path, side: Side):
    (d / "names.tsv").write_text(NAMES)
    shutil.copyfile(side.work / "names.parquet", d / "kept.parquet")
    return ["dict", "build", "--source", "tsv", d / "names.tsv", "--out", d / "kept.parquet"], [d / "kept.parquet"], {}


def case_index_over_foreign_folder(d: Path, side: Side):
    (d / "project").mkdir()
    (d / "project" / "manifest.json").write_text('{"kind": "webapp", "files": {}}')
    (d / "project" / "thesis.tex").write_text("years of work")
    return ["index", "build", "--dict", side.work / "names.parquet", "--out", d / "project"], [d / "project"], {}


def case_folder_as_output(d: Path, side: Side):
    src = jsonl(d / "in.jsonl", "hair loss")
    (d / "outdir").mkdir()
    (d / "outdir" / "keep.txt").write_text("x")
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "outdir"), [src, d / "outdir"], {}


def case_folder_as_parquet(d: Path, side: Side):
    (d / "table.parquet").mkdir()
    return ["index", "build", "--dict", d / "table.parquet", "--out", d / "idx"], [d / "table.parquet"], {}


def case_empty_vocabulary(d: Path, side: Side):
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(side.work / "names.parquet").slice(0, 0), d / "empty.parquet")
    return ["index", "build", "--dict", d / "empty.parquet", "--out", d / "idx"], [d / "empty.parquet"], {}


def case_manifest_missing(d: Path, side: Side):
    index = copy_index(side, d)
    set_manifest(index, lambda m: m.pop("counts"))
    return ["index", "info", index], [index], {}


def case_manifest_mistyped(d: Path, side: Side):
    index = copy_index(side, d)
    set_manifest(index, lambda m: m.update(files=[]))
    return ["link", "--index", index, "hair loss"], [index], {}


def case_manifest_escapes(d: Path, side: Side):
    index = copy_index(side, d)
    secret = d / "outside.txt"
    secret.write_text("not part of the index")
    sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    set_manifest(index, lambda m: m["files"].update({"../outside.txt": {"size": secret.stat().st_size, "sha256": sha}}))
    return ["link", "--index", index, "hair loss"], [index], {"refuse": True}


def altered(relative: str):
    def case(d: Path, side: Side):
        index = copy_index(side, d)
        alter_with_checksum(index, relative)
        return ["link", "--index", index, "hair loss"], [index], {}

    return case


def case_non_utf8_path(d: Path, side: Side):
    table = os.fsencode(d) + b"/names\xff.parquet"
    shutil.copyfile(side.work / "names.parquet", table)
    return ["index", "build", "--dict", table, "--out", d / "idx"], [Path(os.fsdecode(table))], {"absent_glob": "idx"}


def case_surrogate(d: Path, side: Side):
    src = d / "in.jsonl"
    src.write_text('{"text": "head\\ud800ache"}\n')
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "o.jsonl"), [src], {"absent": True}


def case_nesting(d: Path, side: Side):
    src = d / "in.jsonl"
    src.write_text('{"text": "nausea", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "o.jsonl"), [src], {"absent": True}


def case_brat_beyond(d: Path, side: Side):
    docs = brat_folder(d / "docs", ann="T1\tAE 19 27\theadache\nT2\tAE 40 99\tloss\n")
    return norm(side, "--format", "brat", "--input", docs, "--output", d / "out"), [docs], {"refuse": True}


def case_brat_mismatch(d: Path, side: Side):
    docs = brat_folder(d / "docs", ann="T1\tAE 19 27\tmigraine\n")
    return norm(side, "--format", "brat", "--input", docs, "--output", d / "out"), [docs], {"refuse": True}


def case_unreadable(d: Path, side: Side):
    src = jsonl(d / "secret.jsonl", "hair loss")
    src.chmod(0o000)
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "o.jsonl"), [], {"user": True}


def case_read_only_folder(d: Path, side: Side):
    src = jsonl(d / "in.jsonl", "hair loss")
    (d / "locked").mkdir()
    (d / "locked").chmod(0o555)
    return norm(side, "--format", "jsonl", "--input", src, "--output", d / "locked" / "o.jsonl"), [src], {"user": True}


CASES: list[tuple[str, str, Callable]] = [
    ("brat output onto its own .txt", "`normalize --format brat --input d/doc1.ann --output d/doc1.txt`", case_brat_onto_txt),
    ("--overwrite onto a folder holding the input", "`--input out/in --output out --overwrite` (brat)", case_overwrite_parent),
    ("JSONL output = input", "`--input a.jsonl --output a.jsonl`", case_jsonl_in_place),
    ("output a symlink to the input", "`--output link.jsonl`, link.jsonl -> a.jsonl", case_symlink_output),
    ("output inside the input folder", "`--input docs --output docs/normalised` (brat)", case_output_inside_input),
    ("existing output file, no --overwrite", "`--output report.jsonl` that holds the user's notes", case_existing_output_file),
    ("dict build over an existing table", "`dict build --out kept.parquet` (exists), no --overwrite", case_dict_build_over_table),
    ("index build over a folder linker did not write", "`--out project/` holding manifest.json + thesis.tex", case_index_over_foreign_folder),
    ("folder as the output file", "`normalize --output outdir/` (a folder)", case_folder_as_output),
    ("folder as the parquet", "`index build --dict table.parquet/` (a folder)", case_folder_as_parquet),
    ("0-row concept table", "`index build --dict empty.parquet`", case_empty_vocabulary),
    ("manifest field missing", "`index info` with no 'counts'", case_manifest_missing),
    ("manifest field mistyped", "`link` with 'files' a list", case_manifest_mistyped),
    ("manifest names ../outside.txt", "`link`; the outside file's size and sha256 listed", case_manifest_escapes),
    ("concepts.parquet altered, checksum updated", "`link`", altered("concepts.parquet")),
    ("tfidf/names.npz altered, checksum updated", "`link`", altered("tfidf/names.npz")),
    ("tfidf/idf.npy altered, checksum updated", "`link`", altered("tfidf/idf.npy")),
    ("non-UTF-8 byte in a path", "`index build --dict names\\xff.parquet`", case_non_utf8_path),
    ("lone surrogate in JSONL", '`{"text": "head\\ud800ache"}`', case_surrogate),
    ("JSONL nested 100,000 deep", '`{"text": ..., "x": [[[...]]]}`', case_nesting),
    ("brat span beyond the .txt", "`T2 AE 40 99` in a 43-character text", case_brat_beyond),
    ("brat span text differs from the .txt", "`T1 AE 19 27 migraine` where the text says headache", case_brat_mismatch),
    ("unreadable input (mode 000)", "as user 65534", case_unreadable),
    ("read-only output folder", "as user 65534", case_read_only_folder),
]


def run_case(side: Side, name: str, setup: Callable) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix="linker-rel-"))
    folder.chmod(0o777)
    try:
        args, precious, opts = setup(folder, side)
        if opts.get("user"):
            for path in [side.work, *side.work.rglob("*")]:
                path.chmod(path.stat().st_mode | 0o005 | (0o001 if path.is_dir() else 0))
        before = digest(precious)
        run = side.run(args, folder, user=bool(opts.get("user")))
        kind, line = classify(run)
        outcome = Outcome(run.returncode, line, kind, digest(precious) == before)
        if opts.get("absent") and any(p.name in ("o.jsonl", "normalised") for p in folder.rglob("*")):
            outcome.notes.append("an output was written")
        if opts.get("refuse") and run.returncode == 0:
            outcome.notes.append("accepted silently")
        if opts.get("absent_glob") and list(folder.glob(opts["absent_glob"])):
            outcome.notes.append("an output was written")
        leftovers = [p.name for p in folder.rglob("*") if ".tmp" in p.name or ".linker-tmp-" in p.name]
        if leftovers:
            outcome.notes.append(f"{len(leftovers)} temporaries left")
        return outcome
    finally:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- kill -9 and memory


def big_names(path: Path, rows: int) -> None:
    import random

    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as handle:
        handle.write("concept_id\tname\tlang\n")
        for i in range(rows):
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(14))
            handle.write(f"C{i % (rows // 3):07d}\t{word} {i}\ten\n")


def kill_runs(side: Side, kills: int, seed: int) -> dict:
    import random

    folder = Path(tempfile.mkdtemp(prefix="linker-kill-"))
    try:
        big_names(folder / "big.tsv", 60_000)
        assert side.run(["-q", "dict", "build", "--source", "tsv", folder / "big.tsv", "--out", folder / "big.parquet"],
                        folder).returncode == 0
        assert side.run(["-q", "index", "build", "--dict", folder / "big.parquet", "--out", folder / "idx"],
                        folder).returncode == 0
        spans = folder / "in.jsonl"
        jsonl(spans, *[f"name {i} hair loss" for i in range(3000)])
        assert side.run(["-q", "normalize", "--index", folder / "idx", "--format", "jsonl", "--input", spans,
                         "--output", folder / "out.jsonl"], folder).returncode == 0
        index_before, out_before = digest([folder / "idx"]), digest([folder / "out.jsonl"])
        rng = random.Random(seed)
        result = {"kills": 0, "index_intact": 0, "output_intact": 0, "leftovers_after_kills": 0, "seconds": {}}
        # The new code asks before replacing; the old one replaced silently. Both are told to replace.
        flag = ["--overwrite"] if side.name == "after" else []
        commands = {
            "index": ["-q", "index", "build", "--dict", folder / "big.parquet", "--out", folder / "idx", *flag],
            "output": ["-q", "normalize", "--index", folder / "idx", "--format", "jsonl", "--input", spans,
                       "--output", folder / "out.jsonl", *flag],
        }
        env = {**os.environ, "PYTHONPATH": str(side.pythonpath)}
        for check, command in commands.items():  # one unkilled run each: the window the kills are drawn from
            started = time.perf_counter()
            assert side.run(command, folder).returncode == 0
            result["seconds"][check] = round(time.perf_counter() - started, 1)
        index_before, out_before = digest([folder / "idx"]), digest([folder / "out.jsonl"])
        for _ in range(kills):
            for check, command in commands.items():
                process = subprocess.Popen([sys.executable, "-m", "linker", *map(str, command)], cwd=folder, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0.2, 0.95) * result["seconds"][check])
                process.send_signal(signal.SIGKILL)
                result["kills"] += process.wait() == -signal.SIGKILL
                if check == "index":
                    # intact = the previous index byte for byte, or a complete new one that verifies
                    verify = side.run(["index", "info", folder / "idx"], folder)
                    result["index_intact"] += digest([folder / "idx"]) == index_before or verify.returncode == 0
                else:
                    result["output_intact"] += digest([folder / "out.jsonl"]) == out_before
        result["leftovers_after_kills"] = len([p for p in folder.iterdir() if p.name.startswith(".")])
        side.run(["-q", "index", "build", "--dict", folder / "big.parquet", "--out", folder / "idx", *flag], folder)
        result["leftovers_after_next_run"] = len([p for p in folder.iterdir() if p.name.startswith(".")])
        result["leftover_names"] = sorted({p.name.split(".")[1] for p in folder.iterdir() if p.name.startswith(".")})
        result["attempts"] = 2 * kills
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def huge_line(side: Side, megabytes: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="linker-huge-"))
    try:
        src = folder / "huge.jsonl"
        mebibyte = (b"hair loss " * 104_858)[: 1 << 20]  # a linkable phrase, repeated to exactly 1 MiB
        with src.open("wb") as handle:
            handle.write(b'{"text": "')
            for _ in range(megabytes):
                handle.write(mebibyte)
            handle.write(b'"}\n')
        started = time.perf_counter()
        run, peak = normalize_peak(side, src, folder)
        kind, line = classify(run)
        return {"mb": megabytes, "exit": run.returncode, "kind": kind, "error": line, "peak_mib": peak,
                "seconds": round(time.perf_counter() - started, 1)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def normalize_peak(side: Side, src: Path, folder: Path) -> tuple[subprocess.CompletedProcess, int | None]:
    """`normalize` of `src` in a process that reports its peak RSS (MiB)."""
    run = side.run(["normalize", "--index", side.work / "idx", "--format", "jsonl", "--input", src, "--output",
                    folder / "o.jsonl"], folder, probe=True, timeout=900)
    peak = [line for line in os.fsdecode(run.stderr).splitlines() if line.startswith("PEAK_KIB")]
    return run, round(int(peak[-1].split()[1]) / 1024) if peak else None


def baseline(side: Side) -> int:
    folder = Path(tempfile.mkdtemp(prefix="linker-base-"))
    try:
        return normalize_peak(side, jsonl(folder / "in.jsonl", "hair loss"), folder)[1]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- report


def describe(o: Outcome) -> str:
    verdict = {"ok": "exit 0", "one line": "exit 1, one line", "traceback": f"exit {o.exit}, traceback",
               "other": f"exit {o.exit}, {o.stderr[:40]!r}"}[o.kind]
    parts = [verdict, "files at risk intact" if o.intact else "**a file at risk changed or lost**", *o.notes]
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="checkout of the code before (e.g. 826a20f)")
    parser.add_argument("--before-label", default="826a20f")
    parser.add_argument("--kills", type=int, default=5, help="kill -9 attempts per command and side")
    parser.add_argument("--huge-mb", type=int, default=50)
    parser.add_argument("--before-huge-mb", default="5,10", help="line sizes (MiB) to measure the old code with")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "reliability" / "reliability")
    parser.add_argument("--render-only", action="store_true", help="rewrite OUT.md from OUT.json without running")
    args = parser.parse_args()
    if args.render_only:
        results = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(markdown(results, args.before_label))
        return
    load_before = os.getloadavg()
    sides = []
    for name, path in (("before", args.before.resolve()), ("after", ROOT)):
        work = Path(tempfile.mkdtemp(prefix=f"linker-{name}-"))
        work.chmod(0o755)
        (work / "names.tsv").write_text(NAMES)
        side = Side(name, path, work)
        for command in (["dict", "build", "--source", "tsv", work / "names.tsv", "--out", work / "names.parquet"],
                        ["index", "build", "--dict", work / "names.parquet", "--out", work / "idx"]):
            run = side.run(command, work)
            assert run.returncode == 0, run.stderr
        sides.append(side)
    results: dict = {"cases": [], "kill": {}, "huge_line": {}, "baseline_peak_mib": {}}
    try:
        for name, what, setup in CASES:
            row = {"case": name, "what": what}
            for side in sides:
                row[side.name] = run_case(side, name, setup).__dict__
            results["cases"].append(row)
            print(f"{name}: {describe(Outcome(**row['before']))} | {describe(Outcome(**row['after']))}", flush=True)
        for side in sides:
            results["baseline_peak_mib"][side.name] = baseline(side)
            sizes = [int(x) for x in args.before_huge_mb.split(",")] if side.name == "before" else \
                [*[int(x) for x in args.before_huge_mb.split(",")], args.huge_mb]
            results["huge_line"][side.name] = [huge_line(side, mb) for mb in sizes]
            print(side.name, results["huge_line"][side.name], flush=True)
            results["kill"][side.name] = kill_runs(side, args.kills, seed=7)
            print(side.name, results["kill"][side.name], flush=True)
    finally:
        for side in sides:
            shutil.rmtree(side.work, ignore_errors=True)
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    results["command"] = (f"python scripts/reliability.py --before <checkout of {args.before_label}> --kills {args.kills} "
                          f"--huge-mb {args.huge_mb} --before-huge-mb {args.before_huge_mb}")
    results["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results, args.before_label))
    print(f"wrote {args.out.with_suffix('.md')}")


def markdown(r: dict, label: str) -> str:
    load = r["load_average"]
    lines = [
        "# Reliability of the CLI and its files under hostile input (issue 10)",
        "",
        f"Generated by `scripts/reliability.py` on {r['date']}:",
        "",
        f"    git archive {label} | tar -x -C /tmp/linker-before",
        f"    {r['command'].replace('<checkout of ' + label + '>', '/tmp/linker-before')}",
        "",
        f"Before = the code at commit {label}; after = this repository. Each case runs `python -m linker` in a fresh",
        "folder on both; \"files at risk intact\" compares the sha256 of every input file and of every other file",
        "the case puts at risk (an existing table, a user's folder) before and after the run. Permission cases run as user 65534 (`setpriv`), because root",
        f"ignores file modes. Machine: 2 shared CPU cores; load average {load['before'][0]:.1f} at the start and "
        f"{load['after'][0]:.1f} at the end.",
        "The HTTP service's cases are in [reliability_service.md](reliability_service.md).",
        "",
        "| case | how | before | after | after's message |",
        "|---|---|---|---|---|",
    ]
    for row in r["cases"]:
        before, after = Outcome(**row["before"]), Outcome(**row["after"])
        message = re.sub(r"/tmp/linker-rel-[^/ ]+/", "", after.stderr).replace("|", "\\|")
        what = row["what"].replace("|", "\\|")
        lines.append(f"| {row['case']} | {what} | {describe(before)} | {describe(after)} | `{message}` |")
    lines += ["", "## A JSONL line with a huge text", "",
              "Peak RSS of the whole CLI process (`ru_maxrss`), index loading included; the baseline is the same",
              "command on a one-span file.", "",
              "| code | line | exit | peak RSS (MiB) | over baseline (MiB) | seconds |", "|---|---|---|---|---|---|"]
    for side in ("before", "after"):
        base = r["baseline_peak_mib"][side]
        for h in r["huge_line"][side]:
            outcome = "exit 0 (linked)" if h["exit"] == 0 else f"exit {h['exit']}, {h['kind']}"
            lines.append(f"| {side} | {h['mb']} MiB | {outcome} | {h['peak_mib']} | {h['peak_mib'] - base} | {h['seconds']} |")
    lines += ["", f"Baselines: before {r['baseline_peak_mib']['before']} MiB, after {r['baseline_peak_mib']['after']} MiB.",
              "After, the line is refused once 1 MiB of it has been read (`--max-line-bytes`, default 1 MiB), so the",
              "peak does not grow with the line; before, the whole line was read, parsed and linked.", "",
              "## kill -9 in the middle of a write", "",
              "`index build` (60,000 names, tf-idf) and `normalize` (3,000 spans) over their previous output, killed",
              "at seeded random moments between 20% and 95% of an unkilled run's duration (measured first, on the same",
              "machine); \"intact\" = the previous output byte for byte (or, for the index, a complete folder that",
              "`index info` verifies). Leftovers are the dot-entries (temporaries) beside the outputs; after, every run",
              "first removes those of killed runs, so only the last kill's remain until the next run.", "",
              "| code | kill attempts | killed mid-run | index intact | normalize output intact | leftovers after the kills | "
              "leftovers after the next run |", "|---|---|---|---|---|---|---|"]
    for side in ("before", "after"):
        k = r["kill"][side]
        lines.append(f"| {side} | {k['attempts']} | {k['kills']} | {k['index_intact']}/{k['attempts'] // 2} | "
                     f"{k['output_intact']}/{k['attempts'] // 2} | {k['leftovers_after_kills']} | "
                     f"{k['leftovers_after_next_run']} |")
    lines += ["", "Unkilled durations (s): " + "; ".join(
        f"{side}: index build {r['kill'][side]['seconds']['index']}, normalize {r['kill'][side]['seconds']['output']}"
        for side in ("before", "after"))]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
