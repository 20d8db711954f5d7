"""Calibrated confidence: a monotone map from a candidate's final score to P(the candidate is right).

Scores are not probabilities: a tf-idf cosine of 0.6 may be right 90% of the time on one
dictionary and 40% on another, and a cross-encoder's logit is unbounded. `linker calibrate`
links a held-in set (mentions with gold ids, not the test set), pairs each mention's best score
with whether that best candidate was right, and fits isotonic regression (scikit-learn, with
``out_of_bounds="clip"``): the least-squares *non-decreasing* step function of the score. Being
monotone it never reorders candidates; it only says what a score has meant on data like the
held-in set. The fit is kept as its breakpoints (``calibration.json`` in the index folder,
listed and verified by the manifest like every other file) and applied by linear interpolation,
so loading needs neither scikit-learn nor pickle.

A calibration belongs to one scorer: the retriever's own score, or one re-ranker (named by its
weights' sha256). For a re-ranker it also holds how the final score mixes both signals:
``re-ranker logit + retriever_weight x retriever score``, the weight chosen by `linker calibrate`
on the same held-in set (the best Acc@1, averaged over half an octave, on a grid that runs from the
re-ranker alone to, in effect, the retriever's own order), so a re-ranker that does not help there
is outvoted. Linking with another scorer gives ``confidence = None`` (and refuses
``min_confidence``), because the map would be meaningless for that score.

`expected_calibration_error`: the mean |accuracy - confidence| over 10 equal-width confidence
bins, weighted by bin size (Guo et al. 2017's ECE).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from linker.errors import ConfigError, IndexMismatchError, InputFormatError
from linker.fileio import atomic_file

log = logging.getLogger(__name__)

CALIBRATION = "calibration.json"
RETRIEVER_SCORER = "retriever"
ECE_BINS = 10  # Guo et al. 2017 use 15; 10 keeps each bin populated on test sets of ~1,000 mentions


@dataclass(frozen=True)
class Calibration:
    """A fitted non-decreasing map score -> P(correct), as breakpoints (x ascending, y in [0, 1])."""

    scorer: str  # RETRIEVER_SCORER or "rerank:<sha256 of the re-ranker's weights>"
    x: tuple[float, ...]
    y: tuple[float, ...]
    method: str = "isotonic"
    fitted_on: str = ""  # the dataset spec
    mentions: int = 0
    accuracy: float = float("nan")  # Acc@1 on the held-in set
    fitted_at: str = ""
    retriever_weight: float = 0.0  # re-ranker scorers: final = logit + retriever_weight * retriever score
    retriever_accuracy: float | None = None  # re-ranker scorers: held-in Acc@1 of the retriever's own order

    def __call__(self, scores: np.ndarray | Sequence[float]) -> np.ndarray:
        """P(correct) of each score; flat beyond the fitted range (isotonic's "clip")."""
        scores = np.asarray(scores, dtype=np.float64)
        if len(self.x) == 1:
            return np.full(scores.shape, self.y[0])
        return np.clip(np.interp(scores, self.x, self.y), 0.0, 1.0)

    def to_json(self) -> dict:
        return asdict(self)

    def threshold_for(self, confidence: float) -> float:
        """The smallest score whose confidence reaches `confidence` (inf when none does)."""
        reach = [x for x, y in zip(self.x, self.y) if y >= confidence]
        return reach[0] if reach else float("inf")


def fit_isotonic(scores: Sequence[float], correct: Sequence[bool], *, scorer: str, fitted_on: str = "",
                 retriever_weight: float = 0.0, retriever_accuracy: float | None = None) -> Calibration:
    """Isotonic regression of `correct` on `scores` (one pair per held-in mention)."""
    from sklearn.isotonic import IsotonicRegression

    scores = np.asarray(scores, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if len(scores) != len(correct):
        raise ValueError("scores and correct must have the same length")
    if len(scores) < 2:
        raise ConfigError(f"calibration needs at least 2 held-in mentions with a candidate, found {len(scores)}")
    model = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(scores, correct)
    return Calibration(
        scorer=scorer,
        x=tuple(float(v) for v in model.X_thresholds_),
        y=tuple(float(v) for v in model.y_thresholds_),
        fitted_on=fitted_on,
        mentions=int(len(scores)),
        accuracy=float(correct.mean()),
        fitted_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        retriever_weight=float(retriever_weight),
        retriever_accuracy=retriever_accuracy,
    )


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], *, bins: int = ECE_BINS) -> float:
    """Bin-size-weighted mean |accuracy - mean confidence| over equal-width bins of [0, 1]."""
    confidence = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    correct = np.asarray(correct, dtype=np.float64)
    if len(confidence) == 0:
        return float("nan")
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += sel.sum() * abs(correct[sel].mean() - confidence[sel].mean())
    return float(total / len(confidence))


def coverage_curve(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coverage, accuracy of the kept, threshold) as the threshold falls through every distinct confidence.

    Mentions are kept when their best candidate's confidence >= threshold; a mention without any
    candidate has confidence -inf and is never kept (counts as not covered).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    order = np.argsort(-confidence, kind="stable")
    conf, hits = confidence[order], correct[order]
    # Keep only the last position of each run of equal confidences: a threshold keeps all of a tie.
    last = np.r_[conf[1:] != conf[:-1], True] & np.isfinite(conf)
    kept = np.arange(1, len(conf) + 1)[last]
    acc = np.cumsum(hits)[last] / kept
    return kept / max(len(conf), 1), acc, conf[last]


def at_coverage(confidence: Sequence[float], correct: Sequence[bool], target: float) -> dict:
    """The highest threshold keeping at least `target` of the mentions, with what it keeps."""
    coverage, acc, thresholds = coverage_curve(confidence, correct)
    reach = np.nonzero(coverage >= target)[0]
    if len(reach) == 0:
        return {"target": target, "threshold": None, "coverage": float(coverage[-1]) if len(coverage) else 0.0,
                "accuracy": float(acc[-1]) if len(acc) else float("nan")}
    i = int(reach[0])
    return {"target": target, "threshold": float(thresholds[i]), "coverage": float(coverage[i]),
            "accuracy": float(acc[i])}


def read_calibration(folder: str | Path, manifest: dict) -> Calibration | None:
    """The index folder's calibration, if its manifest lists one (an unlisted file is ignored)."""
    from linker.folders import read_folder_json

    entry = manifest.get("calibration")
    if not entry:
        return None
    path = Path(folder) / CALIBRATION
    fix = "run `linker calibrate` again"
    if CALIBRATION not in manifest.get("files", {}):  # `write_calibration` lists it: its checksum is verified
        raise IndexMismatchError(f"{path}: the manifest records a calibration but does not list this file "
                                 f"(its checksum is unknown); {fix}")
    # Inside the folder, a regular file of bounded size (a link to /dev/zero or out of the folder is refused).
    data = read_folder_json(folder, CALIBRATION, what="a calibration written by `linker calibrate`",
                            max_bytes=CALIBRATION_MAX_BYTES, fix=fix)
    for field in ("x", "y"):
        values = data.get(field)
        if not isinstance(values, list) or not all(_is_number(v) and math.isfinite(v) for v in values):
            raise InputFormatError(path, f"{field!r} as a list of finite numbers", _shown(values), fix=fix)
    numbers = [f for f in ("accuracy", "retriever_weight", "retriever_accuracy", "mentions") if data.get(f) is not None]
    for field in numbers:
        if not _is_number(data[field]):
            raise InputFormatError(path, f"{field!r} as a number", _shown(data[field]), fix=fix)
    if not math.isfinite(data.get("retriever_weight", 0.0)):
        raise InputFormatError(path, "'retriever_weight' as a finite number", _shown(data["retriever_weight"]), fix=fix)
    for field in ("scorer", "method", "fitted_on", "fitted_at"):
        if field in data and not isinstance(data[field], str):
            raise InputFormatError(path, f"{field!r} as a string", _shown(data[field]), fix=fix)
    try:
        calibration = Calibration(**{**data, "x": tuple(data["x"]), "y": tuple(data["y"])})
    except TypeError as exc:  # a missing or unknown field
        raise IndexMismatchError(f"{path}: not a calibration written by `linker calibrate` ({exc}); {fix}") from None
    if not calibration.x or len(calibration.x) != len(calibration.y) or list(calibration.x) != sorted(calibration.x):
        raise IndexMismatchError(f"{path}: breakpoints must be non-empty, of equal length and ascending; {fix}")
    if not all(0.0 <= y <= 1.0 for y in calibration.y):
        raise InputFormatError(path, "'y' as probabilities from 0 to 1", _shown(list(calibration.y)), fix=fix)
    return calibration


# A calibration holds two breakpoints per distinct held-in score at most: a million held-in mentions stay
# under 64 MiB, and it is read whole.
CALIBRATION_MAX_BYTES = 64 << 20


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    return f"{type(value).__name__} {str(value)[:60]!r}"


def write_calibration(folder: str | Path, calibration: Calibration, *, origin: str = "user") -> dict:
    """Store `calibration` in the index folder and record it in the manifest; return the new manifest.

    The file is written first and the manifest after, each atomically: a crash in between leaves
    an unlisted file that `read_calibration` ignores, never a manifest that lists a missing file.
    """
    from linker.index.manifest import read_manifest, write_manifest

    folder = Path(folder)
    manifest = read_manifest(folder)
    with atomic_file(folder / CALIBRATION) as tmp:
        tmp.write_text(json.dumps(calibration.to_json(), indent=1) + "\n", encoding="utf-8")
    summary = {"scorer": calibration.scorer, "method": calibration.method, "fitted_on": calibration.fitted_on,
               "mentions": calibration.mentions, "fitted_at": calibration.fitted_at, "origin": origin}
    if origin not in ("user", "default"):
        raise ConfigError(f"calibration origin: expected user or default, found {origin!r}")
    if calibration.scorer != RETRIEVER_SCORER:
        summary.update(retriever_weight=calibration.retriever_weight, accuracy=calibration.accuracy,
                       retriever_accuracy=calibration.retriever_accuracy)
    manifest = {key: value for key, value in manifest.items() if key != "files"}
    return write_manifest(folder, {**manifest, "calibration": summary})


def raw_probability(scores: Sequence[float] | np.ndarray, scorer: str) -> np.ndarray:
    """A score read naively as a probability, the "before calibration" baseline of ECE: a cosine
    (tf-idf, dense) clipped to [0, 1], a re-ranker logit through the logistic function."""
    scores = np.asarray(scores, dtype=np.float64)
    if scorer == RETRIEVER_SCORER:
        return np.clip(scores, 0.0, 1.0)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-scores))
