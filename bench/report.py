"""One report writer for every benchmark and study: NAME.md and NAME.json side by side (NAME.png optional).

    report = Report("bench_dense", out=Path("eval/bench"), title="Dense index benchmark")
    ...                                   # the work; report.meta holds the header fields taken at the start
    report.write(result, lines, chart=draw)   # draw(path) makes the png (the plots extra), or None

Every report carries the same header: the command that wrote it, the date, the CPU count, the load average
before and after, the git commit (``-dirty`` with uncommitted changes). Paths are written relative to the
repository or to ../shared (`linker.fileio.portable_paths`), never as this machine's absolute paths.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import data
from linker.eval.charts import write_chart
from linker.fileio import atomic_file, portable_paths

REPO = data.REPO


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def add_note_options(parser, help_text: str) -> None:
    """--note TEXT or --note-file PATH: a paragraph a report prints above its table. A long one goes in a file, so
    that the header's command line (`command`) stays short."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--note", default="", help=help_text)
    group.add_argument("--note-file", type=Path, default=None, help="the same paragraph, read from a UTF-8 file")


def note_of(args) -> str:
    """The paragraph `add_note_options` took: --note's text, or --note-file's (a missing file: one line, exit 1)."""
    if args.note_file is None:
        return args.note
    try:
        return args.note_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"{args.note_file}: --note-file: expected a readable UTF-8 text file, found "
                         f"{type(exc).__name__}") from None


def command() -> str:
    """How this run was started, as a user would type it (`python -m bench.link --part ...`)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None and spec.name else f"python {Path(sys.argv[0]).name}"
    return " ".join([program, *map(shlex.quote, sys.argv[1:])])


def portable(text: str, scratch: Path | None = None) -> str:
    return portable_paths(text, root=REPO, data=data.root(), scratch=scratch)


class Report:
    """The header fields are taken when it is created (before the work), the load again when it is written."""

    def __init__(self, name: str, *, out: Path, title: str) -> None:
        self.name, self.out, self.title = name, Path(out), title
        self.meta = {"command": command(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "cpus": os.cpu_count(), "load_before": load(), "commit": git_commit()}

    @property
    def paths(self) -> dict[str, Path]:
        return {ext: self.out / f"{self.name}.{ext}" for ext in ("md", "json", "png")}

    def header(self) -> str:
        m = self.meta
        return (f"Produced by `{m['command']}` on {m['date'][:10]} at commit {m['commit']}; {m['cpus']} CPU cores "
                f"shared with other jobs, load average (1, 5, 15 min) {tuple(m['load_before'])} before, "
                f"{tuple(m.get('load_after', load()))} after: compare rows of one run.")

    def write(self, result: dict, lines: Sequence[str], *, chart: Callable[[Path], None] | None = None,
              scratch: Path | None = None) -> list[Path]:
        """NAME.json (the header fields and `result`), NAME.md (title, header line, `lines`), NAME.png when
        `chart` draws one (left out with a warning when it cannot); paths under `scratch` (a temporary folder)
        are written as <scratch>/..."""
        self.meta["load_after"] = load()
        self.out.mkdir(parents=True, exist_ok=True)
        paths = self.paths
        with atomic_file(paths["json"]) as tmp:
            payload = json.dumps({**self.meta, **result}, ensure_ascii=False, indent=2, default=str)
            tmp.write_text(portable(payload, scratch) + "\n", encoding="utf-8")
        with atomic_file(paths["md"]) as tmp:
            text = "\n".join([f"# {self.title}", "", self.header(), "", *lines]).rstrip() + "\n"
            tmp.write_text(portable(text, scratch), encoding="utf-8")
        written = [paths["md"], paths["json"]]
        if chart is not None and write_chart(paths["png"], chart, overwrite=True, tables=str(paths["md"])):
            written.append(paths["png"])
        print("report: " + ", ".join(portable(str(p.resolve())) for p in written), file=sys.stderr)
        return written


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> list[str]:
    """A markdown table; `align` per column: '' left, 'r' right."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(header))]
    return ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(marks) + "|",
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]
