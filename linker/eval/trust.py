"""Which links to trust: calibration error, accuracy / coverage, and "no link" (NIL) decisions.

All three look at each mention's *best* candidate: its confidence (calibrated P(correct),
`linker.confidence`) and whether it is right at k=1.

- ECE before/after: the raw score read as a probability (`raw_probability`) vs the calibrated
  confidence, 10 equal-width bins.
- Accuracy / coverage: keep the mentions whose best confidence reaches a threshold; as it falls,
  coverage rises and the accuracy of the kept mentions falls. Reported at the threshold that keeps
  90% of mentions, and drawn as a PNG.
- NIL: a seeded share of the test set's gold concepts is removed from the dictionary (their names
  masked out of the index, `Linker.link(exclude=...)`); mentions that needed one of them have no
  right answer any more and should come back "no link" (best confidence below the threshold).
  Precision / recall / F1 of the "no link" decisions at the given threshold, and the best F1 over
  all thresholds (an oracle choice, labelled as such).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from linker.confidence import DECISIONS, at_coverage, coverage_curve, expected_calibration_error, raw_probability
from linker.text import code_key

CURVE_POINTS = 101  # points of the accuracy / coverage curve kept in the JSON report
NIL_SEED = 0


def _no_candidate_as_zero(values: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(values), values, 0.0)


def calibration_section(top_score: np.ndarray, top_confidence: np.ndarray, correct: np.ndarray,
                        scorer: str, *, coverage: float = 0.9, decisions: Sequence[str] | None = None) -> dict:
    """ECE of the raw score and of the calibrated confidence; accuracy at `coverage`; the curve; with the
    Linker's `decisions` (one per mention), each decision's share and precision (`decision_table`)."""
    raw = _no_candidate_as_zero(raw_probability(top_score, scorer))
    calibrated = not np.all(np.isnan(top_confidence))
    conf = _no_candidate_as_zero(top_confidence) if calibrated else raw
    ranking = np.where(np.isfinite(top_confidence if calibrated else top_score), conf, -math.inf)
    cov, acc, thresholds = coverage_curve(ranking, correct)
    pick = np.unique(np.linspace(0, len(cov) - 1, min(CURVE_POINTS, len(cov))).astype(int)) if len(cov) else []
    return {
        "mentions": int(len(correct)),
        "accuracy_at_1": float(correct.mean()) if len(correct) else math.nan,
        "ece_raw": expected_calibration_error(raw, correct),
        "ece_calibrated": expected_calibration_error(conf, correct) if calibrated else None,
        "confidence": "calibrated" if calibrated else "raw score",
        **({"decisions": decision_table(decisions, correct)} if decisions is not None else {}),
        "at_coverage": at_coverage(ranking, correct, coverage),
        "curve": {"coverage": [round(float(cov[i]), 5) for i in pick],
                  "accuracy": [round(float(acc[i]), 5) for i in pick],
                  "threshold": [round(float(thresholds[i]), 6) for i in pick]},
    }


def decision_table(decisions: Sequence[str], correct: Sequence[bool]) -> dict:
    """Per decision (`linker.confidence.DECISIONS`): how many mentions, their share, and how many of their best
    candidates are right (precision); what a report shows of `auto`, `review` and `no link`."""
    correct = np.asarray(correct, dtype=bool)
    decisions = np.asarray(decisions, dtype=object)
    out = {}
    for d in DECISIONS:
        sel = decisions == d
        out[d] = {"mentions": int(sel.sum()), "share": float(sel.mean()) if len(sel) else 0.0,
                  "precision": float(correct[sel].mean()) if sel.any() else None}
    return out


def remove_gold_concepts(concept_ids: Sequence[str], gold: Sequence[tuple[tuple[str, ...], ...]], fraction: float,
                         *, expand: Callable[[str], Sequence[str]] | None, seed: int = NIL_SEED
                         ) -> tuple[list[str], np.ndarray]:
    """(removed dictionary concept ids, (n,) bool: mention i has no right answer without them).

    A seeded `fraction` of the dictionary concepts that some test mention's gold names is
    removed. A mention becomes unlinkable when some part of it (`Mention.gold`) names only
    removed concepts, or none of the dictionary at all.
    """
    reaches: dict[str, set[str]] = {}  # gold key -> dictionary concepts that answer it
    for concept_id in dict.fromkeys(concept_ids):
        keys = {code_key(concept_id)} | ({code_key(x) for x in expand(concept_id)} if expand else set())
        for key in keys:
            reaches.setdefault(key, set()).add(concept_id)
    part_concepts = [[set().union(*(reaches.get(code_key(a), set()) for a in part)) for part in parts] for parts in gold]
    golden = sorted({c for parts in part_concepts for concepts in parts for c in concepts})
    rng = np.random.default_rng(seed)
    size = int(round(fraction * len(golden)))
    removed = set(rng.choice(np.array(golden, dtype=object), size=size, replace=False).tolist()) if size else set()
    unlinkable = np.array([not parts or any(not (concepts - removed) for concepts in parts) for parts in part_concepts],
                          dtype=bool)
    return sorted(removed), unlinkable


def nil_scores(predicted_nil: np.ndarray, gold_nil: np.ndarray) -> dict:
    tp = int((predicted_nil & gold_nil).sum())
    precision = tp / predicted_nil.sum() if predicted_nil.sum() else math.nan
    recall = tp / gold_nil.sum() if gold_nil.sum() else math.nan
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else math.nan
    return {"predicted_nil": int(predicted_nil.sum()), "gold_nil": int(gold_nil.sum()), "true_nil": tp,
            "precision": float(precision), "recall": float(recall), "f1": float(f1)}


def nil_section(top_confidence: np.ndarray, correct: np.ndarray, gold_nil: np.ndarray, threshold: float,
                removed: Sequence[str], fraction: float) -> dict:
    """NIL precision / recall / F1 at `threshold`, the best F1 over thresholds, and linked accuracy."""
    conf = np.where(np.isfinite(top_confidence), top_confidence, -math.inf)
    at = nil_scores(conf < threshold, gold_nil)
    linked = (conf >= threshold) & ~gold_nil
    best = {"f1": -1.0}
    for t in np.unique(conf[np.isfinite(conf)]):
        scores = nil_scores(conf < t, gold_nil)
        if not math.isnan(scores["f1"]) and scores["f1"] > best["f1"]:
            best = {**scores, "threshold": float(t)}
    return {
        "fraction_removed": fraction,
        "seed": NIL_SEED,
        "concepts_removed": len(removed),
        "mentions": int(len(gold_nil)),
        "threshold": threshold,
        **at,
        "linked_accuracy_at_1": float(correct[linked].mean()) if linked.any() else math.nan,
        "best_f1_oracle": best if best["f1"] >= 0 else None,
    }


def coverage_chart(section: dict, path: Path, title: str) -> None:
    """Accuracy of the kept mentions against coverage, as the confidence threshold falls."""
    from linker.extras import require

    matplotlib = require("matplotlib", extra="plots", what="the coverage chart")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = section["curve"]
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    ax.plot([100 * c for c in curve["coverage"]], [100 * a for a in curve["accuracy"]], lw=1.5)
    at = section["at_coverage"]
    if at["threshold"] is not None:
        ax.plot([100 * at["coverage"]], [100 * at["accuracy"]], "o", ms=4,
                label=f"{100 * at['coverage']:.0f}% kept: Acc@1 {100 * at['accuracy']:.1f}")
        ax.legend(fontsize=8, loc="lower left")
    ax.set_xlabel("coverage (% of mentions linked)")
    ax.set_ylabel("Acc@1 of the linked (%)")
    ax.set_xlim(0, 100)
    ax.set_title(f"{title}: accuracy / coverage ({section['confidence']})", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
