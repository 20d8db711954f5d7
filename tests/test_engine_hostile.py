"""Hostile shards and paths against the Ray engine's job (issue 34: cases 1, 2, 5, 6, 7, 9, 12).

The fast tests drive the engine-independent shard machinery (`linker.engine.shards`) in-process,
and the CLI up to where it refuses a job before Ray starts; the slow ones share one local Ray
(2 CPUs) and run the real `linker normalize-ray` on hostile inputs. Each asserts the exit
code, one `error:` line naming the shard, the other shards linked, the inputs' sha256 unchanged
and nothing written outside ``--output``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linker.engine.shards import JOB, SUCCESS, confine_outputs, failure_message, job_document, list_shards, \
    normalize_shard, prepare_output, write_success
from linker.errors import ConfigError, InputFormatError, LinkerError
from linker.fileio import MARKER
from linker.formats import ReadLimits
from linker.link import Linker

from fixtures.normalize.normalize_tables import build_indexes
from test_normalize import run_cli  # noqa: E402  (exit code of `linker ARGS` run in-process)

HUGE = 40_000_000  # characters of the one text of the probe's 4 KB Parquet shard


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    return build_indexes(tmp_path_factory.mktemp("hostile_index"))["meddra"]


@pytest.fixture(scope="module")
def linker(index) -> Linker:
    return Linker.load(index)


def spans(folder: Path, name: str, texts: list[str]) -> Path:
    """A JSONL shard (gzip-compressed for a ``.gz`` name) of these texts."""
    folder.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    path = folder / name
    path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return path


def tree(root: Path, *, skip: Path | None = None) -> dict[str, str]:
    """sha256 of every file below `root` (links not followed), `skip` left out: what must stay untouched."""
    found = {}
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        if path.is_file() and not path.is_symlink():
            found[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def job(index: Path) -> dict:
    return job_document(index, k=1, lang=None, batch_size=64, load_options={})


def run_job(linker: Linker, index: Path, spec: str, out: Path) -> list:
    """The whole job in this process, as each Ray worker runs it per shard."""
    shards, pending = prepare_output(spec, out, job(index))
    for shard in pending:
        normalize_shard(linker, shard, batch_size=64)
    write_success(out, shards, job(index))
    return shards


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ----------------------------------------------------------------------------- case 2: `..` in a glob


def victim_layout(root: Path) -> None:
    spans(root / "in" / "x", "ok.jsonl", ["nausea"])
    (root / "victim").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["itching", "dizzy"], "keep": ["column", "kept"]}), root / "victim" / "data.parquet")
    spans(root / "victim", "secret.jsonl", ["hair loss"])


def test_dotdot_glob_names_outputs_inside_the_output_and_leaves_inputs(index, linker, tmp_path, monkeypatch):
    victim_layout(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    shards = run_job(linker, index, "in/*/../../victim/*", Path("out"))
    assert sorted(s.name for s in shards) == ["data.parquet", "secret.jsonl"]
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.parquet")) == [
        "data.parquet", "secret.parquet"]
    assert tree(tmp_path, skip=tmp_path / "out") == before  # the victim's files intact, nothing new beside them
    assert pq.read_table(tmp_path / "victim" / "data.parquet").column_names == ["text", "keep"]


def test_a_symlink_inside_the_output_cannot_lead_an_output_onto_an_input(tmp_path):
    victim_layout(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "victim").symlink_to(tmp_path / "victim")
    with pytest.raises(ConfigError, match=r"resolves to .*victim.*outside the output folder"):
        list_shards(str(tmp_path / "*" / "data.parquet"), tmp_path / "out")
    with pytest.raises(ConfigError, match="would replace the input"):
        confine_outputs(tmp_path / "victim", list_shards(str(tmp_path / "victim" / "*.parquet"), tmp_path / "victim")[1])


@pytest.fixture(scope="module")
def glob_tree(tmp_path_factory) -> Path:
    """in/{a,b} shards, in/lnk -> ../victim, victim shards, an output folder holding a symlink to the victim.

    Seven folders deep, so that the six `..` a glob may hold never lead `**` out of the test's folder."""
    root = tmp_path_factory.mktemp("globs") / "1" / "2" / "3" / "4" / "5" / "6" / "7"
    victim_layout(root)
    spans(root / "in" / "a", "x.jsonl", ["nausea"])
    spans(root / "in" / "a", "y.jsonl.gz", ["itching"])
    (root / "in" / "b").mkdir()
    pq.write_table(pa.table({"text": ["dizzy"]}), root / "in" / "b" / "x.parquet")
    (root / "in" / "lnk").symlink_to(root / "victim")
    (root / "trap").mkdir()
    (root / "trap" / "victim").symlink_to(root / "victim")
    return root


START = st.sampled_from(["", "in/", "in/a/", "in/*/", "in/lnk/", "victim/", "trap/victim/", "*/", "in/?/"])
MOVE = st.sampled_from(["../", "*/../", "a/", "../victim/", "../../", "lnk/../", "**/", "./", "../in/", "../*/", "*/"])
LAST = st.sampled_from(["*", "*.jsonl", "*.parquet", "*.gz", "data.parquet", "x.*", "secret.jsonl", "*/*"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=START, moves=st.lists(MOVE, max_size=3), last=LAST, absolute=st.booleans(),
       output=st.sampled_from(["out", "trap", "in/a/../../out2", "victim/../out3"]))
def test_glob_outputs_always_lie_inside_the_output_and_are_no_input(glob_tree, start, moves, last, absolute, output):
    """Hypothesis: a glob with `..`, `.`, `**`, an absolute prefix and symlinked folders names outputs that
    lie inside --output once every symlink is resolved, with no `..` or absolute part, and are no input."""
    spec = (f"{glob_tree}/" if absolute else "") + start + "".join(moves) + last
    with contextlib.chdir(glob_tree):
        try:
            _, shards = list_shards(spec, output)
        except LinkerError as exc:
            assert "\n" not in str(exc)
            return
        root = Path(os.path.realpath(output))
        sources = {os.path.realpath(s.source) for s in shards}
        for shard in shards:
            name = PurePosixPath(shard.name)
            assert not name.is_absolute() and ".." not in name.parts and "." not in name.parts
            target = Path(os.path.realpath(shard.output))
            assert root in target.parents, (spec, output, shard)
            assert str(target) not in sources
        assert len({s.output for s in shards}) == len(shards)


# ----------------------------------------------------------------------------- case 1: the index is an input


def test_the_index_or_a_reranker_folder_as_output_is_refused_and_kept(index, tmp_path, capsys):
    V = tmp_path / "indexes" / "V"
    shutil.copytree(index, V)
    spans(tmp_path / "shards", "a.jsonl", ["nausea"])
    before = tree(V)
    base = ["normalize-ray", "--input", str(tmp_path / "shards")]
    for output in (V, V / "linked", V.parent):  # the index, inside it, around it
        assert run_cli([*base, "--index", str(V), "--output", str(output), "--overwrite"]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert re.search(r"(is|lies inside|contains) the input .*V", line), line
    model = tmp_path / "reranker"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert run_cli([*base, "--index", str(V), "--rerank", str(model), "--output", str(model),
                    "--overwrite"]) == 1
    assert "is the input" in one_error_line(capsys.readouterr().err)
    assert tree(V) == before and (model / "config.json").read_text() == "{}"


# ----------------------------------------------------------------------------- case 5: resume and content


def test_a_shard_edited_in_place_with_the_same_size_is_linked_again(index, linker, tmp_path):
    source = spans(tmp_path / "in", "a.jsonl", ["hair loss", "nausea"])
    spans(tmp_path / "in", "b.jsonl", ["itching"])
    run_job(linker, index, str(tmp_path / "in"), tmp_path / "out")
    size = source.stat().st_size
    spans(tmp_path / "in", "a.jsonl", ["head pain", "nausea"])  # same byte size, other content
    assert source.stat().st_size == size
    shards, pending = prepare_output(str(tmp_path / "in"), tmp_path / "out", job(index))
    assert [s.name for s in pending] == ["a.jsonl"] and not (tmp_path / "out" / SUCCESS).exists()
    normalize_shard(linker, pending[0])
    manifest = write_success(tmp_path / "out", shards, job(index))
    assert pq.read_table(tmp_path / "out" / "a.parquet").column("text").to_pylist() == ["head pain", "nausea"]
    assert manifest["spans"] == 3
    assert manifest["files"][0]["input_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()


def test_an_output_whose_input_is_gone_is_reported_not_kept(index, linker, tmp_path, capsys):
    spans(tmp_path / "in", "a.jsonl", ["hair loss", "nausea"])
    spans(tmp_path / "in", "b.jsonl", ["itching"])
    run_job(linker, index, str(tmp_path / "in"), tmp_path / "out")
    (tmp_path / "in" / "a.jsonl").rename(tmp_path / "in" / "c.jsonl")
    code = run_cli(["normalize-ray", "--index", str(index), "--input", str(tmp_path / "in"),
                    "--output", str(tmp_path / "out"), "--k", "1", "--batch-size", "64"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 1 and "1 output shard(s) whose input is gone: a.parquet (from a.jsonl)" in line
    assert not (tmp_path / "out" / SUCCESS).exists()  # the folder no longer stands for its input
    assert (tmp_path / "out" / "a.parquet").is_file()  # nothing deleted behind the user's back


def test_an_input_changed_while_it_is_linked_leaves_no_output(linker, index, tmp_path, monkeypatch):
    spans(tmp_path / "in", "a.jsonl", ["nausea"])
    shards, _ = prepare_output(str(tmp_path / "in"), tmp_path / "out", job(index))
    digests = iter(["0" * 64, "1" * 64])
    monkeypatch.setattr("linker.engine.shards.file_sha256", lambda path: next(digests))
    with pytest.raises(InputFormatError, match=r"a.jsonl: expected a shard that stays the same"):
        normalize_shard(linker, shards[0])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([MARKER, JOB])


# ----------------------------------------------------------------------------- cases 12, 6, 9: one line each


def test_a_corrupt_job_file_is_one_line_naming_it(index, tmp_path, capsys):
    spans(tmp_path / "in", "a.jsonl", ["nausea"])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / MARKER).write_text("{}")
    for garbage in (b'{"k": 1', b"\xff\xfe", b"[1, 2]"):
        (tmp_path / "out" / JOB).write_bytes(garbage)
        assert run_cli(["normalize-ray", "--index", str(index), "--input", str(tmp_path / "in"),
                        "--output", str(tmp_path / "out")]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert f"{tmp_path / 'out' / JOB}: expected the job document linker wrote" in line and "--overwrite" in line


def hostile_shards(folder: Path) -> dict[str, str]:
    """Bad shards beside good ones; for each bad one, what its one-line error must say."""
    spans(folder, "good-1.jsonl", ["nausea", "hair loss"])
    spans(folder, "good-2.jsonl.gz", ["itching"])
    whole = gzip.compress(b"".join(json.dumps({"text": f"nausea {i}"}).encode() + b"\n" for i in range(2000)))
    (folder / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "plain.jsonl.gz").write_text('{"text": "nausea"}\n')  # not gzip, named .gz
    pq.write_table(pa.table({"text": ["nausea", "x" * HUGE]}), folder / "huge.parquet", compression="zstd")
    assert (folder / "huge.parquet").stat().st_size < 16_384
    return {"truncated.jsonl.gz": r"truncated.jsonl.gz(:\d+)?: expected a complete compressed file, .*truncated",
            "plain.jsonl.gz": r"plain.jsonl.gz(:\d+)?: expected a gzip file",
            "huge.parquet": rf"huge.parquet row 2: expected a text of at most 1,048,576 bytes, found {HUGE:,} bytes"}


def test_hostile_shards_fail_alone_with_their_name(linker, index, tmp_path):
    expected = hostile_shards(tmp_path / "in")
    shards, _ = prepare_output(str(tmp_path / "in"), tmp_path / "out", job(index))
    for shard in shards:
        if shard.name in expected:
            with pytest.raises(InputFormatError, match=expected[shard.name]) as caught:
                normalize_shard(linker, shard)
            assert "\n" not in str(caught.value)
            assert not shard.output.exists()
        else:
            assert normalize_shard(linker, shard)["spans"] >= 1


def test_parquet_row_groups_and_values_are_capped_before_they_are_decoded(linker, index, tmp_path):
    """Footer sizes first; then each value and each batch, before a dictionary (one value repeated in every
    row) is decoded; DELTA_BYTE_ARRAY pages (a prefix repeated) are read a few rows at a time."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ["i" * 2000, "b"], "text": ["nausea", "itching"]}), tmp_path / "in" / "id.parquet")
    pq.write_table(pa.table({"text": [f"nausea {i}" for i in range(5000)]}), tmp_path / "in" / "groups.parquet",
                   row_group_size=1000)
    repeated = pa.DictionaryArray.from_arrays(pa.array([0] * 300, pa.int32()), pa.array(["nausea " * 128]))
    pq.write_table(pa.table({"text": repeated}), tmp_path / "in" / "dictionary.parquet", store_schema=False)
    pq.write_table(pa.table({"text": ["nausea " * 128] * 300}), tmp_path / "in" / "delta.parquet", use_dictionary=False,
                   column_encoding={"text": "DELTA_BYTE_ARRAY"}, store_schema=False)
    assert (tmp_path / "in" / "dictionary.parquet").stat().st_size < 4096  # 269 KB of text once decoded
    shards, _ = prepare_output(str(tmp_path / "in"), tmp_path / "out", job(index))
    limits = ReadLimits(max_line_bytes=1000, max_document_bytes=20_000)
    by_name = {s.name: s for s in shards}
    with pytest.raises(InputFormatError, match=r"id.parquet row 1: expected a id of at most 1,000 bytes, found 2,000"):
        normalize_shard(linker, by_name["id.parquet"], limits=limits)
    assert normalize_shard(linker, by_name["groups.parquet"], limits=limits)["spans"] == 5000
    with pytest.raises(InputFormatError, match=r"groups.parquet row group 1: expected at most 1,000 bytes of spans"):
        normalize_shard(linker, by_name["groups.parquet"], limits=ReadLimits(max_document_bytes=1000))
    with pytest.raises(InputFormatError, match=r"dictionary.parquet rows 1-300: expected at most 20,000 bytes of text "
                                               r"per 300 rows, found 268,800 bytes"):
        normalize_shard(linker, by_name["dictionary.parquet"], limits=limits)
    assert normalize_shard(linker, by_name["delta.parquet"], limits=limits)["spans"] == 300
    assert pq.read_table(by_name["delta.parquet"].output).column("text").to_pylist() == ["nausea " * 128] * 300


def test_the_failure_line_names_every_failed_shard():
    errors = [(f"s{i}.jsonl", f"in/s{i}.jsonl:1: expected a JSON object, found list") for i in range(6)]
    message = failure_message(errors, 9)
    assert "\n" not in message and message.startswith("6 of 9 shard(s) failed")
    assert all(f"s{i}.jsonl" in message for i in range(6))


# ----------------------------------------------------------------------------- a real local Ray


@pytest.mark.slow
def test_ray_job_links_every_good_shard_and_names_each_bad_one(ray_cluster, index, tmp_path, capsys):
    """Case 9 and 6 on Ray: a truncated .gz, a non-gzip .gz and a 4 KB Parquet shard holding a 40M-character
    text each fail alone, in one line naming them all; the good shards are linked; no _SUCCESS."""
    expected = hostile_shards(tmp_path / "in")
    before = tree(tmp_path)
    code = run_cli(["normalize-ray", "--index", str(index), "--input", str(tmp_path / "in"),
                    "--output", str(tmp_path / "out"), "--workers", "2"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 1 and "3 of 5 shard(s) failed" in line
    for pattern in expected.values():
        assert re.search(pattern, line), (pattern, line)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [MARKER, JOB, "good-1.parquet", "good-2.parquet"])
    assert tree(tmp_path, skip=tmp_path / "out") == before


@pytest.mark.slow
def test_ray_dotdot_glob_writes_only_inside_the_output(ray_cluster, index, tmp_path, monkeypatch, capsys):
    victim_layout(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    assert run_cli(["normalize-ray", "--index", str(index), "--input", "in/*/../../victim/*",
                    "--output", "out"]) == 0
    assert tree(tmp_path, skip=tmp_path / "out") == before
    manifest = json.loads((tmp_path / "out" / SUCCESS).read_text())
    assert [f["output"] for f in manifest["files"]] == ["data.parquet", "secret.parquet"] and manifest["spans"] == 3


@pytest.mark.slow
def test_ray_shard_that_kills_its_worker_every_time_fails_after_bounded_tries(ray_cluster, index, tmp_path):
    """Case 7: every worker that writes part-bad's output is killed (as the memory monitor would); the
    shard is tried MAX_ATTEMPTS times, then fails with one line naming it, and the job ends."""
    from linker.engine.ray import MAX_ATTEMPTS, normalize_ray

    texts = ["nausea itching", "hair loss", "head pain"] * 600
    for name in ("part-1.jsonl", "part-bad.jsonl", "part-2.jsonl"):
        spans(tmp_path / "in", name, texts)
    temporary = re.compile(r"^\.part-bad\.parquet\.linker-tmp-(\d+)-\w+$")
    killed: list[int] = []
    stop = threading.Event()

    def kill_part_bad_writers() -> None:
        while not stop.is_set():
            for entry in (tmp_path / "out").glob(".part-bad*"):
                match = temporary.match(entry.name)
                if match and int(match.group(1)) not in killed:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(match.group(1)), signal.SIGKILL)
                    killed.append(int(match.group(1)))
            time.sleep(0.002)

    killer = threading.Thread(target=kill_part_bad_writers, daemon=True)
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(LinkerError, match=rf"1 of 3 shard\(s\) failed .*part-bad.jsonl: its worker .*"
                                              rf"on each of {MAX_ATTEMPTS} tries") as caught:
            normalize_ray(index, str(tmp_path / "in"), tmp_path / "out", workers=2)
    finally:
        stop.set()
        killer.join()
    assert "\n" not in str(caught.value) and len(killed) == MAX_ATTEMPTS
    assert "process died" in str(caught.value)  # a kill -9, not mistaken for the memory monitor's
    left = [int(temporary.match(p.name).group(1)) for p in (tmp_path / "out").iterdir() if temporary.match(p.name)]
    assert set(left) <= set(killed)  # only a dead writer's, in the instant before its parent reaps it
    assert time.monotonic() - started < 120
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet")) == ["part-1.parquet", "part-2.parquet"]
    assert not (tmp_path / "out" / SUCCESS).exists()


@pytest.mark.slow
def test_ray_annotate_codes_raw_documents_as_linker_annotate_does(ray_cluster, index, linker, tmp_path, capsys):
    """`linker annotate-ray` on a real local Ray: documents in (JSONL and Parquet shards), one row per span out,
    the same spans, codes and decisions as the library function behind `linker annotate`; a re-run resumes, a
    run with another style is refused."""
    pytest.importorskip("torch")
    from linker.extract import annotate, public

    docs = {"d1": "A woman developed severe nausea and hair loss after starting cisplatin. She had no headache.",
            "d2": "No rash since starting amoxicillin.", "d3": "Rash and vomiting on lamotrigine."}
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"id": i, "text": docs[i]}) + "\n" for i in ("d1", "d2")))
    pq.write_table(pa.table({"id": ["d3"], "text": [docs["d3"]]}), tmp_path / "in" / "b.parquet")
    args = ["annotate-ray", "--index", str(index), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
            "--workers", "2"]
    assert run_cli(args) == 0
    rows = pa.concat_tables([pq.read_table(tmp_path / "out" / f) for f in ("a.parquet", "b.parquet")]).to_pylist()
    expected = annotate(list(docs.values()), linker)
    fields = ("start", "end", "text", "label", "status", "code", "decision")
    assert [(r["id"], *(r[f] for f in fields)) for r in rows] == [
        (doc_id, *(public(s)[f] for f in fields)) for doc_id, spans in zip(docs, expected) for s in spans]
    assert any(r["status"] == "negated" and r["decision"] == "not coded" and r["nil"] for r in rows)
    assert any(r["decision"] in ("auto", "review") and not r["nil"] for r in rows)
    manifest = json.loads((tmp_path / "out" / SUCCESS).read_text())
    assert manifest["spans"] == len(rows) and manifest["job"]["extract"]["style"] == "auto"
    capsys.readouterr()
    assert run_cli(args) == 0 and "0 done now, 2 done before" in capsys.readouterr().err
    assert run_cli([*args, "--style", "terms"]) == 1
    assert "holds a run with extract" in capsys.readouterr().err
