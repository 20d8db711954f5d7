"""Ray engine for index builds: the name chunks of a dense build encoded by Ray actors.

`linker index build --engine ray` (`DenseConfig(engine="ray")`) hands `linker.index.dense.encode_names`
a `RayEncoding` instead of encoding in its own process: this module registers it as the ``ray`` entry of
`linker.index.dense.ENCODING_ENGINES`, where the build looks engines up by name. Each actor loads the encoder once, by the
name the build resolved (a shipped or builtin name, or an absolute folder that every node must
see), in the build's precision, on one CPU; the driver keeps two chunks in flight per actor and
writes each returned chunk into its memmap and ``progress.json``, as a local build does. So:

- a killed driver loses only the chunks in flight: run the same command again and the finished
  chunks are not encoded again;
- a worker process that dies is restarted by Ray and its chunk tried again (`MAX_TASK_RETRIES`);
  a chunk that still fails ends the build with one line, its finished chunks kept for the rerun.

Actors encode eagerly (no torch.compile) with one thread each: their vectors can differ from a
compiled or multi-threaded local build by rounding only (eval/scale/report.md measures both).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from linker.errors import LinkerError
from linker.index.dense import ENCODING_ENGINES, STAT_FIELDS

log = logging.getLogger(__name__)

MAX_TASK_RETRIES = 3  # tries of a chunk whose actor died under it, after the first
IN_FLIGHT = 2  # chunks per actor: one encoding, one waiting, so an actor never idles on the driver


class _EncodeWorker:
    """A Ray actor holding one encoder (`ray.remote` is applied when a build starts: importing this module needs no Ray)."""

    def __init__(self, name: str, precision: str, batch_size: int, token_budget: int) -> None:
        from linker.encoders import load_encoder

        self.encoder = load_encoder(name, precision=precision, threads=1)
        self.batch_size, self.token_budget = batch_size, token_budget

    def encode(self, texts: list[str]) -> tuple[np.ndarray, dict]:
        vectors = self.encoder.encode(texts, role="passage", batch_size=self.batch_size, token_budget=self.token_budget)
        stats = self.encoder.last_stats
        return vectors, {field: getattr(stats, field) for field in STAT_FIELDS}

    def pid(self) -> int:
        return os.getpid()


class RayEncoding:
    """Encodes `encode_names`' chunks on Ray actors; `config` is the build's `DenseConfig` (workers, address)."""

    def __init__(self, encoder, config) -> None:
        name = encoder.spec.name
        if Path(name).exists():  # a folder: absolute, so that actors started elsewhere find it
            name = str(Path(name).resolve())
        self.name, self.precision = name, encoder.precision
        self.batch_size, self.token_budget = config.batch_size, config.token_budget
        self.workers, self.address = config.workers, config.address or None
        self.used_workers = 0

    def describe(self) -> dict:
        return {"engine": "ray", "workers": self.used_workers, "address": self.address or "local"}

    def run(self, jobs: Iterable[tuple[int, list[str]]], advance: Callable[[int], None]
            ) -> Iterator[tuple[int, np.ndarray, dict]]:
        """(chunk, vectors, stats) for each job, in the order they finish."""
        from linker.engine.ray import ray_session

        with ray_session(address=self.address, workers=self.workers or os.cpu_count() or 1) as ray:
            actor_type = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=MAX_TASK_RETRIES)(_EncodeWorker)
            count = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            actors = [actor_type.remote(self.name, self.precision, self.batch_size, self.token_budget)
                      for _ in range(count)]
            self.used_workers = count
            log.info("encoding on %d Ray actors", count)
            jobs = iter(jobs)
            pending: dict = {}  # object ref -> (chunk, rows, actor)

            def submit(actor) -> None:
                job = next(jobs, None)
                if job is not None:
                    chunk, texts = job
                    pending[actor.encode.remote(texts)] = (chunk, len(texts), actor)

            for actor in actors:
                for _ in range(IN_FLIGHT):
                    submit(actor)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                chunk, rows, actor = pending.pop(ready[0])
                try:
                    vectors, stats = ray.get(ready[0])
                except ray.exceptions.RayError as exc:
                    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                    raise LinkerError(f"encoding chunk {chunk} on Ray failed after {MAX_TASK_RETRIES + 1} tries "
                                      f"({first}); the finished chunks are kept: run the build again to resume") from None
                advance(rows)
                yield chunk, vectors, stats
                submit(actor)


ENCODING_ENGINES.register("ray", RayEncoding)
