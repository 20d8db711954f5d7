"""Fault injection for the CLI and its files: no input is ever lost, every failure is one line, leftovers go.

Each case is what a hostile or careless user can do: point an output at an input, replace a file
without asking, hand over a folder for a file, a corrupted index whose checksums were updated, a
non-UTF-8 path, an unreadable file (run as another user: root ignores permissions), or kill the
process in the middle of a write.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, assert_one_line_error, cli
from linker.dictionary import SourceSpec, build_dictionary
from linker.errors import ConfigError, InputFormatError
from linker.fileio import MARKER, atomic_dir, atomic_file, check_output, remove_stale_temporaries
from linker.folders import sha256_file
from linker.index import build_index, load_index

FIX = Path(__file__).parent / "fixtures"
NAMES = FIX / "tsv" / "names.tsv"
BRAT = FIX / "normalize" / "brat"


def digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of `path`), by relative name: 'intact' means equal digests."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rel")
    build_dictionary([SourceSpec("tsv", (NAMES,))], folder / "names.parquet")
    build_index(folder / "names.parquet", kind="tfidf", out=folder / "idx")
    return folder / "idx"


def spans(path: Path, *texts: str) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- outputs never destroy inputs


def test_brat_output_onto_its_own_txt_is_refused(index_dir, tmp_path, capsys):
    """The issue's case: `--input d/doc1.ann --output d/doc1.txt` replaced the document text."""
    shutil.copytree(BRAT, tmp_path / "d")
    before = digest(tmp_path / "d")
    code, err = cli(["normalize", "--index", index_dir, "--format", "brat", "--input", tmp_path / "d" / "doc1.ann",
                     "--output", tmp_path / "d" / "doc1.txt"], capsys)
    assert_one_line_error(code, err, "doc1.txt is the input", "d/doc1.txt")
    assert digest(tmp_path / "d") == before


def test_overwrite_never_deletes_a_folder_holding_the_input(index_dir, tmp_path, capsys):
    """The issue's case: `--overwrite` with an output folder that contains the input folder deleted both."""
    shutil.copytree(BRAT, tmp_path / "out" / "in")
    (tmp_path / "out" / "unrelated.txt").write_text("keep")
    before = digest(tmp_path / "out")
    code, err = cli(["normalize", "--index", index_dir, "--format", "brat", "--input", tmp_path / "out" / "in",
                     "--output", tmp_path / "out", "--overwrite"], capsys)
    assert_one_line_error(code, err, "contains the input")
    assert digest(tmp_path / "out") == before


@pytest.mark.parametrize("how", ["same", "symlink", "inside"])
def test_output_equal_to_linked_to_or_inside_an_input_is_refused(index_dir, tmp_path, capsys, how):
    src = spans(tmp_path / "a.jsonl", "hair loss")
    if how == "same":
        args, out = ["--input", src], src
    elif how == "symlink":
        (tmp_path / "link.jsonl").symlink_to(src)
        args, out = ["--input", src], tmp_path / "link.jsonl"
    else:
        shutil.copytree(BRAT, tmp_path / "docs")
        args, out = ["--input", tmp_path / "docs", "--format", "brat"], tmp_path / "docs" / "normalised"
    before = digest(tmp_path)
    code, err = cli(["normalize", "--index", index_dir, "--format", "jsonl", *args, "--output", out, "--overwrite"],
                    capsys)
    assert_one_line_error(code, err, "is the input" if how != "inside" else "lies inside the input")
    assert digest(tmp_path) == before


def test_existing_output_file_replaced_only_with_overwrite(index_dir, tmp_path, capsys):
    src, out = spans(tmp_path / "in.jsonl", "hair loss"), tmp_path / "out.jsonl"
    out.write_text("my notes\n")
    code, err = cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", src, "--output", out], capsys)
    assert_one_line_error(code, err, "out.jsonl exists; pass --overwrite")
    assert out.read_text() == "my notes\n"
    code, _ = cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", src, "--output", out,
                   "--overwrite"], capsys)
    assert code == 0 and json.loads(out.read_text())["candidates"][0]["concept_id"] == "C0002170"


def test_every_writing_command_asks_before_replacing(index_dir, tmp_path, capsys):
    table = tmp_path / "t.parquet"
    assert cli(["dict", "build", "--source", "tsv", NAMES, "--out", table], capsys)[0] == 0
    assert_one_line_error(*cli(["dict", "build", "--source", "tsv", NAMES, "--out", table], capsys), "--overwrite")
    assert_one_line_error(*cli(["dict", "merge", table, "--out", table, "--overwrite"], capsys), "is the input")
    assert_one_line_error(*cli(["dict", "build", "--source", "tsv", NAMES, "--out", NAMES, "--overwrite"], capsys),
                          "is the input")
    assert cli(["index", "build", "--dict", table, "--out", tmp_path / "idx"], capsys)[0] == 0
    assert_one_line_error(*cli(["index", "build", "--dict", table, "--out", tmp_path / "idx"], capsys), "--overwrite")
    assert cli(["index", "build", "--dict", table, "--out", tmp_path / "idx", "--overwrite"], capsys)[0] == 0
    assert_one_line_error(*cli(["index", "build", "--dict", tmp_path / "idx" / "concepts.parquet", "--out",
                                tmp_path / "idx", "--overwrite"], capsys), "contains the input")
    query = tmp_path / "q.query"
    query.write_text("C0002170||hair loss\n")
    report = ["eval", "--index", tmp_path / "idx", "--dataset", f"query:{query}", "--report", tmp_path / "r"]
    assert cli(report, capsys)[0] == 0
    assert_one_line_error(*cli(report, capsys), "r.json exists; pass --overwrite")
    assert cli([*report, "--overwrite"], capsys)[0] == 0
    # a folder that linker did not write is never replaced, --overwrite or not
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("x")
    assert_one_line_error(*cli(["index", "build", "--dict", table, "--out", tmp_path / "mine", "--overwrite"], capsys),
                          "linker did not write")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "x"


def test_eval_report_named_like_an_input_is_refused(index_dir, tmp_path, capsys):
    data = tmp_path / "set.json"
    data.write_text("C0002170\thair loss\n")  # a tsv dataset whose name ends in .json
    code, err = cli(["eval", "--index", index_dir, "--dataset", f"tsv:{data}", "--report", tmp_path / "set",
                     "--overwrite"], capsys)
    assert_one_line_error(code, err, "set.json is the input")
    assert data.read_text() == "C0002170\thair loss\n"


# ----------------------------------------------------------------------------- one-line errors


def test_folder_where_a_file_is_expected(index_dir, tmp_path, capsys):
    (tmp_path / "folder.parquet").mkdir()
    assert_one_line_error(*cli(["index", "build", "--dict", tmp_path / "folder.parquet", "--out", tmp_path / "i"], capsys),
                          "folder.parquet")
    src = spans(tmp_path / "in.jsonl", "hair loss")
    (tmp_path / "outdir").mkdir()
    assert_one_line_error(*cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", src, "--output",
                                tmp_path / "outdir", "--overwrite"], capsys), "is a folder, expected a file")
    assert_one_line_error(*cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", tmp_path / "outdir",
                                "--output", tmp_path / "o.jsonl"], capsys), "expected a file, found a folder")
    assert_one_line_error(*cli(["dict", "build", "--source", "tsv", NAMES, "--out", tmp_path / "outdir", "--overwrite"],
                               capsys), "is a folder, expected a file")
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(*cli(["dict", "build", "--source", "tsv", NAMES, "--out", tmp_path / "afile" / "t.parquet"],
                               capsys), "afile is a file, expected a folder")


def test_empty_vocabulary(tmp_path, capsys):
    import pyarrow.parquet as pq

    from linker.dictionary import read_concept_table

    table = read_concept_table(build_dictionary([SourceSpec("tsv", (NAMES,))], tmp_path / "t.parquet").out).table
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    assert_one_line_error(*cli(["index", "build", "--dict", tmp_path / "empty.parquet", "--out", tmp_path / "i"], capsys),
                          "empty.parquet: expected a concept table with at least one name, found 0 rows")
    assert not (tmp_path / "i").exists()


def test_non_utf8_bytes_in_a_path(index_dir, tmp_path, capsys):
    name = os.fsdecode(b"bad\xff.jsonl")
    code, err = cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", spans(tmp_path / "in.jsonl", "x"),
                     "--output", str(tmp_path / name)], capsys)
    assert_one_line_error(code, err, "expected UTF-8 text", "\\xff")
    assert not any(p.name.startswith("bad") for p in tmp_path.iterdir())


def _copy_index(index_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "idx"
    shutil.copytree(index_dir, folder)
    return folder


def _rewrite_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.pop("counts"), "field 'counts' as an object, found no such field"),
    (lambda m: m["counts"].update(names="12"), "field 'counts.names' as an integer, found str '12'"),
    (lambda m: m.update(files=[]), "field 'files' as an object, found list"),
    (lambda m: m["files"].update({"../../etc/passwd": {"size": 1, "sha256": "x"}}), "no absolute or '..' paths"),
    (lambda m: m["files"].update({"/etc/passwd": {"size": 1, "sha256": "x"}}), "no absolute or '..' paths"),
    (lambda m: m["files"]["concepts.parquet"].update(size="big"), "field 'files.concepts.parquet'"),
])
def test_manifest_missing_mistyped_or_escaping_fields(index_dir, tmp_path, capsys, change, message):
    folder = _copy_index(index_dir, tmp_path)
    _rewrite_manifest(folder, change)
    for command in (["index", "info", folder], ["link", "--index", folder, "hair loss"]):
        assert_one_line_error(*cli(command, capsys), "manifest.json: expected", message)


@pytest.mark.parametrize("victim", ["concepts.parquet", "tfidf/idf.npy", "tfidf/names.npz", "tfidf/vocabulary.json"])
def test_index_file_altered_with_a_matching_checksum(index_dir, tmp_path, capsys, victim):
    """Checksums only catch accidents; a file rewritten along with its checksum reaches the native reader."""
    folder = _copy_index(index_dir, tmp_path)
    path = folder / victim
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\x00garbage\xff" * 8
    path.write_bytes(bytes(raw[: max(16, len(raw) * 2 // 3)]))
    _rewrite_manifest(folder, lambda m: m["files"][victim].update(size=path.stat().st_size, sha256=sha256_file(path)))
    code, err = cli(["link", "--index", folder, "hair loss"], capsys)
    assert_one_line_error(code, err, victim)


@pytest.mark.slow
def test_dense_files_altered_with_a_matching_checksum(tmp_path, capsys):
    from conftest import make_tiny_encoder
    from linker.index.dense import DenseConfig

    encoder = make_tiny_encoder(tmp_path / "enc")
    build_dictionary([SourceSpec("tsv", (NAMES,))], tmp_path / "t.parquet")
    build_index(tmp_path / "t.parquet", kind="dense", out=tmp_path / "good",
                config=DenseConfig(encoder=str(encoder), faiss_kind="hnsw"))
    files = json.loads((tmp_path / "good" / "dense" / "params.json").read_text())["files"]
    for victim in (files["embeddings"], files["faiss"]):
        folder = tmp_path / victim.replace("/", "_")
        shutil.copytree(tmp_path / "good", folder)
        path = folder / victim
        assert path.is_file(), sorted(p.name for p in (folder / "dense").iterdir())
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        _rewrite_manifest(folder, lambda m, p=path, v=victim: m["files"][v].update(size=p.stat().st_size,
                                                                                   sha256=sha256_file(p)))
        assert_one_line_error(*cli(["link", "--index", folder, "hair loss"], capsys), victim)


def test_safetensors_checkpoint_altered(tmp_path):
    from linker.train.common import checkpoint_dir, load_checkpoint

    folder = checkpoint_dir(tmp_path / "model")
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    (folder / "optimizer.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    (folder / "optimizer_groups.json").write_text("[]")
    with pytest.raises(InputFormatError, match=r"optimizer.safetensors: expected a safetensors file"):
        load_checkpoint(tmp_path / "model")


# ----------------------------------------------------------------------------- hostile files through the CLI

HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["\ufdfa" * 50, "\u3300" * 100, "ﬃ" * 200, "e\u0301" * 100]),  # NFKC expands these up to 18x
    st.just("x" * 3000),  # longer than the test's line cap below
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(HOSTILE_TEXT, min_size=1, max_size=4), depth=st.integers(0, 80), surrogate=st.booleans())
def test_hostile_jsonl_is_linked_or_refused_in_one_line(index_dir, tmp_path, capsys, texts, depth, surrogate):
    """Any mix of hostile lines: exit 0 with one valid UTF-8 output line per span, or exit 1, one line, nothing written."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    out.unlink(missing_ok=True)
    lines = [json.dumps({"text": t, "meta": json.loads("[" * depth + "]" * depth) if depth else None}) for t in texts]
    if surrogate:
        lines.append('{"text": "bad \\udc80 text"}')
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, err = cli(["normalize", "--index", index_dir, "--format", "jsonl", "--input", src, "--output", out,
                     "--max-line-bytes", "2048"], capsys)
    if code == 0:
        written = out.read_bytes().decode("utf-8").split("\n")[:-1]  # JSONL breaks lines at \n only (not U+0085)
        assert len(written) == len([t for t in texts if t.strip()]) == len(texts)
        assert [json.loads(line)["text"] for line in written] == texts
    else:
        assert_one_line_error(code, err, "in.jsonl:")
        assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".linker-tmp-" in p.name]


@pytest.mark.slow
def test_a_50_mb_line_is_refused_without_reading_it_whole(index_dir, tmp_path):
    src = tmp_path / "huge.jsonl"
    with src.open("wb") as handle:
        handle.write(b'{"text": "')
        for _ in range(50):
            handle.write(b"a" * (1 << 20))
        handle.write(b'"}\n')
    run = subprocess.run([sys.executable, "-c", RSS_PROBE, "normalize", "--index", str(index_dir), "--format", "jsonl",
                          "--input", str(src), "--output", str(tmp_path / "o.jsonl")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 1 and "expected lines of at most 1,048,576 bytes" in run.stderr
    peak_mib = int(run.stdout.strip().splitlines()[-1])
    small = subprocess.run([sys.executable, "-c", RSS_PROBE, "normalize", "--index", str(index_dir), "--format", "jsonl",
                            "--input", str(spans(tmp_path / "small.jsonl", "hair loss")), "--output",
                            str(tmp_path / "o.jsonl")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    baseline_mib = int(small.stdout.strip().splitlines()[-1])
    assert peak_mib - baseline_mib < 30, (peak_mib, baseline_mib)  # the 50 MB line is never held


RSS_PROBE = """
import resource, sys
from linker.cli.main import main
try:
    main(sys.argv[1:])
finally:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
"""


# ----------------------------------------------------------------------------- leftovers of killed runs


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    dead = _dead_pid()
    stale_dir = tmp_path / f".idx.linker-tmp-{dead}-abc123"
    stale_dir.mkdir()
    (stale_dir / "half.npz").write_bytes(b"x")
    stale_file = tmp_path / f".out.jsonl.linker-tmp-{dead}-xyz"
    stale_file.write_text("half")
    live = tmp_path / f".other.linker-tmp-{os.getpid()}-keep"
    live.write_text("being written")
    lookalike = tmp_path / ".idx.tmp"  # not ours: never touched
    lookalike.write_text("x")
    with atomic_file(tmp_path / "new.txt") as tmp:
        tmp.write_text("ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, lookalike.name, "new.txt"])


def test_a_swap_interrupted_between_its_renames_is_restored(tmp_path):
    """atomic_dir moves the old folder aside, then the new one in: a kill between the two must not lose it."""
    with atomic_dir(tmp_path / "idx") as tmp:
        (tmp / "a").write_text("old")
    aside = tmp_path / f".idx.linker-tmp-{_dead_pid()}-swap"
    aside.mkdir()
    os.replace(tmp_path / "idx", aside / "old")
    assert remove_stale_temporaries(tmp_path) == [aside]
    assert (tmp_path / "idx" / "a").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def _big_names(path: Path, rows: int) -> Path:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    with path.open("w", encoding="utf-8") as handle:
        handle.write("concept_id\tname\tlang\n")
        for i in range(rows):
            handle.write(f"C{i % (rows // 3):07d}\t{''.join(rng.choice(letters, 14))} {i}\ten\n")
    return path


def _kill_at(command: list[str], delay: float) -> int | None:
    process = subprocess.Popen([sys.executable, "-m", "linker", *command], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    return process.wait()


def _timed_run(args: list[str]) -> float:
    """Wall seconds of one unkilled `python -m linker ARGS` run (it must succeed)."""
    start = time.perf_counter()
    assert subprocess.run([sys.executable, "-m", "linker", *args], cwd=ROOT).returncode == 0
    return time.perf_counter() - start


@pytest.mark.slow
def test_kill_9_during_index_build_and_normalize_leaves_previous_outputs(tmp_path):
    """kill -9 at random points: the previous index and normalised file stay intact, the next run cleans up."""
    table = tmp_path / "big.parquet"
    build_dictionary([SourceSpec("tsv", (_big_names(tmp_path / "big.tsv", 60_000),))], table)
    build = ["-q", "index", "build", "--dict", str(table), "--out", str(tmp_path / "idx")]
    src = spans(tmp_path / "in.jsonl", *[f"name {i} hair loss" for i in range(3000)])
    normalize = ["-q", "normalize", "--index", str(tmp_path / "idx"), "--format", "jsonl", "--input", str(src),
                 "--output", str(tmp_path / "out.jsonl")]
    # Kill points are fractions of an unkilled run's wall time, timed here: fixed delays land after the end
    # on a quiet machine and before the start under load.
    build_seconds, normalize_seconds = _timed_run(build), _timed_run(normalize)
    before, out_before = digest(tmp_path / "idx"), digest(tmp_path / "out.jsonl")
    rng = np.random.default_rng(7)
    killed = 0
    for fraction in rng.uniform(0.5, 0.95, size=4):
        code = _kill_at([*build, "--overwrite"], float(fraction * build_seconds))
        killed += code == -signal.SIGKILL
        assert digest(tmp_path / "idx") == before or load_index(tmp_path / "idx")  # old, or the finished new one
        code = _kill_at([*normalize, "--overwrite"], float(fraction * normalize_seconds))
        killed += code == -signal.SIGKILL
        assert digest(tmp_path / "out.jsonl") == out_before  # same input, same index: the same bytes either way
    assert killed >= 2  # most kills land in the middle of the work
    build_index(table, kind="tfidf", out=tmp_path / "idx", overwrite=True)  # the next run...
    assert not [p.name for p in tmp_path.iterdir() if ".linker-tmp-" in p.name]  # ...removed every leftover
    assert load_index(tmp_path / "idx").manifest["counts"]["names"] == 60_000


# ----------------------------------------------------------------------------- permissions (as another user)


def _as_other_user() -> list[str]:
    """Prefix that runs a command as an unprivileged user: root bypasses file permissions."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is absent: permissions cannot be tested")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def shared_tmp(index_dir):
    """A folder the unprivileged user can traverse (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="linker-perm-"))
    folder.chmod(0o777)
    shutil.copytree(index_dir, folder / "idx")
    for path in [folder / "idx", *(folder / "idx").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _run_as_other(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(cwd), "PYTHONPATH": str(ROOT)}
    return subprocess.run([*_as_other_user(), sys.executable, "-m", "linker", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_unreadable_input_and_read_only_output_folder(shared_tmp):
    src = spans(shared_tmp / "secret.jsonl", "hair loss")
    src.chmod(0o000)
    run = _run_as_other(["normalize", "--index", shared_tmp / "idx", "--format", "jsonl", "--input", src,
                         "--output", shared_tmp / "out" / "o.jsonl"], shared_tmp)
    if run.returncode == 0 and "Permission" not in run.stderr:
        pytest.skip("this user can read a mode-000 file: permissions are not enforced here")
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert "secret.jsonl" in run.stderr and "Permission denied" in run.stderr
    src.chmod(0o644)
    locked = shared_tmp / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    run = _run_as_other(["normalize", "--index", shared_tmp / "idx", "--format", "jsonl", "--input", src,
                         "--output", locked / "o.jsonl"], shared_tmp)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"no permission to write into {locked}" in run.stderr  # refused before the work, naming the folder
    assert list(locked.iterdir()) == []


def test_unreadable_index_file(shared_tmp):
    (shared_tmp / "idx" / "tfidf" / "names.npz").chmod(0o000)
    run = _run_as_other(["link", "--index", shared_tmp / "idx", "hair loss"], shared_tmp)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert "names.npz" in run.stderr


# ----------------------------------------------------------------------------- the guard itself


def test_check_output_rules(tmp_path):
    (tmp_path / "in").mkdir()
    check_output(tmp_path / "new", inputs=[tmp_path / "in"], folder=True)  # absent: fine
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", folder=True)  # empty folder: nothing to lose
    with atomic_dir(tmp_path / "ours") as tmp:
        (tmp / "x").write_text("1")
    assert (tmp_path / "ours" / MARKER).is_file()
    with pytest.raises(ConfigError, match="pass --overwrite"):
        check_output(tmp_path / "ours", folder=True)
    check_output(tmp_path / "ours", folder=True, overwrite=True)
    with pytest.raises(ConfigError, match="lies inside the input"):
        check_output(tmp_path / "in" / "deep" / "out.jsonl", inputs=[tmp_path / "in"])
    with pytest.raises(ConfigError, match="contains the input"):
        check_output(tmp_path, inputs=[tmp_path / "in"], folder=True, overwrite=True)
    (tmp_path / "in" / "f").write_text("x")
    with pytest.raises(ConfigError, match="linker did not write"), atomic_dir(tmp_path / "in"):
        pass
    assert (tmp_path / "in" / "f").read_text() == "x"


def test_normalize_checks_its_output_before_loading_the_index(tmp_path, capsys):
    src = spans(tmp_path / "a.jsonl", "hair loss")
    code, err = cli(["normalize", "--index", tmp_path / "no-such-index", "--format", "jsonl", "--input", src,
                     "--output", src], capsys)
    assert_one_line_error(code, err, "a.jsonl is the input")  # not "no such index folder": nothing was loaded


def test_cli_brat_lenient_skips_and_reports_mismatched_spans(index_dir, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "d.txt").write_text("Patient had severe headache and hair loss.\n")
    (docs / "d.ann").write_text("T1\tAE 32 41\thair loss\nT2\tAE 19 27\tmigraine\n")
    assert_one_line_error(*cli(["normalize", "--index", index_dir, "--format", "brat", "--input", docs,
                                "--output", tmp_path / "strict"], capsys), "d.ann:2: expected the span text")
    assert not (tmp_path / "strict").exists()
    code, err = cli(["normalize", "--index", index_dir, "--format", "brat", "--input", docs, "--output",
                     tmp_path / "lenient", "--lenient"], capsys)
    assert code == 0 and any(line.startswith("skipped ") and "d.ann:2" in line for line in err)
    written = (tmp_path / "lenient" / "d.ann").read_text().splitlines()
    assert [line.split("\t")[1].split(" ")[1] for line in written if line.startswith("N")] == ["T1"]
