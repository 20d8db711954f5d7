"""Issue 46's closing figures: line counts per package of linker/ at two revisions, and whether a fixed set of
commands gives byte-identical outputs with the code of each.

- Line counts: every ``.py`` file below ``linker/`` at each revision, read from git (`git ls-tree`, `git show`),
  never from the working tree; a package is a folder below ``linker/`` or a module beside them, so ``service.py``
  and ``service/`` are one row.
- Outputs: the old revision is checked out in a git worktree (``--before-tree``, made when missing), and every
  command runs as ``python -m linker ...`` with its working folder inside the tree, so that the tree's own ``linker``
  package is imported (checked: each side prints ``linker.__file__`` first). The commands build a MedDRA dictionary
  and a tf-idf index from tests/fixtures, then link, normalise (each format), annotate (each format), evaluate and
  answer a fixed set of service requests (the app's test client). Both sides run in the same scratch folder, one
  after the other, so that the paths the outputs hold are the same. The tagger is the before tree's shipped
  ``linker-ae`` on both sides (the shipped tagger itself was retrained since, issue 47); stderr (timings) is kept
  but not compared.

Usage: python -m bench.house [--before 26631c9] [--after HEAD] [--before-tree /tmp/house-before] [--workdir DIR]
Writes eval/house/report.md and eval/house/report.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.report import REPO, Report, table

BEFORE = "26631c9"  # b47ee6f^: the tree before issue 46's restructuring began
FIXTURES = REPO / "tests" / "fixtures"
CASE = ("The patient developed a severe headache and nausea after starting the drug. No herpes zoster was seen.\n"
        "She stopped the drug because of feeling sick; the head pain went away.\n")
EVAL_ROWS = "10019211\tsevere headache\n10028813\tfeeling sick\n10019974\tshingles\n10019211\tcephalgia\n"

# name -> the arguments of `python -m linker`; {run} the scratch folder of the side, {fx} tests/fixtures,
# {model} the tagger. Each writes below {run}/out/<name> or prints to stdout (kept as stdout.txt).
COMMANDS: dict[str, list[str]] = {
    "dict build": ["dict", "build", "--source", "meddra", "{fx}/meddra/MedDRA_26_1_English",
                   "--out", "{run}/out/dict build/dict.parquet"],
    "index build (tfidf)": ["index", "build", "--dict", "{run}/out/dict build/dict.parquet", "--kind", "tfidf",
                            "--out", "{run}/out/index build (tfidf)/index"],
    "link --json": ["link", "--index", "{index}", "--k", "3", "--json", "head pain", "feeling sick", "shingles"],
    "link --input jsonl": ["link", "--index", "{index}", "--k", "2", "--input", "{fx}/normalize/spans.jsonl",
                           "--output", "{run}/out/link --input jsonl/linked.jsonl"],
    "normalize jsonl": ["normalize", "--index", "{index}", "--format", "jsonl", "--k", "2",
                        "--input", "{fx}/normalize/spans.jsonl", "--output", "{run}/out/normalize jsonl/spans.jsonl"],
    "normalize brat": ["normalize", "--index", "{index}", "--format", "brat", "--input", "{fx}/normalize/brat",
                       "--output", "{run}/out/normalize brat/brat"],
    "normalize ade-xml": ["normalize", "--index", "{index}", "--format", "ade-xml", "--input", "{fx}/normalize/xml",
                          "--output", "{run}/out/normalize ade-xml/xml"],
    **{f"annotate {fmt}": ["annotate", "--index", "{index}", "--model", "{model}", "--input", "{run}/case.txt",
                           "--format", fmt, "--output", f"{{run}}/out/annotate {fmt}/{name}"]
       for fmt, name in (("jsonl", "spans.jsonl"), ("brat", "brat"), ("ade-xml", "xml"))},
    "annotate labels": ["annotate", "--index", "{index}", "--model", "{model}", "--input", "{run}/case.txt",
                        "--format", "labels", "--labels", "{run}/labels.txt",
                        "--output", "{run}/out/annotate labels/labels.tsv"],
    "eval": ["eval", "--index", "{index}", "--dataset", "tsv:{run}/eval.tsv"],
}

# The service's fixed requests: (file name, method, path, JSON body or raw bytes). The client runs in the tree's
# own interpreter (SERVICE_SCRIPT), each answer saved as <name>.txt: its status line, then its body.
REQUESTS = [
    ("health", "GET", "/health", None),
    ("indexes", "GET", "/indexes", None),
    ("link", "POST", "/link", {"mentions": [{"text": "head pain", "id": 1}, {"text": "Feeling sick"},
                                            {"text": "shingles", "lang": "en", "id": "z"}], "k": 3}),
    ("link-k1", "POST", "/link", {"mentions": [{"text": "cephalgia"}]}),
    ("link-bad-lang", "POST", "/link", {"mentions": [{"text": "nausea", "lang": "xx"}]}),
    ("link-empty", "POST", "/link", {"mentions": []}),
    ("link-blank", "POST", "/link", {"mentions": [{"text": "  "}]}),
    ("link-bad-json", "POST", "/link", "{not json"),
    ("link-extra-field", "POST", "/link", {"mentions": [{"text": "nausea"}], "x": 1}),
    ("not-found", "GET", "/nope", None),
    ("annotate", "POST", "/annotate", {"texts": [{"text": CASE, "id": "c1"}]}),
]
SERVICE_SCRIPT = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from linker.extract import load_extractor
from linker.service import create_app
index, model, out, requests = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
app = create_app([index])
app.state.tagger._load = lambda: load_extractor(model)  # the same tagger on both sides (the module docstring)
out.mkdir(parents=True)
with TestClient(app) as client:
    for name, method, path, body in requests:
        options = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else \\
            {} if body is None else {"json": body}
        answer = client.request(method, path, **options)
        (out / f"{name}.txt").write_bytes(f"{answer.status_code}\\n".encode() + answer.content)
"""


# ----------------------------------------------------------------------------- line counts


def package_of(path: str) -> str | None:
    """The row a file of ``linker/`` counts in: ``linker/index/dense.py`` -> ``index``, ``linker/link.py`` ->
    ``link``, a module beside the packages -> its name; None for a file that is not Python or not below linker/."""
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != "linker" or not path.endswith(".py"):
        return None
    return parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")


def count_lines(data: bytes) -> int:
    """Lines of a file as `wc -l` counts them, plus a last line without its newline."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def lines_by_package(files: dict[str, bytes]) -> dict[str, tuple[int, int]]:
    """package -> (files, lines) over `files` (path -> contents)."""
    counts: Counter = Counter()
    modules: Counter = Counter()
    for path, data in files.items():
        package = package_of(path)
        if package is not None:
            counts[package] += count_lines(data)
            modules[package] += 1
    return {package: (modules[package], counts[package]) for package in sorted(counts)}


def tree_files(rev: str) -> dict[str, bytes]:
    """The .py files below linker/ at `rev`, read from git."""
    listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "linker/"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split("\n")
    return {path: subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True).stdout
            for path in listing if package_of(path) is not None}


def line_rows(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[list]:
    """One row per package of either side: files and lines before and after, and the change in lines."""
    rows = []
    for package in sorted(set(before) | set(after)):
        (bf, bl), (af, al) = before.get(package, (0, 0)), after.get(package, (0, 0))
        rows.append([package, bf, f"{bl:,}", af, f"{al:,}", f"{al - bl:+,}"])
    totals = [sum(v[i] for v in side.values()) for side in (before, after) for i in (0, 1)]
    rows.append(["**all**", totals[0], f"{totals[1]:,}", totals[2], f"{totals[3]:,}", f"{totals[3] - totals[1]:+,}"])
    return rows


# ----------------------------------------------------------------------------- the commands, run on each side


def json_differences(a: bytes, b: bytes, prefix: str = "") -> list[str]:
    """The dotted keys at which two JSON documents differ (a list index as a key), or ``["(not JSON)"]``."""
    try:
        left, right = json.loads(a), json.loads(b)
    except ValueError:
        return ["(not JSON)"]
    return _differences(left, right, prefix)


def _differences(left, right, prefix: str) -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        keys = list(dict.fromkeys([*left, *right]))
        return [d for key in keys for d in _differences(left.get(key), right.get(key), f"{prefix}{key}.")]
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [d for i, (x, y) in enumerate(zip(left, right)) for d in _differences(x, y, f"{prefix}{i}.")]
    return [] if left == right else [prefix.rstrip(".") or "(whole)"]


# What changes from one run to the next whatever the code: when a file was built (a dictionary's and an index's
# `built_at`, in the Parquet metadata, the manifest and the index version that /indexes and /link answer with, with
# the digest that follows it), how long a build took (`build_seconds`), the writing process's id (the `.linker-output`
# marker), the checksums a manifest
# keeps of files that hold `built_at` (each of those files is compared on its own), and the seconds a command prints.
RUN_FIELDS = [
    (re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?(?::[0-9a-f]{12})?"), b"<time>"),
    (re.compile(rb'("pid": ?)\d+'), rb"\1<pid>"),
    (re.compile(rb'("build_seconds": ?)[0-9.e+-]+'), rb"\1<seconds>"),
    (re.compile(rb'("sha256": ?)"[0-9a-f]{64}"'), rb'\1"<sha256>"'),
]
SECONDS = (re.compile(rb"\b\d+(?:\.\d+)?s\b"), b"<seconds>")


def mask_run_fields(path: str, data: bytes) -> bytes:
    """`data` with the fields that differ from run to run masked (`RUN_FIELDS`; the seconds in printed output)."""
    for pattern, mask in [*RUN_FIELDS, *([SECONDS] if path.endswith("stdout.txt") else [])]:
        data = pattern.sub(mask, data)
    return data


def prepare(run: Path) -> None:
    """The inputs the commands read besides tests/fixtures: a case report, a label list, an eval set."""
    run.mkdir(parents=True)
    (run / "out").mkdir()
    (run / "case.txt").write_text(CASE, encoding="utf-8")
    (run / "labels.txt").write_text("10019211\n10028813\n10019974\n", encoding="utf-8")
    (run / "eval.tsv").write_text(EVAL_ROWS, encoding="utf-8")


def run_side(tree: Path, run: Path, model: Path) -> dict:
    """Every command and the service's requests with the code of `tree`, in `run`; per command its exit code."""
    python = sys.executable
    imported = subprocess.run([python, "-c", "import linker; print(linker.__file__)"], cwd=tree, check=True,
                              capture_output=True, text=True).stdout.strip()
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: imports linker from {imported}, not from the tree")
    prepare(run)
    values = {"run": str(run), "fx": str(FIXTURES), "model": str(model),
              "index": str(run / "out" / "index build (tfidf)" / "index")}
    codes = {}
    for name, args in COMMANDS.items():
        folder = run / "out" / name
        folder.mkdir(exist_ok=True)
        done = subprocess.run([python, "-m", "linker", "-q", *(a.format(**values) for a in args)], cwd=tree,
                              capture_output=True)
        (folder / "stdout.txt").write_bytes(done.stdout)
        (run / f"{name}.stderr").write_bytes(done.stderr)
        codes[name] = done.returncode
    done = subprocess.run([python, "-c", SERVICE_SCRIPT, values["index"], str(model), str(run / "out" / "service"),
                           json.dumps(REQUESTS)], cwd=tree, capture_output=True)
    (run / "service.stderr").write_bytes(done.stderr)
    codes["service"] = done.returncode
    return {"linker": Path(imported).resolve().relative_to(tree.resolve()).as_posix(), "exit codes": codes}


def compare(before: Path, after: Path) -> dict[str, dict]:
    """Per command (a folder of out/): the files only one side wrote, the byte-identical ones, those identical but
    for run fields (`mask_run_fields`), and the differing ones (with the JSON keys that differ, for JSON bodies)."""
    out = {}
    for command in [*COMMANDS, "service"]:
        left, right = _files(before / "out" / command), _files(after / "out" / command)
        same, run_fields, differ = [], [], {}
        for path in sorted(set(left) & set(right)):
            if left[path] == right[path]:
                same.append(path)
            elif mask_run_fields(path, left[path]) == mask_run_fields(path, right[path]):
                run_fields.append(path)
            else:
                differ[path] = _json_keys(path, left[path], right[path])
        out[command] = {"identical": same, "identical but for run fields": run_fields, "different": differ,
                        "before only": sorted(set(left) - set(right)), "after only": sorted(set(right) - set(left))}
    return out


def _json_keys(path: str, left: bytes, right: bytes) -> list[str]:
    """The JSON keys at which two outputs differ, run fields masked: a .json file, a service answer (status line,
    then JSON), a JSONL file line by line (the line number the first key)."""
    left, right = mask_run_fields(path, left), mask_run_fields(path, right)
    if path.endswith(".json"):
        return json_differences(left, right)[:12]
    if path.startswith(("health", "indexes", "link", "not-found", "annotate")) and path.endswith(".txt"):
        return json_differences(left.partition(b"\n")[2], right.partition(b"\n")[2])[:12]
    if path.endswith(".jsonl"):
        a, b = left.splitlines(), right.splitlines()
        if len(a) != len(b):
            return [f"lines ({len(a)} before, {len(b)} after)"]
        return [k for i, (x, y) in enumerate(zip(a, b)) for k in json_differences(x, y, f"line {i + 1}: ")][:12]
    return []


def _files(folder: Path) -> dict[str, bytes]:
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- the report


def verdict(entry: dict) -> str:
    """byte-identical, identical but for run fields, different, or no output (on either side)."""
    if entry["different"] or entry["before only"] or entry["after only"]:
        return "different"
    if entry["identical but for run fields"]:
        return "identical but for run fields"
    return "byte-identical" if entry["identical"] else "no output"


def output_lines(compared: dict[str, dict], codes: dict[str, dict]) -> list[str]:
    rows = []
    for command, entry in compared.items():
        exits = f"{codes['before'][command]} / {codes['after'][command]}"
        detail = "; ".join([*(f"{p}: {', '.join(k) or 'bytes'}" for p, k in entry["different"].items()),
                            *(f"before only: {p}" for p in entry["before only"]),
                            *(f"after only: {p}" for p in entry["after only"]),
                            *(f"run fields: {p}" for p in entry["identical but for run fields"])])
        rows.append([f"`{command}`", exits, verdict(entry), len(entry["identical"]), detail or "-"])
    return table(["command", "exit before / after", "outputs", "byte-identical files", "what differs"], rows,
                 "lrlr")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--before-tree", type=Path, default=Path(tempfile.gettempdir()) / "house-before")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=REPO / "eval" / "house")
    parser.add_argument("--reuse", type=Path, default=None,
                        help="a scratch folder of an earlier run (its before/ and after/): compare and report only")
    args = parser.parse_args(argv)
    report = Report("report", out=args.out, title="Issue 46: the house before and after")
    revs = {side: _short(rev) for side, rev in (("before", args.before), ("after", args.after))}
    counts = {side: lines_by_package(tree_files(rev)) for side, rev in revs.items()}
    work, sides = run_both(args)
    compared = compare(work / "before", work / "after")
    codes = {side: info["exit codes"] for side, info in sides.items()}
    result = {"revisions": revs, "lines": counts, "imported": {s: i["linker"] for s, i in sides.items()},
              "exit codes": codes, "outputs": compared, "workdir": str(work)}
    lines = ["", f"Before: {revs['before']} (b47ee6f^, before the restructuring began). After: {revs['after']}.", "",
             "## Lines of Python per package of linker/", "",
             *table(["package", "files before", "lines before", "files after", "lines after", "change"],
                    line_rows(counts["before"], counts["after"]), "lrrrrr"),
             "", "## Outputs of a fixed command set, old code and current code", "",
             "Each side imported `linker` from the tree it ran in (checked before its first command). Commands are "
             "`python -m linker ARGS` (the table names them; `bench/house.py`'s COMMANDS and REQUESTS hold the "
             "arguments).", "", *output_lines(compared, codes), "", *NOTES]
    report.write(result, lines, scratch=work)


def _short(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", rev], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()


def run_both(args: argparse.Namespace) -> tuple[Path, dict[str, dict]]:
    """The scratch folder holding before/ and after/ (each side's outputs), and each side's `run_side` record; with
    `args.reuse`, those of an earlier run."""
    if not args.before_tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(args.before_tree), args.before], cwd=REPO, check=True)
    model = args.before_tree / "linker" / "models" / "linker-ae"
    work = args.reuse or Path(tempfile.mkdtemp(prefix="house-", dir=args.workdir))
    sides = {}
    for side, tree in (("before", args.before_tree), ("after", REPO)):
        if args.reuse is None:
            record = run_side(tree, work / "run", model)
            (work / "run").rename(work / side)  # the next side runs at the same paths
            (work / f"{side}.json").write_text(json.dumps(record), encoding="utf-8")
        sides[side] = json.loads((work / f"{side}.json").read_text(encoding="utf-8"))
    return work, sides


# Why an output differs where it does, by the change that made it differ (read from the commits between the two
# revisions; a new difference not explained here is a regression to look at).
NOTES = [
    "## Why outputs differ",
    "",
    "- *Run fields* (`identical but for run fields`): a dictionary's and an index's `built_at` (in the Parquet "
    "metadata, the manifest, and the index version `/link` and `/indexes` answer with), an index's `build_seconds`, "
    "the checksums the manifest "
    "keeps of the files that hold it, the process id in the `.linker-output` marker and the seconds a command "
    "prints. They differ between any two runs of the same code; every other byte of those files is equal.",
    "- `annotate` (jsonl, brat, ade-xml) and the service's `/annotate`: the same tagger release on both sides, but "
    "the extraction changed since the before revision, as documented by its commits: issue 47 (6b41665) gives the "
    "tagger the index's names as evidence and returns one span per name in a phrase of several (`a severe headache "
    "and nausea` becomes `headache` and `nausea`, each with the phrase as its `group`), and issue 49 (bd393a1) "
    "renamed the decision `coded` to `auto` and decides `review` where the index has no calibration (this fixture's "
    "has none). The codes found agree (Headache and Nausea on both sides). Those commits came after the restructuring "
    "(87aac74), so this pair of revisions cannot show annotate unchanged by it; the tests that compare its answers "
    "(tests/test_service.py, tests/test_extract_cli.py) hold that.",
    "- `annotate labels`: the `labels` format is new (issue 48, 6b41665); the before revision refuses `--labels`.",
    "- Lines: the after revision holds features beside the restructuring (issues 47, 48 and 49: the Indication head "
    "and lexicon evidence in `extract`, document labels in `formats`, decisions and margins in `confidence`), so "
    "the change per package is not the restructuring's alone. `models` lost the training pipeline to `train` "
    "(`train/release.py`), `eval/datasets.py` became `datasets`, and `folders` and `batching` are the base helpers "
    "moved down.",
]


if __name__ == "__main__":
    main()
