"""Ray Data engine: `linker normalize --engine ray` and the same inside your own Ray program.

    from linker.engine.ray import normalize_ray, link_dataset
    normalize_ray("indexes/default", "spans/*.jsonl", "linked/", workers=8)      # files -> files, exactly once
    linked = link_dataset(ray.data.read_parquet("s3://bucket/spans/"), "indexes/default", k=3)  # Dataset -> Dataset

Both run `map_batches` on an actor pool: each actor loads the index once (`Linker.load`) and links
with `linker.engine.arrow.link_arrow`, the function `linker normalize` and Spark's `mapInArrow` use.

`normalize_ray` hands Ray Data one row per input *shard*, not the spans: an actor reads its shard
with linker's own readers (`linker.engine.shards.read_shard`, so a bad row is named by file and
line as in the local CLI, which Ray's JSON reader cannot do) and writes its Parquet output
atomically. That is what makes a job exactly-once and resumable: a shard's output is complete or
absent whichever process dies, and a re-run skips finished shards. A shard that fails (bad row,
index that does not load) comes back as an error row; the others finish, and the run fails with
one line naming every failed file, before ``_SUCCESS`` is written. A killed worker process is
restarted by Ray and its shard redone (tested with kill -9 mid-shard); the dead one's temporary is
removed by the next write into the folder.

Ray is an optional dependency (``pip install 'linker[ray]'``); importing this module does not need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

import linker
from linker.engine.arrow import OUTPUT_SCHEMA, link_arrow
from linker.engine.shards import Shard, failure_message, job_document, normalize_shard, prepare_output, write_success
from linker.errors import ConfigError, LinkerError
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.link import Linker
from linker.normalize import BATCH

log = logging.getLogger(__name__)

RESULT_SCHEMA = pa.schema([
    ("input", pa.string()), ("spans", pa.int64()), ("nil", pa.int64()), ("error", pa.string()),
    ("pid", pa.int64()), ("peak_rss_mib", pa.float64()), ("link_cpu_seconds", pa.float64()), ("seconds", pa.float64()),
    ("load_seconds", pa.float64()),
])
"""What a shard worker reports per shard: counts or the error, its process's memory peak
and the CPU time it has spent linking so far (the index load left out)."""


def import_ray():
    """The `ray` module, or a one-line ConfigError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data is the part we use; `ray` alone lacks it)
    except ImportError:
        raise ConfigError("--engine ray needs Ray, which is not installed: pip install 'linker[ray]'") from None
    return ray


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split())


class ShardWorker:
    """A Ray Data actor: one Linker, loaded once; each call normalises the shards named in its batch."""

    def __init__(self, index: str, load_options: dict, k: int, lang: str | None, batch_size: int,
                 limits: ReadLimits) -> None:
        started = time.perf_counter()
        self.options = {"k": k, "lang": lang, "batch_size": batch_size, "limits": limits}
        self.linker, self.error = None, None
        try:
            self.linker = Linker.load(index, **load_options)
        except LinkerError as exc:  # reported with every shard, so the driver shows it as one line
            self.error = _describe(exc)
        self.load_seconds = time.perf_counter() - started
        self.ready_cpu = time.process_time()

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = []
        for item in batch.to_pylist():
            shard = Shard(Path(item["source"]), item["name"], Path(item["output"]))
            started = time.perf_counter()
            counts, error = {"spans": 0, "nil": 0}, self.error
            if error is None:
                try:
                    counts = normalize_shard(self.linker, shard, **self.options)
                except (LinkerError, OSError) as exc:
                    error = _describe(exc)
            rows.append({"input": shard.name, "spans": counts["spans"], "nil": counts["nil"], "error": error,
                         "pid": os.getpid(), "peak_rss_mib": _peak_rss_mib(), "link_cpu_seconds": time.process_time() - self.ready_cpu,
                         "seconds": time.perf_counter() - started, "load_seconds": self.load_seconds})
        return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


class BatchLinker:
    """A Ray Data actor for `link_dataset`: one Linker, loaded once; batches through `link_arrow`."""

    def __init__(self, index: str, load_options: dict, k: int, lang: str | None) -> None:
        self.linker = Linker.load(index, **load_options)
        self.k, self.lang = k, lang

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_batches(
            [link_arrow(self.linker, b, k=self.k, lang=self.lang) for b in batch.to_batches() if b.num_rows],
            schema=OUTPUT_SCHEMA)


@contextlib.contextmanager
def ray_session(*, address: str | None = None, workers: int = 2):
    """Use the Ray this process is connected to; else connect to `address`, or start a local Ray
    with `workers` CPUs, and shut it down at the end."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    saved = os.environ.get("PYTHONPATH")
    if address is None:
        # Workers of a Ray started here import the linker this process imported (a checkout, not
        # necessarily the installed copy). On a cluster, linker must be installed on every node.
        root = str(Path(linker.__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *([saved] if saved else [])])
    try:
        ray.init(address=address, num_cpus=workers if address is None else None, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield ray
    finally:
        ray.shutdown()


def _quiet_ray_data() -> None:
    # linker logs one line per finished shard; Ray Data's own progress lines would repeat them
    logging.getLogger("ray.data").setLevel(logging.WARNING)


@dataclass(frozen=True)
class ScaleoutSummary:
    """A finished job: its ``_SUCCESS`` manifest, and what this run did."""

    manifest: dict
    linked_now: int  # shards linked by this run (the others were done before)
    workers: tuple[dict, ...]  # per worker process: pid, shards, spans, peak_rss_mib, link_cpu_seconds, load_seconds


def normalize_ray(
    index: str | Path, input_spec: str, output: str | Path, *, k: int = 1, lang: str | None = None,
    workers: int = 2, batch_size: int = BATCH, address: str | None = None, overwrite: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS, **load_options,
) -> ScaleoutSummary:
    """Normalise every shard of `input_spec` (a folder, a glob or a file of Parquet / JSONL spans)
    into `output` on Ray Data: one Parquet shard per input shard, then ``_SUCCESS``.

    Exactly-once and resumable (`linker.engine.shards`): run it again after a crash and it finishes
    the job; the result is byte-identical to an uninterrupted run. `load_options` go to
    `Linker.load` (rerank, rerank_k, min_confidence, precision). Inside a Ray program it uses that
    program's Ray; else it connects to `address` or starts a local Ray with `workers` CPUs.
    """
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, found {workers}")
    import_ray()
    job = job_document(index, k=k, lang=lang, batch_size=batch_size, load_options=load_options)
    shards, pending = prepare_output(input_spec, output, job, overwrite=overwrite)
    log.info("%d of %d shards to link (%d done before)", len(pending), len(shards), len(shards) - len(pending))
    results: list[dict] = []
    if pending:
        with ray_session(address=address, workers=workers) as ray:
            _quiet_ray_data()
            items = [{"source": str(s.source), "name": s.name, "output": str(s.output)} for s in pending]
            dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                ShardWorker,
                fn_constructor_kwargs={"index": str(index), "load_options": load_options, "k": k, "lang": lang,
                                       "batch_size": batch_size, "limits": limits},
                batch_size=1, batch_format="pyarrow", num_cpus=1,
                compute=ray.data.ActorPoolStrategy(size=min(workers, len(pending))),
                # A killed worker (kill -9, OOM, a lost node) is restarted and its shard redone: exactly
                # once holds because the shard is written atomically. Ray Data's defaults, pinned.
                max_restarts=-1, max_task_retries=-1,
            )
            for row in dataset.iter_rows():
                results.append(row)
                log.info("shard %d/%d %s: %s", len(results), len(pending), row["input"],
                         f"failed: {row['error']}" if row["error"] else f"{row['spans']:,} spans in {row['seconds']:.1f}s")
    errors = sorted((r["input"], r["error"]) for r in results if r["error"])
    if errors:
        raise LinkerError(failure_message(errors, len(shards)))
    return ScaleoutSummary(write_success(output, shards, job), len(results), _per_worker(results))


def _per_worker(results: list[dict]) -> tuple[dict, ...]:
    workers: dict[int, dict] = {}
    for row in results:
        seen = workers.setdefault(row["pid"], {"pid": row["pid"], "shards": 0, "spans": 0, "peak_rss_mib": 0.0,
                                               "link_cpu_seconds": 0.0, "load_seconds": row["load_seconds"]})
        seen["shards"] += 1
        seen["spans"] += row["spans"]
        seen["peak_rss_mib"] = max(seen["peak_rss_mib"], row["peak_rss_mib"])
        seen["link_cpu_seconds"] = max(seen["link_cpu_seconds"], row["link_cpu_seconds"])  # a running total
    return tuple(workers[pid] for pid in sorted(workers))


def link_dataset(dataset, index: str | Path, *, k: int = 1, lang: str | None = None, workers: int = 2,
                 batch_size: int = BATCH, **load_options):
    """A Ray Dataset of spans (column ``text``; ``id``, ``lang`` optional) -> a Dataset of `OUTPUT_SCHEMA` rows.

    For use inside a Ray program (`ray.init` done by the caller): lazy like every Ray Data
    transform; write it with ``.write_parquet(...)`` or consume it. `workers` actors, each with
    one Linker loaded once. Unlike `normalize_ray` it is not exactly-once by itself: Ray Data's
    writers are not. Rows are checked as they are linked (an empty text fails the job).
    """
    ray = import_ray()
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, found {workers}")
    return dataset.map_batches(
        BatchLinker, fn_constructor_kwargs={"index": str(index), "load_options": load_options, "k": k, "lang": lang},
        batch_size=batch_size, batch_format="pyarrow", num_cpus=1, compute=ray.data.ActorPoolStrategy(size=workers),
    )


__all__ = ["RESULT_SCHEMA", "ScaleoutSummary", "import_ray", "link_dataset", "normalize_ray", "ray_session"]
