"""`calibrate`: fit an index's confidence map on held-in mentions and store it in the index folder.

Held-in means mentions with gold ids that the test set does not contain (a dev split, or
training mentions that are not also names of the index's dictionary: a mention that is itself a
dictionary name is an exact hit and would teach the map that every score is right). Each mention
gives one pair (its best candidate's final score, whether that candidate is right); mentions
without any candidate are left out (they are "no link" whatever the map says).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from linker.confidence import expected_calibration_error, fit_isotonic, raw_probability, write_calibration
from linker.errors import ConfigError
from linker.eval.datasets import load_dataset
from linker.eval.metrics import mention_hits
from linker.eval.report import gold_matcher, predict, top_of

log = logging.getLogger(__name__)


def calibrate(
    index_dir: str | Path,
    dataset_spec: str,
    *,
    rerank: str | Path | None = None,
    rerank_k: int | None = None,
    composite: str = "all",
    gold_via_xref: str | None = None,
    query_lang: bool = False,
    progress: bool | None = None,
) -> dict:
    """Link `dataset_spec` with the index (and re-ranker), fit isotonic P(correct | score), store it.

    Returns a summary: mentions used, held-in Acc@1, ECE of the raw score and of the fitted map
    (in-sample, so an optimistic figure; `linker eval` measures it on the test set).
    """
    from linker.link import Linker
    from linker.rerank import DEFAULT_RERANK_K

    started = time.perf_counter()
    linker_ = Linker.load(index_dir, rerank=rerank, rerank_k=rerank_k or DEFAULT_RERANK_K)
    linker_.calibration = None  # fit on the scorer's raw scores, whatever an earlier calibration said
    mentions = load_dataset(dataset_spec)
    if not mentions:
        raise ConfigError(f"{dataset_spec}: no mentions with gold ids to calibrate on")
    ranked = predict(linker_, mentions, 1, query_lang=query_lang, progress=progress)
    expand, _known = gold_matcher(linker_, gold_via_xref=gold_via_xref)
    correct = mention_hits([m.gold for m in mentions], [tuple(r.ids for r in q) for q in ranked], 1,
                           composite=composite, expand=expand)
    scores = top_of(ranked, "top_score")
    keep = np.isfinite(scores)
    calibration = fit_isotonic(scores[keep], correct[keep], scorer=linker_.scorer, fitted_on=dataset_spec)
    manifest = write_calibration(index_dir, calibration)
    summary = {
        "index": str(index_dir),
        "dataset": dataset_spec,
        "scorer": calibration.scorer,
        "mentions": len(mentions),
        "with_candidate": int(keep.sum()),
        "accuracy_at_1": round(float(correct[keep].mean()), 6),
        "ece_raw": round(expected_calibration_error(raw_probability(scores[keep], linker_.scorer), correct[keep]), 6),
        "ece_fitted_in_sample": round(expected_calibration_error(calibration(scores[keep]), correct[keep]), 6),
        "breakpoints": len(calibration.x),
        "files": sorted(manifest["files"]),
        "seconds": round(time.perf_counter() - started, 2),
    }
    log.info("calibrated %s on %d mentions: Acc@1 %.4f, ECE raw %.4f -> %.4f (in-sample)", index_dir,
             summary["with_candidate"], summary["accuracy_at_1"], summary["ece_raw"], summary["ece_fitted_in_sample"])
    return summary
