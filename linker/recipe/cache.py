"""Content digests of a recipe's inputs, stage keys, and the ledger of test evaluations.

A stage's key is the sha256 of its configuration (with the content digest of every file it reads) and of
the keys of the stages it reads from, so that a stage reruns exactly when something it depends on changed.
Files are hashed by content; `Digests` remembers (path, size, mtime_ns) -> sha256 so that a re-run does
not read gigabytes again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import stat
from pathlib import Path

from linker.fileio import atomic_file

RECIPE_FORMAT = 1  # bump when what a stage computes from the same key changes (every key changes with it)
CHUNK = 1 << 20


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def stage_key(stage: str, config: dict, upstream: dict[str, str]) -> str:
    payload = {"format": RECIPE_FORMAT, "stage": stage, "config": config, "upstream": upstream}
    return hashlib.sha256(canonical(payload).encode("utf-8")).hexdigest()


class Digests:
    """sha256 of files (and of folders: their files' relative paths and digests), memoised by
    (path, size, mtime_ns) in a small JSON file."""

    def __init__(self, memo: Path | None = None) -> None:
        self.memo_path = memo
        self.memo: dict[str, list] = {}
        self.changed = False
        if memo is not None and memo.is_file():
            try:
                loaded = json.loads(memo.read_text(encoding="utf-8"))
                self.memo = loaded if isinstance(loaded, dict) else {}
            except (ValueError, OSError):
                self.memo = {}

    def file(self, path: Path) -> str:
        stat = path.stat()
        key = os.path.abspath(path)
        seen = self.memo.get(key)
        if isinstance(seen, list) and len(seen) == 3 and seen[:2] == [stat.st_size, stat.st_mtime_ns]:
            return seen[2]
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(CHUNK):
                digest.update(block)
        value = digest.hexdigest()
        self.memo[key] = [stat.st_size, stat.st_mtime_ns, value]
        self.changed = True
        return value

    def folder(self, path: Path) -> str:
        digest = hashlib.sha256()
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(files):
                if name.startswith("."):  # markers, temporaries
                    continue
                file = Path(root) / name
                digest.update(f"{file.relative_to(path).as_posix()}\0{self.file(file)}\n".encode("utf-8"))
        return digest.hexdigest()

    def path(self, path: Path) -> str:
        return self.folder(path) if Path(path).is_dir() else self.file(Path(path))

    def save(self) -> None:
        if self.memo_path is None or not self.changed or not self.memo_path.parent.is_dir():
            return
        with atomic_file(self.memo_path) as tmp:
            tmp.write_text(json.dumps(self.memo), encoding="utf-8")
        self.changed = False


def stage_files(folder: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative path -> sha256 of every file in a finished stage folder, read in full every time (a digest
    memoised by size and mtime would miss an edit that keeps both); a symbolic link is recorded by its target,
    so a link put in later is a difference too. `skip`: top-level names that are not the stage's content."""
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in [*sorted(files), *(d for d in dirs if os.path.islink(os.path.join(root, d)))]:
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative in skip:
                continue
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                out[relative] = "symlink:" + os.readlink(path)
            elif stat.S_ISREG(mode):
                with open(path, "rb") as handle:
                    out[relative] = hashlib.file_digest(handle, "sha256").hexdigest()
            else:  # a pipe or device put there: never opened (reading a pipe would wait forever)
                out[relative] = f"special:{stat.S_IFMT(mode):o}"
    return out


class Ledger:
    """How often each test set was evaluated into this output folder, across runs (`test_ledger.json`).

    A test set is identified by the content of its files, so a renamed copy counts as the same set; an
    evaluation that was cached (not run again) is not counted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = {"format": 1, "test_sets": {}}
        if path.is_file():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict) and isinstance(loaded.get("test_sets"), dict):
                self.data = loaded

    def count(self, digest: str) -> int:
        return int(self.data["test_sets"].get(digest, {}).get("evaluations", 0))

    def counts(self) -> dict[str, int]:
        return {entry["name"]: entry["evaluations"] for entry in self.data["test_sets"].values()}

    def record(self, *, name: str, spec: str, digest: str, stage_key: str, summary: dict) -> int:
        entry = self.data["test_sets"].setdefault(digest, {"name": name, "spec": spec, "evaluations": 0,
                                                           "history": []})
        entry.update(name=name, spec=spec)
        entry["evaluations"] += 1
        entry["history"].append({"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                 "evaluate_key": stage_key[:12], **summary})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.path) as tmp:
            tmp.write_text(json.dumps(self.data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return entry["evaluations"]
