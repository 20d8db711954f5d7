"""Progress of long steps: a tqdm bar with rate and ETA on a terminal, periodic log lines elsewhere.

Every step that can take more than a few seconds (dictionary build, tf-idf fit, encoding, FAISS,
linking files, evaluation) reports through `bar` or `track`, so a user at a terminal sees a bar
and a log file or CI output gets one INFO line every `LOG_EVERY_SECONDS` instead of a bar
redrawn into it. The CLI's `-q` turns both off (`set_enabled(False)`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

log = logging.getLogger("linker.progress")

LOG_EVERY_SECONDS = 30.0  # often enough to show life in a log, rare enough not to flood it
NOTE_AFTER_SECONDS = 2.0  # a step without a bar that runs longer than this says what it is doing (`note`)
T = TypeVar("T")
_enabled = True


def set_enabled(enabled: bool) -> None:
    """Switch progress reporting (bars and log lines) on or off for this process."""
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    """Whether progress reporting is on (`set_enabled`)."""
    return _enabled


def on_terminal() -> bool:
    """A bar is drawn only where a person watches: stderr is a terminal and progress is on."""
    return _enabled and sys.stderr.isatty()


class LogProgress:
    """The part of tqdm's interface the library uses, writing an INFO line at most every `every` s."""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int = 0, every: float = LOG_EVERY_SECONDS):
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self._start = initial
        self.every = every
        self.postfix = ""
        self._started = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if _enabled and now - self._last >= self.every:
            self._last = now
            log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self._started, 1e-9)
        rate = (self.n - self._start) / elapsed
        text = f"{self.desc}: {self.n:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit}s ({100 * self.n / self.total:.0f}%)"
        else:
            text += f" {self.unit}s"
        text += f", {rate:,.1f} {self.unit}s/s, {tqdm.format_interval(elapsed)} elapsed"
        if self.total and rate > 0:
            text += f", ETA {tqdm.format_interval((self.total - self.n) / rate)}"
        return text + (f", {self.postfix}" if self.postfix else "")

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        pass

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(total: int | None = None, *, desc: str, unit: str = "item", initial: int = 0,
        show: bool | None = None) -> tqdm | LogProgress:
    """A progress reporter with `update(n)`, `set_postfix_str`, `close` (and `with` support).

    show: None picks by `on_terminal()`; True forces a bar, False forces log lines.
    """
    if show if show is not None else on_terminal():
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr, dynamic_ncols=True,
                    unit_scale=total is None or total >= 10_000)
    return LogProgress(total, desc, unit, initial)


def track(items: Iterable[T], *, total: int | None = None, desc: str, unit: str = "item",
          show: bool | None = None) -> Iterator[T]:
    """Yield `items`, reporting progress per item (total: len(items) when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with bar(total, desc=desc, unit=unit, show=show) as reporter:
        for item in items:
            yield item
            reporter.update(1)


@contextmanager
def note(desc: str, *, after: float = NOTE_AFTER_SECONDS, show: bool | None = None) -> Iterator[None]:
    """Say what a step without a bar is doing, once it has run for `after` seconds (a quick one says nothing).

    On a terminal: ``desc ...`` on stderr, completed with `` done in 12.3 s`` on the same line when the step
    ends; elsewhere one INFO line of `linker.progress` (shown by default, `-q` hides it). show: None picks by
    `on_terminal()`; True forces the terminal form, False the log line.
    """
    if not _enabled:
        yield
        return
    terminal = on_terminal() if show is None else show
    started = time.monotonic()
    announced = threading.Event()

    def announce() -> None:
        if terminal:
            sys.stderr.write(f"{desc} ...")
            sys.stderr.flush()
        else:
            log.info("%s ...", desc)
        announced.set()

    timer = threading.Timer(after, announce)
    timer.daemon = True
    timer.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        timer.cancel()
        timer.join()
        if announced.is_set() and terminal:
            sys.stderr.write(f" done in {time.monotonic() - started:.1f} s\n" if ok else "\n")
            sys.stderr.flush()
