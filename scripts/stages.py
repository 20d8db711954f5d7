"""Resumable stages of the long evaluation scripts (ncbi_biosyn.py, hybrid_tuning.py, train_multilingual.py).

A stage whose output exists is skipped (unless `rebuild`); the others are timed, with the load
average after each. Timings of the stages a re-run skips are kept from the script's previous
report, so a resumed run still reports every stage.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("stages")


class Stages:
    def __init__(self, previous_report: Path, *, rebuild: bool = False) -> None:
        previous = json.loads(previous_report.read_text()) if previous_report.exists() else {}
        self.seconds: dict[str, float] = dict(previous.get("stage_seconds", {}))
        self.load_after: dict[str, list[float]] = dict(previous.get("load_average_after_stage", {}))
        self.rebuild = rebuild

    def __call__(self, label: str, done: bool, fn: Callable[[], object]) -> None:
        if done and not self.rebuild:
            log.info("stage %s: output exists, skipped", label)
            return
        started = time.perf_counter()
        fn()
        self.seconds[label] = round(time.perf_counter() - started, 1)
        self.load_after[label] = [round(x, 2) for x in os.getloadavg()]
        log.info("stage %s: %.0fs (load %s)", label, self.seconds[label], self.load_after[label])
