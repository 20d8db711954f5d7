"""The service's workers: one `InferencePool` (a thread per model queue, at most one per core) runs every model
call; a `MentionBatcher` per index links the mentions of concurrent requests in shared calls, and one `Tagger` tags
/annotate's texts. Each queue is bounded; requests await their results without holding a thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linker.errors import ConfigError
from linker.link import Linker
from linker.precision import available_cpus, cores_share

log = logging.getLogger(__name__)


class BusyError(Exception):
    """A queue is full: an index's mentions waiting (`max_pending_mentions`) or the tagger's characters
    (`max_pending_chars`). Raised here, where the queues are; the service answers it with a 429 (`guards.busy`)."""


async def _completion(submit: Callable[[Callable[[Any], None]], object]) -> Any:
    """The job that `submit(on_done)` queues on a worker thread, once the worker calls `on_done(job)`; awaited
    without holding a thread (the threadpool stays free for the others). Raises job.error if it failed."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def resolve(job: Any) -> None:
        if not future.done():
            if job.error is not None:
                future.set_exception(job.error)
            else:
                future.set_result(job)

    def done(job: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
            loop.call_soon_threadsafe(resolve, job)

    submit(done)
    return await future


# ----------------------------------------------------------------------------- the inference threads


class InferencePool:
    """The threads that run the service's models: every index's `MentionBatcher` and the `Tagger` take turns here.

    One thread per queue that may run a model (`attach`), at most one per core, and each call's math on the cores
    divided among them (`math_threads`: FAISS's OpenMP threads, set per pool thread, numpy's BLAS, torch's for the
    tagger; the numpy query encoder uses one thread already), so the models never run more threads than there are
    cores: one index and the tagger on 2 cores get a thread each, one core's math each; on 16 cores, 8 each.
    Before, each index and the tagger had a thread of its own and each call used every core, so a tagger's 2 torch
    threads, an index's encoder and search time-sliced 2 cores. A queue runs on one thread at a time (a `Linker`
    is not thread-safe) and one step at a time (a call, or a slice of tagging), then goes to the back of the line,
    so busy queues share the pool by turns. The threads a step starts of its own (the re-ranker's batches,
    tf-idf's search threads) are the cores over the queues with work then (`linker.precision.cores_share`).
    """

    def __init__(self, threads: int | None = None, name: str = "linker-inference") -> None:
        self._threads = threads  # None: sized when the threads start, by the queues attached then
        self.name = name
        self._sources = 0
        self._ready: deque = deque()  # queues with work and no thread on them
        self._scheduled: set[int] = set()  # ids of the queues waiting in _ready or running on a thread
        self._cond = threading.Condition()
        self._started = False

    @property
    def threads(self) -> int:
        return self._threads or max(1, min(available_cpus(), self._sources))

    @property
    def math_threads(self) -> int:
        return max(1, available_cpus() // self.threads)

    def attach(self, source: Any) -> None:
        """Count `source` (a MentionBatcher or Tagger) among the queues this pool's threads are sized for."""
        with self._cond:
            self._sources += 1

    def wake(self, source: Any) -> None:
        """`source` has work: line it up for a thread unless it is lined up or running. The threads start at the
        first call, once the app made its queues and loaded its indexes (their math libraries then exist)."""
        with self._cond:
            if not self._started:
                self._started = True
                self._threads = self.threads  # fixed from now on
                for i in range(self._threads):
                    threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True).start()
            if id(source) not in self._scheduled:
                self._scheduled.add(id(source))
                self._ready.append(source)
                self._cond.notify()

    def _run(self) -> None:
        _limit_math_threads(self.math_threads)
        while True:
            with self._cond:
                while not self._ready:
                    self._cond.wait()
                source = self._ready.popleft()
                # The step's own threads (the re-ranker's batches, tf-idf's search): the cores over the queues
                # with work, so an index's call gets both of 2 cores while the tagger is idle, and one when not.
                share = max(1, available_cpus() // max(1, len(self._scheduled)))
            try:
                with cores_share(share):
                    source.step()
            except Exception:  # noqa: BLE001 - a step hands its errors to its requests; this is a bug
                log.exception("%s: a step of %s failed", self.name, type(source).__name__)
            with self._cond:
                if source.has_work():  # checked under the lock that `wake` takes: no wake-up is lost
                    self._ready.append(source)
                    self._cond.notify()
                else:
                    self._scheduled.discard(id(source))


def _limit_math_threads(threads: int) -> None:
    """Each model call's math on `threads` threads: FAISS's OpenMP threads for calls from this thread (OpenMP keeps
    the setting per calling thread) and numpy's BLAS, which a flat dense search runs on (process-wide: the service's
    models all run on this pool). One thread each on a loaded 2-core machine searched 150,749 names 1.8x faster than
    two (71 vs 129 ms for 1 query, 0.65 vs 1.31 s for 80, load average 8-9): a second BLAS thread waits for a core.
    torch's threads are set when the tagger loads (`_load_tagger`)."""
    faiss = sys.modules.get("faiss")  # a dense index imported it before the pool started; tf-idf never does
    if faiss is not None:
        faiss.omp_set_num_threads(threads)
    with contextlib.suppress(ImportError):  # threadpoolctl comes with scikit-learn, a base dependency
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")


# ----------------------------------------------------------------------------- the bounded queues


class _WorkQueue:
    """What the `MentionBatcher` and the `Tagger` share: requests queued for the pool's threads, bounded by the work
    admitted and not yet finished (`max_pending` of `UNIT`: mentions, characters), a request past it refused at once
    (BusyError, the service's 429), each request answered by its `on_done` on the worker thread."""

    UNIT = "items"  # what `max_pending` counts, named in the BusyError
    NAME = "linker queue"  # in the log line of a failed completion callback

    def __init__(self, max_pending: int, pool: InferencePool) -> None:
        self.max_pending = max_pending
        self.pool = pool
        self.pool.attach(self)
        self._pending = 0  # work admitted and not yet finished
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._active: deque = deque()  # admitted jobs with work left (the pool's thread's)

    def _admit(self, size: int, make_job: Callable[[], Any]) -> Any:
        """Queue the job `make_job()` of `size` units and wake the pool; BusyError, and nothing queued, when it
        would take the work waiting past `max_pending`."""
        with self._lock:
            if self._pending + size > self.max_pending:
                raise BusyError(f"{self._pending} {self.UNIT} are waiting")
            self._pending += size
        job = make_job()
        self._queue.put(job)
        self.pool.wake(self)
        return job

    def has_work(self) -> bool:
        return bool(self._active) or not self._queue.empty()

    def _take_queued(self) -> None:
        """Move the queued requests to the back of `_active`."""
        while True:
            try:
                self._active.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _answer(self, job: Any, size: int) -> None:
        """`job` is done (results or error set): its `size` units leave the bound, and its request is answered."""
        with self._lock:
            self._pending -= size
        try:
            job.on_done(job)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the worker
            log.exception("%s: a request's completion callback failed", self.NAME)


# ----------------------------------------------------------------------------- linking: MentionBatcher


@dataclass(eq=False)
class _Job:
    """One request's mentions; the worker links them a share at a time, interleaved with others."""

    texts: list[str]
    langs: list[str | None]
    k: int
    on_done: Callable[[_Job], None]
    results: list = field(default_factory=list)
    next: int = 0  # first mention not yet handed to the linker
    error: BaseException | None = None
    finished: bool = False


class CallCost:
    """The seconds of a `Linker.link` call of n mentions, fitted as ``fixed + per_mention * n`` over the last calls.

    A dense index pays a fixed part per call whatever its size (the query encoder's set-up; a flat search reads
    every name vector, 231 MB at 150,749 names, once per call) beside the encoding of each mention; tf-idf's fixed
    part is ~0. Fitted by least squares when the last calls differ in size; when they are all alike, only the
    machine's load changed, and both parts are scaled to the latest call.
    """

    WINDOW = 16  # calls: enough sizes to tell the two parts apart, recent enough to follow a change of load

    def __init__(self, per_mention: float) -> None:
        self.fixed, self.per_mention = 0.0, per_mention
        self._calls: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)

    def predict(self, n: int) -> float:
        return self.fixed + self.per_mention * n

    def add(self, n: int, seconds: float) -> None:
        self._calls.append((n, seconds))
        sizes, times = zip(*self._calls)
        mean_n, mean_t = sum(sizes) / len(sizes), sum(times) / len(times)
        var = sum((s - mean_n) ** 2 for s in sizes)
        cov = sum((s - mean_n) * (t - mean_t) for s, t in self._calls)
        if var > 0 and cov > 0:
            # a fixed part between 0 and the cheapest call's time: noise on a loaded machine moves the fit a lot
            self.fixed = min(max(0.0, mean_t - cov / var * mean_n), min(times))
            self.per_mention = max((mean_t - self.fixed) / mean_n, 1e-7)
        else:
            scale = seconds / max(self.predict(n), 1e-9)
            self.fixed, self.per_mention = self.fixed * scale, max(self.per_mention * scale, 1e-7)


class MentionBatcher(_WorkQueue):
    """Links the mentions of concurrent requests in shared `Linker.link` calls, fairly, one call at a time.

    A call of many mentions costs little more than a call of one (the query encoder's set-up, a read of every name
    vector: `CallCost`), so concurrent requests share calls, as Triton's and Ray Serve's dynamic batchers do:

    - Slices: each call takes up to `batch_size()` mentions of every waiting request, so a small request goes whole
      and a request of 1,000 mentions is cut into slices of about `CALL_SECONDS` of work (never so small that the
      fixed part passes `FIXED_SHARE` of it); a one-mention request that arrives behind it rides the next call.
      Past MAX_BATCH mentions in all, the requests get max-min fair shares (one that needs less than its share goes
      whole and leaves the rest to the others). A request not finished goes to the back of the line. Before, a call
      held `batch_size()` mentions in all, cut into equal shares: on a loaded machine a dense call of 16 took ~0.6 s,
      so calls were sized at the minimum, 16, and 8 requests of 10 mentions went 2 mentions each into 5 calls.
    - Waiting: a call that is not full waits for as many requests as were in flight when the last call ended,
      until the fixed cost of a call has passed since that end: what running the latecomers in a call of their
      own would cost. Clients answered by one call come back within a few ms of each other; without the wait, the
      first back rode alone and the rest waited a whole call for the next one (8 clients of 10 mentions: calls of
      60 and 20 in turn). A lone client, or the first request after a pause, never waits.

    Runs on an `InferencePool` (its own one-thread pool when none is given), one thread at a time: that thread
    is the only one that touches its `Linker` then, which keeps the Linker's lazy caches safe.
    """

    CALL_SECONDS = 0.2  # per Linker.link call: ~10% of it is per-call overhead at tf-idf's ~3 ms a mention
    # At most 256 mentions a call; at least 16, which keeps the per-call overhead (~8 mentions' worth for tf-idf)
    # at most about a third of a call even when the machine is so loaded that 16 take longer than CALL_SECONDS.
    MIN_BATCH, MAX_BATCH = 16, 256
    FIXED_SHARE = 0.2  # the fixed part at most a fifth of a call: a call linked at >= 80% of the batched rate

    UNIT, NAME = "mentions", "linker batcher"

    def __init__(self, linker: Linker, name: str, max_pending: int = 20_000, pool: InferencePool | None = None) -> None:
        super().__init__(max_pending, pool or InferencePool(1, name=f"linker-batcher-{name}"))
        self.linker = linker
        self.cost = CallCost(0.003)  # the first guess: tf-idf's cost a mention; the fit takes over after one call
        self._expected = 1  # requests in flight at the last call's end: how many a call that is not full waits for
        self._last_call = 0.0  # when the last call ended (time.perf_counter)

    def batch_size(self) -> int:
        """Mentions in the next call: as many as take about CALL_SECONDS, and enough to make the fixed part small."""
        per_mention = max(self.cost.per_mention, 1e-6)
        by_time = (self.CALL_SECONDS - self.cost.fixed) / per_mention
        by_share = self.cost.fixed * (1 - self.FIXED_SHARE) / self.FIXED_SHARE / per_mention
        return max(self.MIN_BATCH, min(self.MAX_BATCH, int(max(by_time, by_share))))

    def submit(self, texts: list[str], langs: list[str | None], k: int, on_done: Callable[[_Job], None]) -> _Job:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        return self._admit(len(texts), lambda: _Job(texts, langs, k, on_done, [None] * len(texts)))

    async def link(self, texts: list[str], langs: list[str | None], k: int) -> list:
        """The LinkResults of `texts`, awaited without holding a thread."""
        job = await _completion(lambda done: self.submit(texts, langs, k, done))
        return job.results

    def step(self) -> None:
        """One call: gather the waiting requests, link a share of each, answer the requests that are done."""
        self._gather()
        if not self._active:
            return
        round_ = self._shares(self.batch_size())
        self._link_round(round_)
        self._last_call = time.perf_counter()
        # the requests in flight now: those this call served and those that came meanwhile
        served = {id(job) for job, _, _ in round_} | {id(job) for job in self._active}
        self._expected = len(served) + self._queue.qsize()
        for job, _start, _stop in round_:
            if not job.finished and (job.error is not None or job.next == len(job.texts)):
                self._finish(job)
        if any(job.finished for job in self._active):
            self._active = deque(job for job in self._active if not job.finished)

    def _gather(self) -> None:
        """Move the queued requests to `_active`; wait for more while the call is not full (see the class)."""
        self._take_queued()
        if not self._active:
            return
        waiting = sum(len(job.texts) - job.next for job in self._active)
        deadline = self._last_call + self.cost.fixed  # for the requests it answered, on their way back
        while waiting < self.MAX_BATCH and len(self._active) < self._expected:
            timeout = deadline - time.perf_counter()
            if timeout <= 0:
                return
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                return
            self._active.append(job)
            waiting += len(job.texts)

    def _shares(self, batch: int) -> list[tuple[_Job, int, int]]:
        """(job, start, stop) of each request in the next call: up to `batch` mentions of every waiting request, or
        max-min fair shares of MAX_BATCH when that is too many (oldest first when there are more requests than
        mentions); a request served and not finished goes to the back of the line."""
        jobs = list(self._active)
        wants = [min(len(job.texts) - job.next, batch) for job in jobs]
        level = _fair_level(wants, self.MAX_BATCH)
        round_, size = [], 0
        for job, want in zip(jobs, wants):
            take = min(want, level, self.MAX_BATCH - size)
            if take <= 0:
                break
            round_.append((job, job.next, job.next + take))
            size += take
            job.next += take
        served = {id(job) for job, _, _ in round_}
        self._active = deque([job for job in jobs if id(job) not in served]
                             + [job for job in jobs if id(job) in served])
        return round_

    def _link_round(self, round_: list[tuple[_Job, int, int]]) -> None:
        # One call per k; the languages within it are grouped by `Linker.link(langs=...)`, the one place that groups
        # mentions by language and applies its fallback rule (the checks let only the index's languages through).
        groups: dict[int, list[tuple[_Job, int]]] = {}
        for job, start, stop in round_:
            groups.setdefault(job.k, []).extend((job, i) for i in range(start, stop))
        for k, items in groups.items():
            self._link_items(items, k)

    def _link_items(self, items: list[tuple[_Job, int]], k: int) -> None:
        started = time.perf_counter()
        try:
            results = self.linker.link([job.texts[i] for job, i in items], k=k,
                                       langs=[job.langs[i] for job, i in items])
            self.cost.add(len(items), time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
            jobs = list(dict.fromkeys(job for job, _ in items))
            if len(jobs) > 1:  # one request's input must not fail the others: retry each alone
                for job in jobs:
                    self._link_items([(j, i) for j, i in items if j is job], k)
            else:
                jobs[0].error = exc
            return
        for (job, i), result in zip(items, results, strict=True):
            job.results[i] = result

    def _finish(self, job: _Job) -> None:
        job.finished = True
        self._answer(job, len(job.texts))


def _fair_level(wants: list[int], room: int) -> int:
    """The most each may take so that all of `wants` fit in `room` (max-min fair: a want below it is met whole and
    leaves the rest to the others); at least 1."""
    for i, want in enumerate(sorted(wants)):
        share = room // (len(wants) - i)
        if want > share:
            return max(share, 1)
        room -= want
    return max(wants, default=1)


# ----------------------------------------------------------------------------- tagging: Tagger


@dataclass(eq=False)
class TagJob:
    """One /annotate request's texts; the tagger's worker tags them a slice at a time, interleaved with others."""

    texts: list[str]
    threshold: float | None
    style: str
    on_done: Callable[[TagJob], None]
    lexicon: Any = None  # the names of the index the spans will be coded with (`linker.extract.lexicon_of`)
    langs: list[str | None] | None = None  # each text's "lang" as the request gives it (None: detected)
    results: list = field(default_factory=list)  # the spans of each text tagged so far
    model: str = ""  # the tagger's revision
    next: int = 0  # first text not yet tagged
    error: BaseException | None = None


def _load_tagger(threads: int) -> Any:
    from linker.extract import load_extractor  # the taggers: loaded on the first /annotate, not at start-up

    return load_extractor(threads=threads)  # its threads: the pool's share of the cores for one call


class Tagger(_WorkQueue):
    """Runs the /annotate taggers (linker-ae, linker-ae-multi: each text's by its language) on the inference pool, behind a queue bounded in characters.

    Not on the server's threadpool: the tagger is one torch model behind a lock, so from the threadpool 40 waiting
    /annotate requests held all 40 threads and /link waited for one (48 texts of 8,000 characters at once: /link up
    to 7.5 s, the last /annotate 43.6 s, no 429). Here a waiting request is a queued job that holds no thread, and
    one that would take the characters waiting past `max_pending` is refused at once (BusyError). Each step tags the
    next slice of one request (its next texts up to SLICE_CHARS, at least one) and sends it to the back of the
    line, so a short document is not held behind a long one; on a pool of 2 threads, an index's calls go on beside
    it. The tagger loads at the first request: a service never asked to annotate never imports torch.
    """

    SLICE_CHARS = 2_000  # ~0.2-0.5 s of tagging on 2 shared cores; a text is never cut (the tagger windows it)

    UNIT, NAME = "characters", "linker tagger"

    def __init__(self, max_pending: int, load: Callable[[], Any] | None = None,
                 pool: InferencePool | None = None) -> None:
        super().__init__(max_pending, pool or InferencePool(1, name="linker-tagger"))
        self._load = load or (lambda: _load_tagger(self.pool.math_threads))

    def submit(self, texts: list[str], threshold: float | None, style: str,
               on_done: Callable[[TagJob], None], lexicon: Any = None,
               langs: list[str | None] | None = None) -> TagJob:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        return self._admit(sum(map(len, texts)), lambda: TagJob(texts, threshold, style, on_done, lexicon, langs))

    async def extract(self, texts: list[str], *, threshold: float | None, style: str, lexicon: Any = None,
                      langs: list[str | None] | None = None) -> TagJob:
        """The tagged job (spans of each text in job.results, the tagger's revision in job.model), awaited without
        holding a thread; `lexicon` and `langs` (each text's language, None: detected) as
        `linker.extract.annotate_documents` takes them."""
        return await _completion(lambda done: self.submit(texts, threshold, style, done, lexicon, langs))

    def step(self) -> None:
        """Tag the next slice of the oldest request in line; requests that came meanwhile go before its next one."""
        self._take_queued()
        if not self._active:
            return
        job = self._active.popleft()
        try:
            self._tag_slice(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
            job.error = exc
        self._take_queued()
        if job.error is None and job.next < len(job.texts):
            self._active.append(job)  # back of the line: the others get their slice first
        else:
            self._finish(job)

    def _tag_slice(self, job: TagJob) -> None:
        from linker.extract import tag  # `annotate_documents`' tagging step; imported with the tagger, not at start-up

        extractor = self._load()
        stop, size = job.next + 1, len(job.texts[job.next])
        while stop < len(job.texts) and size + len(job.texts[stop]) <= self.SLICE_CHARS:
            size += len(job.texts[stop])
            stop += 1
        job.results += tag(extractor, job.texts[job.next:stop], lexicon=job.lexicon, threshold=job.threshold,
                           style=job.style, langs=None if job.langs is None else job.langs[job.next:stop])
        job.model, job.next = extractor.revision, stop

    def _finish(self, job: TagJob) -> None:
        self._answer(job, sum(map(len, job.texts)))


# ----------------------------------------------------------------------------- the indexes served


@dataclass
class LoadedIndex:
    """An index the service serves: its Linker, the batcher (the only thread that calls it), its languages."""

    name: str
    linker: Linker
    batcher: MentionBatcher
    languages: frozenset[str]


def load_indexes(index_dirs: Sequence[str | Path], max_pending: int = 20_000,
                 linker_options: dict | None = None, pool: InferencePool | None = None) -> dict[str, LoadedIndex]:
    """Load each index folder once; its name is the folder name (which must be unique). Their batchers share
    `pool` (one pool of their own when None).

    `linker_options`: keyword arguments of `Linker.load` (rerank, rerank_k, min_confidence, min_score) for every index.
    """
    if not index_dirs:
        raise ConfigError("no index given; pass --index DIR (one or more)")
    pool = pool or InferencePool()
    loaded: dict[str, LoadedIndex] = {}
    for folder in index_dirs:
        name = Path(folder).resolve().name
        if name in loaded:
            raise ConfigError(f"two indexes named {name!r}; index folders must have distinct names")
        lk = Linker.load(folder, **(linker_options or {}))
        loaded[name] = LoadedIndex(name, lk, MentionBatcher(lk, name, max_pending, pool), frozenset(lk.languages))
        log.info("loaded index %s (%s)", name, lk.version)
    return loaded
