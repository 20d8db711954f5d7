"""Resumable stages of the long evaluation scripts (ncbi_biosyn.py, hybrid_tuning.py, train_multilingual.py).

A stage whose output exists is skipped (unless `rebuild`); the others are timed, with the load
average after each. An index is "existing" only when built from the encoder and re-ranker as they
are now (`index_current`). Timings of the stages a re-run skips are kept from the script's previous
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


def recheck_carried(stage: Stages, model: Path, recheck: Path, compute: Callable[[], dict]) -> float | None:
    """A BioSyn model trained on another kind of machine (a lent GPU) and carried here, maybe as fp16
    (scripts/model_transfer.py): its watched number again from the weights as they are here, to show the hand-off
    changed nothing that counts. `compute` returns the record kept in `recheck` (once), with the number under
    "watched_dense_acc1_here"; None for a model trained on this kind of machine."""
    import torch

    from linker.fileio import atomic_file

    trained = json.loads((model / "train_metrics.json").read_text())["extra"]["hardware"].get("device", "cpu")
    if trained != ("cuda" if torch.cuda.is_available() else "cpu"):
        def run() -> None:
            with atomic_file(recheck) as tmp:
                tmp.write_text(json.dumps(compute()))
        stage("recheck_watched_acc1", recheck.exists(), run)
    return json.loads(recheck.read_text())["watched_dense_acc1_here"] if recheck.exists() else None


def index_current(folder: Path, encoder: str | None = None, reranker: Path | None = None,
                  prior: list[str] | tuple[str, ...] = ()) -> bool:
    """An index in `folder` exists and was built with `encoder` and the bound `reranker` as they are now:
    retraining a model folder of the same path (more epochs) makes every index built from it stale. With `prior`
    specs, an index whose tie prior came from other specs, or has no per-name counts (built before them), is stale."""
    path = folder / "manifest.json"
    if not path.exists():
        return False
    manifest = json.loads(path.read_text())
    stale = []
    if encoder is not None:
        from linker.encoders import resolve_encoder

        stale += [encoder] if manifest["encoder"]["revision"] != resolve_encoder(encoder).revision else []
    if reranker is not None:
        from linker.dictionary import sha256_file
        from linker.rerank import weights_file

        stale += [str(reranker)] if (manifest.get("reranker") or {}).get("sha256") != sha256_file(weights_file(reranker)) else []
    if prior:
        entry = manifest.get("prior") or {}
        stale += ["the tie prior"] if entry.get("specs") != list(prior) or "names" not in entry else []
    if stale:
        log.info("%s: built with another version of %s, rebuilt", folder, " and ".join(stale))
    return not stale
