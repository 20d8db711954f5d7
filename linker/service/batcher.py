"""The service's workers: a `MentionBatcher` per index links the mentions of concurrent requests together, and one
`Tagger` tags /annotate's texts. Each owns one thread and a bounded queue; requests await them without holding one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linker.errors import ConfigError
from linker.link import Linker
from linker.service.guards import BusyError

log = logging.getLogger(__name__)


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


class MentionBatcher:
    """Links the mentions of concurrent requests together, fairly, on one worker thread per index.

    Each round the worker takes an equal share of one call's worth of mentions from every waiting
    request (at least one each, oldest first, the rest next round) and links them in one call per
    (k, lang). A call is sized to take about `CALL_SECONDS`, from the measured cost per mention
    (it differs by index kind, text length and the machine's load): a sparse product or an encoder
    pass over dozens of queries costs little more than over one, so small concurrent requests share
    work, and a request of 1,000 long mentions is cut into slices, so a one-mention request that
    arrives behind it waits for about two calls, not for all of it. That worker is the only thread
    that touches its `Linker`, which keeps the Linker's lazy caches safe.
    """

    CALL_SECONDS = 0.2  # per Linker.link call: ~10% of it is per-call overhead at tf-idf's ~3 ms a mention
    # At most 256 mentions a call; at least 16, which keeps the per-call overhead (~8 mentions' worth for tf-idf)
    # at most about a third of a call even when the machine is so loaded that 16 take longer than CALL_SECONDS.
    MIN_BATCH, MAX_BATCH = 16, 256

    def __init__(self, linker: Linker, name: str, max_pending: int = 20_000) -> None:
        self.linker = linker
        self.max_pending = max_pending
        self._pending = 0  # mentions admitted and not yet finished
        self._seconds_per_mention = 0.003  # running estimate, updated after every call
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"linker-batcher-{name}", daemon=True).start()

    def batch_size(self) -> int:
        """Mentions in the next call: as many as take about CALL_SECONDS at the measured cost."""
        return max(self.MIN_BATCH, min(self.MAX_BATCH, int(self.CALL_SECONDS / max(self._seconds_per_mention, 1e-6))))

    def submit(self, texts: list[str], langs: list[str | None], k: int, on_done: Callable[[_Job], None]) -> _Job:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        with self._lock:
            if self._pending + len(texts) > self.max_pending:
                raise BusyError(f"{self._pending} mentions are waiting")
            self._pending += len(texts)
        job = _Job(texts, langs, k, on_done, [None] * len(texts))
        self._queue.put(job)
        return job

    async def link(self, texts: list[str], langs: list[str | None], k: int) -> list:
        """The LinkResults of `texts`, awaited without holding a thread."""
        job = await _completion(lambda done: self.submit(texts, langs, k, done))
        return job.results

    def _run(self) -> None:
        active: deque[_Job] = deque()
        while True:
            if not active:
                active.append(self._queue.get())
            while True:
                try:
                    active.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch = self.batch_size()
            share = max(1, batch // len(active))
            round_: list[tuple[_Job, int, int]] = []
            size = 0
            for _ in range(len(active)):
                if size >= batch:
                    break
                job = active.popleft()
                stop = min(job.next + share, len(job.texts), job.next + batch - size)
                round_.append((job, job.next, stop))
                size += stop - job.next
                job.next = stop
                if stop < len(job.texts):
                    active.append(job)  # back of the line: the others get their share first
            self._link_round(round_)
            for job, _start, _stop in round_:
                if not job.finished and (job.error is not None or job.next == len(job.texts)):
                    self._finish(job)
            if any(job.finished for job in active):
                active = deque(job for job in active if not job.finished)

    def _link_round(self, round_: list[tuple[_Job, int, int]]) -> None:
        groups: dict[tuple[int, str | None], list[tuple[_Job, int]]] = {}
        for job, start, stop in round_:
            for i in range(start, stop):
                groups.setdefault((job.k, job.langs[i]), []).append((job, i))
        for (k, lang), items in groups.items():
            self._link_items(items, k, lang)

    def _link_items(self, items: list[tuple[_Job, int]], k: int, lang: str | None) -> None:
        started = time.perf_counter()
        try:
            results = self.linker.link([job.texts[i] for job, i in items], k=k, lang=lang)
            # a moving average: follows a change of load within a few calls, ignores one slow call
            cost = (time.perf_counter() - started) / len(items)
            self._seconds_per_mention = 0.7 * self._seconds_per_mention + 0.3 * cost
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
            jobs = list(dict.fromkeys(job for job, _ in items))
            if len(jobs) > 1:  # one request's input must not fail the others: retry each alone
                for job in jobs:
                    self._link_items([(j, i) for j, i in items if j is job], k, lang)
            else:
                jobs[0].error = exc
            return
        for (job, i), result in zip(items, results, strict=True):
            job.results[i] = result

    def _finish(self, job: _Job) -> None:
        job.finished = True
        with self._lock:
            self._pending -= len(job.texts)
        try:
            job.on_done(job)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the worker
            log.exception("linker batcher: a request's completion callback failed")


@dataclass(eq=False)
class TagJob:
    """One /annotate request's texts; the tagger's worker tags them a slice at a time, interleaved with others."""

    texts: list[str]
    threshold: float | None
    style: str
    on_done: Callable[[TagJob], None]
    results: list = field(default_factory=list)  # the spans of each text tagged so far
    model: str = ""  # the tagger's revision
    next: int = 0  # first text not yet tagged
    error: BaseException | None = None


def _load_tagger() -> Any:
    from linker.extract import load_extractor  # torch: imported on the first /annotate, not at start-up

    return load_extractor()


class Tagger:
    """Runs the /annotate tagger (linker-ae) on one worker thread of its own, behind a queue bounded in characters.

    Its own thread, not the shared threadpool: the tagger is one torch model behind a lock, so from the threadpool
    40 waiting /annotate requests held all 40 threads and /link waited for one (48 texts of 8,000 characters at
    once: /link up to 7.5 s, the last /annotate 43.6 s, no 429). Here a waiting request is a queued job that holds
    no thread, and one that would take the characters waiting past `max_pending` is refused at once (BusyError).
    Each turn tags the next slice of one request (its next texts up to SLICE_CHARS, at least one) and sends it to
    the back of the line, so a short document is not held behind a long one. The tagger loads on the worker at
    the first request: a service never asked to annotate never imports torch.
    """

    SLICE_CHARS = 2_000  # ~0.2-0.5 s of tagging on 2 shared cores; a text is never cut (the tagger windows it)

    def __init__(self, max_pending: int, load: Callable[[], Any] = _load_tagger) -> None:
        self.max_pending = max_pending
        self._load = load
        self._pending = 0  # characters admitted and not yet finished
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[TagJob] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="linker-tagger", daemon=True).start()

    def submit(self, texts: list[str], threshold: float | None, style: str,
               on_done: Callable[[TagJob], None]) -> TagJob:
        """Queue `texts`; `on_done(job)` runs on the worker thread with job.results or job.error set."""
        chars = sum(map(len, texts))
        with self._lock:
            if self._pending + chars > self.max_pending:
                raise BusyError(f"{self._pending} characters are waiting")
            self._pending += chars
        job = TagJob(texts, threshold, style, on_done)
        self._queue.put(job)
        return job

    async def extract(self, texts: list[str], *, threshold: float | None, style: str) -> TagJob:
        """The tagged job (spans of each text in job.results, the tagger's revision in job.model), awaited without
        holding a thread."""
        return await _completion(lambda done: self.submit(texts, threshold, style, done))

    def _run(self) -> None:
        active: deque[TagJob] = deque()
        while True:
            if not active:
                active.append(self._queue.get())
            job = active.popleft()
            try:
                self._tag_slice(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, never lost
                job.error = exc
            while True:  # requests that came during this slice go before its next one
                try:
                    active.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if job.error is None and job.next < len(job.texts):
                active.append(job)  # back of the line: the others get their slice first
            else:
                self._finish(job)

    def _tag_slice(self, job: TagJob) -> None:
        extractor = self._load()
        stop, size = job.next + 1, len(job.texts[job.next])
        while stop < len(job.texts) and size + len(job.texts[stop]) <= self.SLICE_CHARS:
            size += len(job.texts[stop])
            stop += 1
        job.results += extractor.extract(job.texts[job.next:stop], threshold=job.threshold, style=job.style)
        job.model, job.next = extractor.revision, stop

    def _finish(self, job: TagJob) -> None:
        with self._lock:
            self._pending -= sum(map(len, job.texts))
        try:
            job.on_done(job)
        except Exception:  # noqa: BLE001 - a broken callback must not stop the worker
            log.exception("linker tagger: a request's completion callback failed")


@dataclass
class LoadedIndex:
    """An index the service serves: its Linker, the batcher (the only thread that calls it), its languages."""

    name: str
    linker: Linker
    batcher: MentionBatcher
    languages: frozenset[str]


def load_indexes(index_dirs: Sequence[str | Path], max_pending: int = 20_000,
                 linker_options: dict | None = None) -> dict[str, LoadedIndex]:
    """Load each index folder once; its name is the folder name (which must be unique).

    `linker_options`: keyword arguments of `Linker.load` (rerank, rerank_k, min_confidence) for every index.
    """
    if not index_dirs:
        raise ConfigError("no index given; pass --index DIR (one or more)")
    loaded: dict[str, LoadedIndex] = {}
    for folder in index_dirs:
        name = Path(folder).resolve().name
        if name in loaded:
            raise ConfigError(f"two indexes named {name!r}; index folders must have distinct names")
        lk = Linker.load(folder, **(linker_options or {}))
        loaded[name] = LoadedIndex(name, lk, MentionBatcher(lk, name, max_pending), frozenset(lk.languages))
        log.info("loaded index %s (%s)", name, lk.version)
    return loaded
