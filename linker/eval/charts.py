"""A chart never costs a report: drawing runs last, and its failure is one warning line, not an error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from linker.extras import require
from linker.fileio import atomic_file

log = logging.getLogger(__name__)


class _ChartFailed(Exception):
    """Raised through `atomic_file` so that no half-written PNG is kept."""


def write_chart(path: Path, draw: Callable[[Path], None], *, overwrite: bool, tables: str = "") -> bool:
    """Draw `draw(tmp)` into `path` atomically; on any drawing error log one warning and return False.

    With `overwrite` an existing chart at `path` is an earlier run's (the caller checked it) and no longer
    matches the tables just written, so it is removed; without it, a chart there now was made by someone
    else meanwhile and is left alone.
    """
    try:
        with atomic_file(path) as tmp:
            try:
                require("matplotlib", extra="plots", what="a report's chart")  # the `plots` extra, named when absent
                draw(tmp)
            except Exception as exc:  # noqa: BLE001 - whatever matplotlib raises, the results stand
                raise _ChartFailed(exc) from exc
    except _ChartFailed as failed:
        stale = overwrite and path.is_file() and not path.is_symlink()
        if stale:
            path.unlink()
        cause = failed.__cause__
        log.warning("%s: chart not written (%s: %s)%s%s", path, type(cause).__name__,
                    " ".join(str(cause).split())[:200], ", the earlier chart removed" if stale else "",
                    f"; the report is in {tables}" if tables else "")
        return False
    return True
