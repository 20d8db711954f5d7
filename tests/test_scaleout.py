"""Scale-out (issue 17): the Arrow function, exactly-once shards, and a real local Ray (num_cpus=2).

The fast tests run the shard machinery in-process without Ray; the slow ones start Ray, link the
same spans as `linker normalize` and compare, kill the driver with -9 and resume, feed a bad shard.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from linker.engine.arrow import OUTPUT_SCHEMA, SPARK_SCHEMA, link_arrow, map_in_arrow
from linker.engine.shards import JOB, SUCCESS, job_document, list_shards, normalize_shard, prepare_output, write_success
from linker.errors import ConfigError, InputFormatError, LinkerError, MissingInputError
from linker.eval.calibrate import calibrate
from linker.fileio import MARKER, is_temporary
from linker.link import Linker
from linker.normalize import BATCH

from fixtures.normalize.normalize_tables import build_indexes
from test_normalize import run_cli  # noqa: E402  (exit code of `linker ARGS` run in-process)

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
HELDIN = f"tsv:{FIX / 'confidence/heldin.tsv'}"
WORDS = "hair loss head pain nausea dizziness itching alopecia headache pruritus scalp severe dizzy xq".split()
MIN_CONFIDENCE = 0.5


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """The tiny MedDRA-like tf-idf index, calibrated, so outputs carry confidence and "no link"."""
    folder = build_indexes(tmp_path_factory.mktemp("scaleout"))["meddra"]
    calibrate(folder, HELDIN)
    return folder


@pytest.fixture(scope="module")
def linker(index) -> Linker:
    return Linker.load(index, min_confidence=MIN_CONFIDENCE)


def write_shards(folder: Path, shards: int, spans: int, *, seed: int = 0) -> Path:
    """`shards` JSONL shards of `spans` two-word spans each (ids on even lines only, some with a lang)."""
    import random

    rnd = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with (folder / f"part-{s:03d}.jsonl").open("w", encoding="utf-8") as handle:
            for i in range(spans):
                record = {"text": " ".join(rnd.sample(WORDS, 2))}
                if i % 2 == 0:
                    record["id"] = f"{s}-{i}"
                if i % 5 == 0:
                    record["lang"] = rnd.choice(["en", "es", "de"])  # de: not in the index, linked against all
                handle.write(json.dumps(record) + "\n")
    return folder


def outputs(folder: Path) -> dict[str, bytes]:
    """Every file of an output folder by relative path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def local_normalize(index: Path, shard: Path, out: Path, k: int) -> list[dict]:
    """`linker normalize` (the CLI, in-process) on one JSONL shard: its output records."""
    assert run_cli(["normalize", "--index", str(index), "--input", str(shard), "--format", "jsonl", "--output",
                    str(out), "--k", str(k), "--min-confidence", str(MIN_CONFIDENCE)]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def assert_same_as_local(parquet: Path, local: list[dict], shard_name: str) -> None:
    rows = pq.read_table(parquet).to_pylist()
    assert len(rows) == len(local)
    for line, (row, record) in enumerate(zip(rows, local), start=1):
        candidates = record["candidates"]
        assert row["id"] == (str(record["id"]) if "id" in record else f"{shard_name}:{line}")
        assert row["text"] == record["text"] and row["lang"] == record.get("lang")
        assert row["concept_ids"] == [c["concept_id"] for c in candidates]
        assert row["names"] == [c["preferred_name"] for c in candidates]
        assert row["matched_names"] == [c["matched_name"] for c in candidates]
        assert row["scores"] == pytest.approx([c["score"] for c in candidates], abs=1e-6)
        assert row["nil"] is record["nil"]
        expected = candidates[0]["confidence"] if candidates else None
        assert row["confidence"] == (None if expected is None else pytest.approx(expected, abs=1e-6))


# ----------------------------------------------------------------------------- the Arrow function


def test_link_arrow_is_link_with_flat_columns(linker):
    batch = pa.RecordBatch.from_pydict({"id": [7, 8, 9], "text": ["hair loss", "cefalea", "xq"],
                                        "lang": [None, "es", "de"]})
    out = link_arrow(linker, batch, k=2)
    assert out.schema == OUTPUT_SCHEMA
    rows = out.to_pylist()
    assert [r["id"] for r in rows] == ["7", "8", "9"]
    [hair] = linker.link(["hair loss"], k=2)
    assert rows[0]["concept_ids"] == [c.concept_id for c in hair.candidates]
    assert rows[0]["confidence"] == pytest.approx(hair.candidates[0].confidence)
    assert rows[2]["lang"] == "de"  # kept as given; linked against all languages (the index has none in de)
    assert rows[2]["nil"] and rows[2]["concept_ids"] == [] and rows[2]["confidence"] is None


def test_link_arrow_names_an_empty_row(linker):
    with pytest.raises(InputFormatError, match="row 1"):
        link_arrow(linker, pa.RecordBatch.from_pydict({"text": ["nausea", " "]}))


def test_map_in_arrow_loads_once_and_links_every_batch(index):
    fn = map_in_arrow(index, k=1, min_confidence=MIN_CONFIDENCE)
    batches = [pa.RecordBatch.from_pydict({"text": ["nausea"]}), pa.RecordBatch.from_pydict({"text": ["itching"]})]
    out = list(fn(iter(batches)))
    assert [b.column("concept_ids").to_pylist() for b in out] == [[["10028813"]], [["10037087"]]]
    assert SPARK_SCHEMA.count(",") == len(OUTPUT_SCHEMA) - 1


# ----------------------------------------------------------------------------- shards without an engine


def test_shards_mirror_inputs_and_refuse_collisions(tmp_path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    for name in ("a.jsonl", "sub/b.jsonl.gz", "c.parquet", "notes.txt", ".hidden.jsonl"):
        (tmp_path / "in" / name).write_text("")
    base, shards = list_shards(str(tmp_path / "in"), tmp_path / "out")
    assert base == tmp_path / "in"
    assert [(s.name, s.output.relative_to(tmp_path / "out").as_posix()) for s in shards] == [
        ("a.jsonl", "a.parquet"), ("c.parquet", "c.parquet"), ("sub/b.jsonl.gz", "sub/b.parquet")]
    _, globbed = list_shards(str(tmp_path / "in" / "*.jsonl"), tmp_path / "out")
    assert [s.name for s in globbed] == ["a.jsonl"]
    (tmp_path / "in" / "a.parquet").write_text("")
    with pytest.raises(InputFormatError, match="shard 'a.parquet' and shard 'a.jsonl' .* both named a.parquet"):
        list_shards(str(tmp_path / "in"), tmp_path / "out")
    with pytest.raises(InputFormatError, match="notes.txt"):
        list_shards(str(tmp_path / "in" / "*"), tmp_path / "out")
    with pytest.raises(MissingInputError):
        list_shards(str(tmp_path / "none" / "*.jsonl"), tmp_path / "out")


def test_shard_equals_local_normalize_and_rerun_is_byte_identical(index, linker, tmp_path):
    inputs = write_shards(tmp_path / "in", 1, 300)
    job = job_document(index, k=3, lang=None, batch_size=64, load_options={"min_confidence": MIN_CONFIDENCE})
    shards, pending = prepare_output(str(inputs), tmp_path / "out", job)
    assert pending == shards and (tmp_path / "out" / MARKER).is_file()
    counts = normalize_shard(linker, shards[0], k=3, batch_size=64)
    local = local_normalize(index, shards[0].source, tmp_path / "local.jsonl", 3)
    assert_same_as_local(shards[0].output, local, "part-000.jsonl")
    assert counts["spans"] == 300 and 0 < counts["nil"] < 300
    manifest = write_success(tmp_path / "out", shards, job)
    assert manifest["spans"] == 300 and manifest["nil"] == counts["nil"]
    first = outputs(tmp_path / "out")
    assert prepare_output(str(inputs), tmp_path / "out", job)[1] == []  # resumed: nothing left to do
    shards[0].output.unlink()
    (tmp_path / "out" / SUCCESS).unlink()
    normalize_shard(linker, shards[0], k=3, batch_size=64)
    write_success(tmp_path / "out", shards, job)
    assert outputs(tmp_path / "out") == first


def test_bad_row_fails_its_shard_with_file_and_line_and_leaves_nothing(linker, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.jsonl").write_text('{"text": "nausea"}\n{"text": ""}\n', encoding="utf-8")
    pq.write_table(pa.table({"text": ["nausea", None]}), tmp_path / "in" / "null.parquet")
    pq.write_table(pa.table({"words": ["nausea"]}), tmp_path / "in" / "nocolumn.parquet")
    (tmp_path / "in" / "broken.parquet").write_bytes(b"PAR1 not really")
    job = job_document(linker.index.folder, k=1, lang=None, batch_size=8, load_options={})
    shards, _ = prepare_output(str(tmp_path / "in"), tmp_path / "out", job)
    expected = {"bad.jsonl": r"bad.jsonl:2: expected a non-empty text", "null.parquet": r"null.parquet row 2: .*null",
                "nocolumn.parquet": r"nocolumn.parquet: expected a column 'text'", "broken.parquet": r"broken.parquet: "}
    for shard in shards:
        with pytest.raises(InputFormatError, match=expected[shard.name]):
            normalize_shard(linker, shard)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([MARKER, JOB])


def test_output_checks_inputs_foreign_folders_and_other_jobs(index, tmp_path):
    inputs = write_shards(tmp_path / "in", 1, 3)
    job = job_document(index, k=1, lang=None, batch_size=8, load_options={})
    with pytest.raises(ConfigError, match="lies inside the input"):
        prepare_output(str(inputs), inputs / "out", job)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="did not write"):
        prepare_output(str(inputs), tmp_path / "foreign", job)
    prepare_output(str(inputs), tmp_path / "out", job)
    other = job_document(index, k=2, lang=None, batch_size=8, load_options={})
    with pytest.raises(ConfigError, match="k 1 -> 2.*--overwrite"):
        prepare_output(str(inputs), tmp_path / "out", other)
    _, pending = prepare_output(str(inputs), tmp_path / "out", other, overwrite=True)
    assert len(pending) == 1 and json.loads((tmp_path / "out" / JOB).read_text())["k"] == 2


def test_cli_engine_ray_without_ray_is_one_line(index, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    inputs = write_shards(tmp_path / "in", 1, 3)
    code = run_cli(["normalize-ray", "--index", str(index), "--input", str(inputs),
                    "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert "linker normalize-ray needs Ray" in err and "pip install 'linker[ray]'" in err
    assert not (tmp_path / "out").exists()


def test_cli_the_ray_engine_is_its_own_command(index, tmp_path, capsys):
    inputs = write_shards(tmp_path / "in", 1, 3)
    base = ["normalize", "--index", str(index), "--input", str(inputs), "--output", str(tmp_path / "out")]
    for engine in ("ray", "spark"):  # the old option: one line naming the new command
        assert run_cli([*base, "--format", "jsonl", "--engine", engine]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--engine {engine} is gone" in err and "linker normalize-ray" in err
    assert run_cli([*base, "--format", "jsonl", "--workers", "4"]) == 2  # a Ray option: not normalize's
    assert "no such option --workers" in capsys.readouterr().err
    assert run_cli(base) == 1
    assert "--format is required" in capsys.readouterr().err
    ray = ["normalize-ray", "--index", str(index), "--input", str(inputs)]
    assert run_cli([*ray, "--output", str(tmp_path / "out"), "--format", "brat"]) == 2  # shards only
    assert "no such option --format" in capsys.readouterr().err
    assert run_cli([*ray, "--output", "-"]) == 1
    assert "`-` (stdin/stdout) works with `linker normalize --format jsonl`" in capsys.readouterr().err


def test_ray_is_an_optional_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("ray") for dep in project["dependencies"])
    assert any(dep.startswith("ray[data]") for dep in project["optional-dependencies"]["ray"])


# ----------------------------------------------------------------------------- a real local Ray


@pytest.mark.slow
def test_ray_output_equals_local_normalize_and_reruns_byte_identical(ray_cluster, index, tmp_path):
    from linker.engine.ray import link_dataset, normalize_ray

    inputs = write_shards(tmp_path / "in", 4, 150)
    pq.write_table(pa.table({"id": [1, 2], "text": ["itching", "dizzy"], "lang": ["en", None]}),
                   inputs / "extra.parquet")
    summary = normalize_ray(index, str(inputs), tmp_path / "out", k=3, workers=2, batch_size=64,
                            min_confidence=MIN_CONFIDENCE)
    manifest = json.loads((tmp_path / "out" / SUCCESS).read_text())
    assert manifest == summary.manifest and manifest["shards"] == 5 and manifest["spans"] == 602
    assert 0 < manifest["nil"] < 602 and manifest["job"]["index"]["manifest_sha256"]
    assert summary.linked_now == 5 and sum(w["spans"] for w in summary.workers) == 602
    for shard in sorted(inputs.glob("*.jsonl")):
        local = local_normalize(index, shard, tmp_path / f"{shard.stem}.local.jsonl", 3)
        assert_same_as_local(tmp_path / "out" / f"{shard.stem}.parquet", local, shard.name)
    extra = pq.read_table(tmp_path / "out" / "extra.parquet").to_pylist()
    assert [(r["id"], r["concept_ids"][0]) for r in extra] == [("1", "10037087"), ("2", "10013573")]

    first = outputs(tmp_path / "out")
    again = normalize_ray(index, str(inputs), tmp_path / "out", k=3, workers=2, batch_size=64,
                          min_confidence=MIN_CONFIDENCE)
    assert again.linked_now == 0 and outputs(tmp_path / "out") == first

    # The same Arrow function on a Ray Dataset, as inside a user's Ray program.
    dataset = ray_cluster.data.from_arrow(pa.table({"text": ["hair loss", "xq", "náuseas"], "lang": [None, None, "es"]}))
    rows = link_dataset(dataset, index, k=2, workers=1, min_confidence=MIN_CONFIDENCE).take_all()
    assert [r["concept_ids"][:1] for r in rows] == [["10001760"], [], ["10028813"]]


@pytest.mark.slow
def test_ray_bad_shard_fails_alone_and_the_rerun_finishes(ray_cluster, index, tmp_path):
    from linker.engine.ray import normalize_ray

    inputs = write_shards(tmp_path / "in", 3, 20)
    good = (inputs / "part-001.jsonl").read_text()
    (inputs / "part-001.jsonl").write_text(good + '{"text": "nausea", "lang": 3}\n')
    with pytest.raises(LinkerError, match=r"1 of 3 shard\(s\) failed.*part-001.jsonl:21: expected \"lang\""):
        normalize_ray(index, str(inputs), tmp_path / "out", workers=2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [MARKER, JOB, "part-000.parquet", "part-002.parquet"])  # no output, no temporary, no _SUCCESS
    (inputs / "part-001.jsonl").write_text(good)
    summary = normalize_ray(index, str(inputs), tmp_path / "out", workers=2)
    assert summary.linked_now == 1 and summary.manifest["spans"] == 60


@pytest.mark.slow
def test_driver_killed_with_9_resumes_to_the_same_bytes(ray_cluster, index, tmp_path):
    """kill -9 the CLI driver once some shards are written, run again: the result equals an unkilled run's."""
    from linker.engine.ray import normalize_ray

    inputs = write_shards(tmp_path / "in", 12, 1000)
    normalize_ray(index, str(inputs), tmp_path / "reference", k=2, workers=2)  # unkilled, in this process's Ray
    command = [sys.executable, "-m", "linker", "-q", "normalize-ray", "--index", str(index),
               "--input", str(inputs), "--output", str(tmp_path / "out"), "--k", "2", "--workers", "2"]
    # Its own session, so that what the killed driver's local Ray leaves behind can be ended by group id.
    driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(list((tmp_path / "out").glob("*.parquet"))) < 2 and driver.poll() is None:
            assert time.monotonic() < deadline, "no shard written in 240 s"
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        assert driver.wait() == -signal.SIGKILL
        done_at_kill = len(list((tmp_path / "out").glob("*.parquet")))
        assert 2 <= done_at_kill < 12
        assert not (tmp_path / "out" / SUCCESS).exists()
    finally:
        time.sleep(2)  # the killed driver's raylet takes its workers down; end what is left of its session
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # The rerun, through the Python API in this process's Ray (one Ray start fewer), finishes the job.
    rerun = normalize_ray(index, str(inputs), tmp_path / "out", k=2, workers=2)
    assert 0 < rerun.linked_now <= 12 - done_at_kill  # a worker may finish one more shard as it dies
    assert outputs(tmp_path / "out") == outputs(tmp_path / "reference")
    assert not [p for p in (tmp_path / "out").rglob("*") if is_temporary(p)]
    shutil.rmtree(tmp_path / "in")



@pytest.mark.slow
def test_worker_killed_with_9_mid_shard_is_restarted_and_the_job_finishes(ray_cluster, index, linker, tmp_path):
    """kill -9 a worker actor's process while it writes a shard: the driver replaces the actor and tries
    the shard again (`linker.engine.ray.MAX_ATTEMPTS` tries at most), the job finishes in the same
    call, and its folder is byte-identical to the same job done in-process, with no temporary left."""
    import re
    import threading

    from linker.engine.ray import normalize_ray

    inputs = write_shards(tmp_path / "in", 12, 1500)
    job = job_document(index, k=2, lang=None, batch_size=BATCH, load_options={"min_confidence": MIN_CONFIDENCE})
    shards, _ = prepare_output(str(inputs), tmp_path / "reference", job)
    for shard in shards:  # the reference without Ray: what every worker runs per shard
        normalize_shard(linker, shard, k=2)
    write_success(tmp_path / "reference", shards, job)

    temporary = re.compile(r"^\.(part-\d+\.parquet)\.linker-tmp-(\d+)-\w+$")
    killed: list[tuple[str, int]] = []  # (shard output, pid) of the worker killed mid-shard
    stop = threading.Event()

    def kill_a_worker_mid_shard() -> None:
        # A shard's temporary exists from its first row to its rename, and names its writer's pid.
        while not stop.is_set() and not killed:
            if len(list((tmp_path / "out").glob("*.parquet"))) >= 2:
                for entry in (tmp_path / "out").glob(".*"):
                    match = temporary.match(entry.name)
                    if match:
                        os.kill(int(match.group(2)), signal.SIGKILL)
                        killed.append((match.group(1), int(match.group(2))))
                        break
            time.sleep(0.005)

    killer = threading.Thread(target=kill_a_worker_mid_shard, daemon=True)
    killer.start()
    try:
        summary = normalize_ray(index, str(inputs), tmp_path / "out", k=2, workers=2, min_confidence=MIN_CONFIDENCE)
    finally:
        stop.set()
        killer.join()
    assert killed, "no worker was caught mid-shard"
    shard, pid = killed[0]
    assert pid != os.getpid()  # a worker, not this driver
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert summary.linked_now == 12 and summary.manifest["spans"] == 12 * 1500
    assert (tmp_path / "out" / shard).is_file()
    assert outputs(tmp_path / "out") == outputs(tmp_path / "reference")
    assert not [p for p in (tmp_path / "out").rglob("*") if is_temporary(p)]
