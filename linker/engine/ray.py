"""Ray engine: `linker normalize-ray`, `linker annotate-ray` and the same inside your own Ray program.

    from linker.engine.ray import annotate_ray, normalize_ray, link_dataset
    normalize_ray("indexes/default", "spans/*.jsonl", "linked/", workers=8)      # files -> files, exactly once
    annotate_ray("indexes/meddra", "documents/*.jsonl", "coded/", workers=8)     # raw texts -> coded spans
    linked = link_dataset(ray.data.read_parquet("s3://bucket/spans/"), "indexes/default", k=3)  # Dataset -> Dataset

`normalize_ray` runs `workers` Ray actors (`ShardWorker`): each loads the index once
(`Linker.load`) and normalises whole shards with `linker.engine.shards.normalize_shard`, which
reads a shard with linker's own readers (a bad row is named by file and line as in the local CLI)
and writes its Parquet output atomically. That is what makes a job exactly-once and resumable: a
shard's output is complete or absent whichever process dies, and a re-run skips finished shards.

The driver hands out one shard at a time and owns every failure, so one shard never ends the job:
- a shard that fails (a bad row, a truncated ``.gz``, a value above the read caps, any error in its
  worker) comes back as one line naming it; the others are linked, and the run then fails with one
  line naming every failed shard, before ``_SUCCESS`` is written;
- a worker process that dies (kill -9, killed for memory, a lost node) is replaced by a fresh
  actor and its shard tried again, at most `MAX_ATTEMPTS` times in all; a shard that kills its
  worker every time (one that does not fit in memory) then fails like a bad one instead of being
  retried forever. The dead writers' temporaries are removed once the run's workers have ended.

`annotate_ray` is the same job over shards of documents (``text``, ``id``, ``lang``): each worker also loads the
tagger once and writes, per shard, one row per extracted span with its code and decision, through
`linker.extract.annotate_documents`, the pipeline behind `linker annotate` (`annotate_shard`).

`link_dataset` is a Ray Data transform (`map_batches` on an actor pool) with the same Arrow
function, `linker.engine.arrow.link_arrow`, that `linker normalize` and Spark's `mapInArrow` use.

Ray is an optional dependency (``pip install 'linker[ray]'``); importing this module does not need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

import linker
from linker.engine.arrow import OUTPUT_SCHEMA, link_arrow
from linker.engine.shards import (
    INPUT_BYTES,
    INPUT_NAME,
    INPUT_SHA256,
    Shard,
    failure_message,
    file_sha256,
    job_document,
    job_inputs,
    normalize_shard,
    prepare_output,
    read_shard,
    write_success,
)
from linker.errors import ConfigError, LinkerError
from linker.fileio import atomic_file, remove_stale_temporaries
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.formats.writers import WRITERS
from linker.link import Linker
from linker.normalize import BATCH

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Tries of a shard whose worker process dies under it (Ray's default for a task is 4: a shard that
killed its worker three times will do so again, and each try costs a worker its index load)."""


def import_ray():
    """The `ray` module, or a one-line ConfigError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (link_dataset uses Ray Data; `ray` alone lacks it)
    except ImportError:
        raise ConfigError("linker normalize-ray needs Ray, which is not installed: pip install 'linker[ray]'") from None
    return ray


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _describe(exc: BaseException, shard: Path | None = None) -> str:
    """One line for a failure, naming the shard when the message does not already."""
    if isinstance(exc, OSError) and exc.filename is not None:
        message = f"{exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, LinkerError):
        message = " ".join(str(exc).split())
    else:  # an error linker did not foresee: its type says more than a bare message
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return message if shard is None or str(shard) in message else f"{shard}: {message}"


class ShardWorker:
    """A Ray actor: one Linker (and with `extract`, one tagger), loaded once; `link` normalises (or annotates)
    one shard and reports it as a row."""

    def __init__(self, index: str, load_options: dict, k: int, lang: str | None, batch_size: int,
                 limits: ReadLimits, extract: dict | None = None) -> None:
        started = time.perf_counter()
        self.options = {"k": k, "lang": lang, "batch_size": batch_size, "limits": limits}
        self.linker, self.extractor, self.error = None, None, None
        try:
            self.linker = Linker.load(index, **load_options)
            if extract is not None:
                from linker.extract import load_extractor

                self.extractor = load_extractor(extract["model"], threads=1)  # one CPU per actor
                self.options.update(extract=extract)
        except Exception as exc:  # noqa: BLE001 - reported with every shard, so the driver shows it as one line
            self.error = _describe(exc)
        self.load_seconds = time.perf_counter() - started
        self.ready_cpu = time.process_time()

    def link(self, item: dict) -> dict:
        shard = Shard(Path(item["source"]), item["name"], Path(item["output"]))
        started = time.perf_counter()
        counts, error = {"spans": 0, "nil": 0}, None if self.error is None else f"{shard.source}: {self.error}"
        if error is None:
            try:
                if self.extractor is None:
                    counts = normalize_shard(self.linker, shard, **self.options)
                else:
                    counts = annotate_shard(self.linker, self.extractor, shard, **self.options)
            except Exception as exc:  # noqa: BLE001 - any failure is this shard's, never the job's
                error = _describe(exc, shard.source)
        return {"input": shard.name, "spans": counts["spans"], "nil": counts["nil"], "error": error,
                "pid": os.getpid(), "peak_rss_mib": _peak_rss_mib(), "link_cpu_seconds": time.process_time() - self.ready_cpu,
                "seconds": time.perf_counter() - started, "load_seconds": self.load_seconds}


# One row per extracted span of a document; `nil` (no code: a negated or hypothetical event, a drug, or no
# concept found) is the column `write_success` counts, as for normalize-ray's output.
ANNOTATE_SCHEMA = pa.schema([
    ("id", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("text", pa.string()), ("label", pa.string()),
    ("status", pa.string()), ("confidence", pa.float64()), ("code", pa.string()), ("name", pa.string()),
    ("link_confidence", pa.float64()), ("decision", pa.string()), ("nil", pa.bool_()),
])


def annotate_shard(linker: Linker, extractor, shard: Shard, *, extract: dict, k: int = 1, lang: str | None = None,
                   batch_size: int = BATCH, limits: ReadLimits = DEFAULT_LIMITS) -> dict:
    """Extract and code the documents of one shard into its output Parquet file, atomically, as
    `linker.engine.shards.normalize_shard` links spans: every row checked first, the input's sha256 recorded
    and checked again at the end. `extract`: the tagger's options (style, assertion, threshold)."""
    from linker.extract import annotate_documents

    size, digest = shard.source.stat().st_size, file_sha256(shard.source)
    for _ in read_shard(shard, batch_size=batch_size, limits=limits):
        pass  # the first pass checks every row: nothing is written if one is bad
    spans = nil = 0
    metadata = {INPUT_NAME: shard.name, INPUT_BYTES: str(size), INPUT_SHA256: digest}
    options = {key: extract[key] for key in ("style", "assertion", "threshold")}

    def tables() -> Iterator[pa.Table]:
        nonlocal spans, nil
        for batch in read_shard(shard, batch_size=batch_size, limits=limits):
            ids, texts, langs = (batch.column(c).to_pylist() for c in ("id", "text", "lang"))
            # a document's own lang wins over `lang`; one the index lacks is linked against all
            coded = annotate_documents(texts, model=extractor, linker=linker, k=k, lang=lang, langs=langs, **options)
            table = pa.Table.from_pylist(
                [{"id": ids[i], **{f: row[f] for f in ANNOTATE_SCHEMA.names if f not in ("id", "nil")},
                  "nil": row["code"] is None} for i, doc in enumerate(coded) for row in doc], schema=ANNOTATE_SCHEMA)
            spans, nil = spans + table.num_rows, nil + sum(table.column("nil").to_pylist())
            yield table

    with atomic_file(shard.output) as tmp:
        WRITERS.get("parquet").write(tables(), tmp, schema=ANNOTATE_SCHEMA.with_metadata(metadata))
        if file_sha256(shard.source) != digest:  # raising here removes the temporary: no output
            from linker.errors import InputFormatError

            raise InputFormatError(shard.source, "a shard that stays the same while it is annotated",
                                   "a file that changed meanwhile", fix="run the same command again once it is written")
    return {"input": shard.name, "spans": spans, "nil": nil}


class BatchLinker:
    """A Ray Data actor for `link_dataset`: one Linker, loaded once; batches through `link_arrow`."""

    def __init__(self, index: str, load_options: dict, k: int, lang: str | None) -> None:
        self.linker = Linker.load(index, **load_options)
        self.k, self.lang = k, lang

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_batches(
            [link_arrow(self.linker, b, k=self.k, lang=self.lang) for b in batch.to_batches() if b.num_rows],
            schema=OUTPUT_SCHEMA)


def _check_reachable(address: str, given: str, timeout: float = 5.0) -> None:
    """Refuse at once a host:port (or ray://host:port) where nothing listens: Ray itself retries such an address
    for a minute or more before it gives up. Other forms ("auto", "local") are left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise LinkerError(f"{given} {address}: no Ray cluster answered there ({exc.strerror or exc}); start one "
                          "with `ray start --head` and pass the address it prints, or leave the address out to "
                          "start a local Ray") from None


@contextlib.contextmanager
def ray_session(*, address: str | None = None, workers: int = 2):
    """Use the Ray this process is connected to; else connect to `address`, or start a local Ray
    with `workers` CPUs, and shut it down at the end."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    # Ray reads RAY_ADDRESS itself when no address is given, and then refuses the CPU count meant for a local Ray
    # (a ValueError): the variable is an address given, and named as such in errors.
    given = "--address"
    if address is None and os.environ.get("RAY_ADDRESS"):
        address, given = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address is not None:
        _check_reachable(address, given)
    saved = os.environ.get("PYTHONPATH")
    if address is None:
        # Workers of a Ray started here import the linker this process imported (a checkout, not
        # necessarily the installed copy). On a cluster, linker must be installed on every node.
        root = str(Path(linker.__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *([saved] if saved else [])])
    try:
        # Ray's own notices (its token authentication, for one) would stand beside linker's lines on
        # every run, and before the one `error:` line of a failed one; its errors still show.
        ray.init(address=address, num_cpus=workers if address is None else None, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError) as exc:  # ConnectionError is an OSError: the CLI would say "a file: ..."
        reason = " ".join(str(exc).split())[:200]
        if address is None:
            raise LinkerError(f"could not start a local Ray ({reason}); see `ray status`, or pass --address of a "
                              "running cluster") from None
        raise LinkerError(f"{given} {address}: no Ray cluster answered there ({reason}); start one with "
                          "`ray start --head` and pass the address it prints, or leave --address out to start a "
                          "local Ray") from None
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield ray
    finally:
        ray.shutdown()


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
    into `output` on Ray: one Parquet shard per input shard, then ``_SUCCESS``.

    Exactly-once and resumable (`linker.engine.shards`): run it again after a crash and it finishes
    the job; the result is byte-identical to an uninterrupted run. `load_options` go to
    `Linker.load` (rerank, rerank_k, min_confidence, precision). Inside a Ray program it uses that
    program's Ray; else it connects to `address` or starts a local Ray with `workers` CPUs. A
    failed shard (see the module docstring) fails the run with one line, once every other is done.
    """
    _ready(workers)
    job = job_document(index, k=k, lang=lang, batch_size=batch_size, load_options=load_options)
    options = {"index": str(index), "load_options": load_options, "k": k, "lang": lang, "batch_size": batch_size,
               "limits": limits}
    return _run_job(input_spec, output, job, options, protected=job_inputs(index, load_options), workers=workers,
                    address=address, overwrite=overwrite)


def annotate_ray(
    index: str | Path, input_spec: str, output: str | Path, *, model: str = "auto", style: str = "auto",
    assertion: str = "rules", threshold: float | None = None, lang: str | None = None, workers: int = 2,
    batch_size: int = 64, address: str | None = None, overwrite: bool = False, limits: ReadLimits = DEFAULT_LIMITS,
    **load_options,
) -> ScaleoutSummary:
    """`linker annotate` on Ray: every shard of documents (a folder, a glob or a file of Parquet / JSONL rows with
    ``text``, ``id`` and ``lang`` optional) into one Parquet shard of `ANNOTATE_SCHEMA` rows, then ``_SUCCESS``.

    Exactly-once and resumable as `normalize_ray`; the job document adds the tagger (name and manifest sha256)
    and its options, so a re-run with another tagger or style is refused instead of mixed. `batch_size`:
    documents per extract-and-link call. `model`: "auto" (each document's tagger by its language: both shipped
    taggers), a shipped tagger's name or a release folder."""
    from linker.extract.extractor import ASSERTIONS, BY_LANGUAGE, STYLES, release_paths
    from linker.fileio import model_inputs
    from linker.models import read_release

    _ready(workers)
    if style not in STYLES or assertion not in ASSERTIONS:
        raise ConfigError(f"style / assertion: expected one of {', '.join(STYLES)} / {', '.join(ASSERTIONS)}, "
                          f"found {style!r} / {assertion!r}")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ConfigError(f"--threshold: expected a probability between 0 and 1, found {threshold}")
    folders = release_paths(model)
    releases = [read_release(folder) for folder in folders]  # every file's sha256, on the driver, before Ray starts
    extract = {"model": model if model == BY_LANGUAGE else str(folders[0]), "style": style, "assertion": assertion,
               "threshold": threshold}
    job = {**job_document(index, k=1, lang=lang, batch_size=batch_size, load_options=load_options),
           "extract": {**extract, "model": "; ".join(release.revision for release in releases)}}
    options = {"index": str(index), "load_options": load_options, "k": 1, "lang": lang, "batch_size": batch_size,
               "limits": limits, "extract": extract}
    protected = [*job_inputs(index, load_options),
                 *(path for folder in folders for path in model_inputs(str(folder), "--model"))]
    return _run_job(input_spec, output, job, options, protected=protected, workers=workers, address=address,
                    overwrite=overwrite)


def _ready(workers: int) -> None:
    """The checks of a job before any file is read: the worker count, then Ray itself."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, found {workers}")
    import_ray()


def _run_job(input_spec: str, output: str | Path, job: dict, options: dict, *, protected: list, workers: int,
             address: str | None, overwrite: bool) -> ScaleoutSummary:
    """The shards of a job still to do through `ShardWorker` actors, then ``_SUCCESS`` (or one line naming
    every failed shard)."""
    shards, pending = prepare_output(input_spec, output, job, overwrite=overwrite, protected=protected)
    log.info("%d of %d shards to do (%d done before)", len(pending), len(shards), len(shards) - len(pending))
    results: list[dict] = []
    if pending:
        with ray_session(address=address, workers=workers) as ray:
            results = _run_shards(ray, pending, options, min(workers, len(pending)))
        for folder in sorted({s.output.parent for s in pending}):
            remove_stale_temporaries(folder)  # of workers that died: every writer of this run has ended
    errors = sorted((r["input"], r["error"]) for r in results if r["error"])
    if errors:
        raise LinkerError(failure_message(errors, len(shards)))
    return ScaleoutSummary(write_success(output, shards, job), len(results), _per_worker(results))


def _run_shards(ray, pending: list[Shard], options: dict, size: int) -> list[dict]:
    """Every pending shard through at most `size` `ShardWorker` actors; one result row per shard.

    Ray never restarts an actor here (max_restarts=0, max_task_retries=0): the driver starts a fresh
    one when a shard needs it and counts each shard's tries itself, so the bound is per shard."""
    worker_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(ShardWorker)
    queue = deque((shard, 1) for shard in pending)
    idle: list = []
    running: dict = {}  # call -> (actor, shard, try)
    results: list[dict] = []
    try:
        while queue or running:
            while queue and (idle or len(running) < size):
                actor = idle.pop() if idle else worker_class.remote(**options)
                shard, attempt = queue.popleft()
                # absolute: a worker's working folder is not the driver's (`..` kept: symlinks decide it)
                item = {"source": str(shard.source.absolute()), "name": shard.name, "output": str(shard.output.absolute())}
                running[actor.link.remote(item)] = (actor, shard, attempt)
            [done], _ = ray.wait(list(running), num_returns=1)
            actor, shard, attempt = running.pop(done)
            try:
                row = ray.get(done)
                idle.append(actor)
            except ray.exceptions.RayError as exc:  # the worker process died, or Ray lost it
                ray.kill(actor)
                reason = _death(ray, exc)
                if attempt < MAX_ATTEMPTS:
                    log.warning("shard %s: its worker %s; trying it again (%d of %d)", shard.name, reason,
                                attempt + 1, MAX_ATTEMPTS)
                    queue.append((shard, attempt + 1))
                    continue
                row = {"input": shard.name, "spans": 0, "nil": 0, "pid": -1, "peak_rss_mib": 0.0,
                       "link_cpu_seconds": 0.0, "seconds": 0.0, "load_seconds": 0.0,
                       "error": f"{shard.source}: its worker {reason}, on each of {MAX_ATTEMPTS} tries; not tried "
                                "again (split the shard if it does not fit in a worker's memory)"}
            results.append(row)
            log.info("shard %d/%d %s: %s", len(results), len(pending), row["input"],
                     f"failed: {row['error']}" if row["error"] else f"{row['spans']:,} spans in {row['seconds']:.1f}s")
    finally:
        for actor in idle + [actor for actor, _, _ in running.values()]:
            ray.kill(actor)
    return results


def _death(ray, exc: Exception) -> str:
    """What happened to a worker, in a few words, from Ray's (multi-line) exception."""
    text = str(exc)
    # Ray's memory monitor says so in the exit type; a plain kill's text lists the OOM killer among
    # the "common causes", so the word "memory" alone proves nothing.
    if isinstance(exc, getattr(ray.exceptions, "OutOfMemoryError", ())) or re.search(
            r"NODE_OUT_OF_MEMORY|running low on memory", text):
        return "was killed for lack of memory by Ray's memory monitor"
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    first = " ".join(text.splitlines()[0].split())[:200] if text.strip() else type(exc).__name__
    if isinstance(exc, ray.exceptions.RayActorError):
        return f"process died ({exit_type.group(1) if exit_type else first}: killed, by the kernel's OOM killer for one, or crashed)"
    return f"failed in Ray ({first})"


def _per_worker(results: list[dict]) -> tuple[dict, ...]:
    workers: dict[int, dict] = {}
    for row in results:
        if row["pid"] < 0:  # a shard whose every worker died: no worker to report
            continue
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
    writers are not. Rows are checked as they are linked (an empty text fails the job). A dead
    actor is restarted as Ray Data's settings say (`DataContext`), like any other map_batches actor.
    """
    ray = import_ray()
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, found {workers}")
    return dataset.map_batches(
        BatchLinker, fn_constructor_kwargs={"index": str(index), "load_options": load_options, "k": k, "lang": lang},
        batch_size=batch_size, batch_format="pyarrow", num_cpus=1, compute=ray.data.ActorPoolStrategy(size=workers),
    )


__all__ = ["ANNOTATE_SCHEMA", "MAX_ATTEMPTS", "ScaleoutSummary", "ShardWorker", "annotate_ray", "annotate_shard", "import_ray",
           "link_dataset", "normalize_ray", "ray_session"]
