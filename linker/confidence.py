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

A near-tie is not a clear win: "Pain in left knee" at 0.880 with "Pain in right knee" at 0.879
is a coin toss, the same 0.880 ten points ahead of the next concept is not. So the map reads
``score + margin_weight x margin``, the margin being how far a candidate stands above the best
*other* concept (negative below the top one; the score itself when it has no rival).
`linker calibrate` chooses ``margin_weight`` on the held-in set (`choose_margin_weight`: the
lowest out-of-fold Brier score), 0 when the margin tells nothing the score does not. A mention
that *is* a name of the dictionary (the retriever's score 1: `EXACT_SCORE`) is another regime
than a paraphrase at 0.97: ``exact_offset`` lifts exact matches above every paraphrase, so the
map learns their own levels (an exact name two concepts share, a margin of 0, still earns less).
The combined score is one number, so the map stays monotone in the score, the margin and exactness.

Three decisions (`decide`), stated for a person who must act on each link:

- ``auto``: code it without review: the confidence is at least ``auto_from`` (``auto_precision``,
  95%), so each such answer was right at least 95% of the time on held-in answers like it, and any
  band of them is too, whatever mix of exact names and paraphrases a user's data holds. A single
  threshold on the pooled held-in answers would not be: on the default calibration's held-in set,
  exact dictionary names (99% right) let paraphrases at 80% precision into such a band;
- ``no link``: the best candidate is right less than ``no_link_below`` (1 in 5) of the time on
  the held-in set: the terminology likely lacks the concept or the mention is too vague, so a
  coder searches the terminology rather than checks this candidate (the candidates are kept);
- ``review``: everything between: the candidates are worth a person's look.

`expected_calibration_error`: the mean |accuracy - confidence| over 10 equal-width confidence
bins, weighted by bin size (Guo et al. 2017's ECE).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from linker.errors import ConfigError, IndexMismatchError, InputFormatError
from linker.fileio import atomic_file

log = logging.getLogger(__name__)

CALIBRATION = "calibration.json"
RETRIEVER_SCORER = "retriever"
ECE_BINS = 10  # Guo et al. 2017 use 15; 10 keeps each bin populated on test sets of ~1,000 mentions
AUTO, REVIEW, NO_LINK = "auto", "review", "no link"
DECISIONS = (AUTO, REVIEW, NO_LINK)  # best first: a composite mention takes its weakest part's
AUTO_PRECISION = 0.95
NO_LINK_BELOW = 0.2
MARGIN_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # margins of cosines are ~0.01-0.2 against scores of ~0.5-1
MARGIN_FOLDS = 5
# A retriever score this high: the mention is one of the dictionary's names (cosine 1 up to the rounding of bf16 or
# int8 vectors, ~1e-5 to 1e-4; a paraphrase of MiniLM's stays below 0.99)
EXACT_SCORE = 0.999
EXACT_OFFSET = 10.0  # above any paraphrase's score + margin_weight x margin (cosines: at most 1 + 8 x 1)
MARGIN_FETCH = 5  # concepts retrieved to find the best rival past a few twins (`margins`)


def map_input(scores, margins_, exact, margin_weight: float, exact_offset: float) -> np.ndarray:
    """The calibration map's one input: score + margin_weight x margin + exact_offset for an exact match (either part
    left out when its weight is 0 or its values are None). One formula for fitting, choosing and applying the map."""
    out = np.asarray(scores, dtype=np.float64)
    if margin_weight and margins_ is not None:
        out = out + margin_weight * np.asarray(margins_, dtype=np.float64)
    if exact_offset and exact is not None:
        out = out + exact_offset * np.asarray(exact, dtype=np.float64)
    return out


def margins(final: np.ndarray, order: np.ndarray, twins: np.ndarray | None = None) -> np.ndarray:
    """Per candidate of `order` (indices into `final`, best first, all retrieved concepts): its score less the best
    *rival*'s (for the top one, the best other concept that is not its twin; for the rest, the top's); the top one's
    own score when it has no rival. `twins` (bool per position of `order`): the concept matched the top one's name in
    another source, as the default dictionary's ICD-10-CM R11.0 "Nausea" does HPO's "Nausea": one meaning coded in two
    terminologies, no rival. One rule for the Linker and for `linker calibrate`."""
    final = np.asarray(final, dtype=np.float64)
    if len(order) == 0:
        return np.zeros(0)
    ranked = final[order]
    out = ranked - ranked[0]
    rivals = ranked[1:] if twins is None else ranked[1:][~np.asarray(twins, dtype=bool)[1:]]
    out[0] = ranked[0] - (rivals[0] if len(rivals) else 0.0)
    return out


def twins_of_top(candidates: Iterable[tuple[str, object]], n: int) -> np.ndarray:
    """Per candidate of `n` (best first, (matched name, source)): whether it is a twin of the top one, its name
    (`name_key`) in another source (see `margins`). Only the twins ahead of the first rival are marked, the ones
    `margins` reads: the candidates are read lazily up to that rival, so a hot path names one or two of them."""
    from linker.sources.default import name_key

    twins = np.zeros(n, dtype=bool)
    pairs = iter(candidates)
    first = next(pairs, None)
    if first is None:
        return twins
    top_key, top_source = name_key(first[0]), first[1]
    for i, (name, source) in enumerate(pairs, start=1):
        if source == top_source or name_key(name) != top_key:
            break  # the first rival
        twins[i] = True
    return twins


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
    margin_weight: float = 0.0  # the map reads score + margin_weight x margin (`margins`); 0 in older files
    auto_from: float | None = None  # decision "auto" at confidence >= this; None: no auto band (older files)
    auto_precision: float | None = None  # the held-in precision auto_from was chosen for
    no_link_below: float | None = None  # decision "no link" below this confidence; None: none (older files)
    exact_offset: float = 0.0  # added for an exact match (`EXACT_SCORE`); 0 in older files
    # Re-ranker scorers: how the re-ranker ran when the map was fitted (the top `rerank_k`, in `rerank_precision`);
    # `Linker.load` runs it so unless told otherwise, so an index links the way it was calibrated. None: older files.
    rerank_k: int | None = None
    rerank_precision: str | None = None

    def features(self, scores, margins_=None, exact=None) -> np.ndarray:
        """The map's input (`map_input`) with this calibration's weights."""
        return map_input(scores, margins_, exact, self.margin_weight, self.exact_offset)

    def __call__(self, scores: np.ndarray | Sequence[float], margins_: np.ndarray | Sequence[float] | None = None,
                 exact: np.ndarray | Sequence[bool] | None = None) -> np.ndarray:
        """P(correct) of each score (with its margin, `margins`, and whether the retriever matched a dictionary name
        exactly); flat beyond the fitted range (isotonic's "clip")."""
        scores = self.features(scores, margins_, exact)
        if len(self.x) == 1:
            return np.full(scores.shape, self.y[0])
        return np.clip(np.interp(scores, self.x, self.y), 0.0, 1.0)

    def decide(self, confidence: float | None) -> str:
        """`AUTO`, `REVIEW` or `NO_LINK` for a best candidate of this confidence (None: it has none)."""
        if confidence is None or (self.no_link_below is not None and confidence < self.no_link_below):
            return NO_LINK
        if self.auto_from is not None and confidence >= self.auto_from:
            return AUTO
        return REVIEW

    def to_json(self) -> dict:
        return asdict(self)

    def threshold_for(self, confidence: float) -> float:
        """The smallest score whose confidence reaches `confidence` (inf when none does)."""
        reach = [x for x, y in zip(self.x, self.y) if y >= confidence]
        return reach[0] if reach else float("inf")


def fit_isotonic(scores: Sequence[float], correct: Sequence[bool], *, scorer: str, fitted_on: str = "",
                 retriever_weight: float = 0.0, retriever_accuracy: float | None = None,
                 **decisions) -> Calibration:
    """Isotonic regression of `correct` on `scores` (one pair per held-in mention, the combined score when the map
    uses margins); `decisions`: margin_weight, auto_from, auto_precision, no_link_below as `Calibration` keeps them."""
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
        **decisions,
    )


def fold_of(n: int, folds: int = MARGIN_FOLDS, seed: int = 0) -> np.ndarray:
    """Each of `n` held-in mentions' fold (seeded; at least 2 folds, at most one a mention): the one split every
    out-of-fold figure uses."""
    return np.random.default_rng(seed).permutation(n) % max(2, min(folds, n))


def out_of_fold(features: np.ndarray, correct: np.ndarray, *, folds: int = MARGIN_FOLDS, seed: int = 0) -> np.ndarray:
    """Each held-in mention's confidence from an isotonic map fitted on the other folds (seeded split): what the map
    says of mentions it has not seen, for choosing `margin_weight` and reporting the decisions without an in-sample
    optimism."""
    from sklearn.isotonic import IsotonicRegression

    features, correct = np.asarray(features, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    fold = fold_of(len(features), folds, seed)
    out = np.empty(len(features))
    for f in np.unique(fold):
        train = fold != f
        if len(np.unique(features[train])) < 2:  # too few to fit: the training share's accuracy
            out[~train] = correct[train].mean() if train.any() else 0.5
            continue
        model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(features[train], correct[train])
        out[~train] = model.predict(features[~train])
    return out


def choose_margin_weight(scores: np.ndarray, margins_: np.ndarray, correct: np.ndarray,
                         weights: Sequence[float] = MARGIN_WEIGHTS, exact: np.ndarray | None = None
                         ) -> tuple[float, dict[float, float]]:
    """(weight, Brier score by weight): the weight whose out-of-fold confidences have the lowest Brier score
    (mean squared error against right/wrong, a proper scoring rule: it rewards telling right from wrong, not only
    matching the average); the smallest weight within 0.0005 of the best, so a margin that does not help is left out."""
    correct = np.asarray(correct, dtype=np.float64)
    brier = {float(w): float(np.mean((out_of_fold(map_input(scores, margins_, exact, w, EXACT_OFFSET), correct)
                                      - correct) ** 2))
             for w in weights}
    best = min(brier.values())
    return min(w for w, b in brier.items() if b <= best + 5e-4), brier


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
    numbers = [f for f in ("accuracy", "retriever_weight", "retriever_accuracy", "mentions", "margin_weight",
                           "auto_from", "auto_precision", "no_link_below", "exact_offset") if data.get(f) is not None]
    for field in numbers:
        if not _is_number(data[field]):
            raise InputFormatError(path, f"{field!r} as a number", _shown(data[field]), fix=fix)
    for field in ("retriever_weight", "margin_weight", "exact_offset"):
        if not math.isfinite(data.get(field, 0.0)):
            raise InputFormatError(path, f"{field!r} as a finite number", _shown(data[field]), fix=fix)
    for field in ("scorer", "method", "fitted_on", "fitted_at"):
        if field in data and not isinstance(data[field], str):
            raise InputFormatError(path, f"{field!r} as a string", _shown(data[field]), fix=fix)
    k = data.get("rerank_k")
    if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_RERANK_K):
        raise InputFormatError(path, f"'rerank_k' as an integer from 1 to {MAX_RERANK_K}", _shown(k), fix=fix)
    if data.get("rerank_precision") not in (None, "fp32", "bf16"):
        raise InputFormatError(path, "'rerank_precision' as fp32 or bf16", _shown(data["rerank_precision"]), fix=fix)
    try:
        calibration = Calibration(**{**data, "x": tuple(data["x"]), "y": tuple(data["y"])})
    except TypeError as exc:  # a missing or unknown field
        raise IndexMismatchError(f"{path}: not a calibration written by `linker calibrate` ({exc}); {fix}") from None
    if not calibration.x or len(calibration.x) != len(calibration.y) or list(calibration.x) != sorted(calibration.x):
        raise IndexMismatchError(f"{path}: breakpoints must be non-empty, of equal length and ascending; {fix}")
    if not all(0.0 <= y <= 1.0 for y in calibration.y):
        raise InputFormatError(path, "'y' as probabilities from 0 to 1", _shown(list(calibration.y)), fix=fix)
    return calibration


MAX_RERANK_K = 10_000  # a calibration asking for more pairs a mention than this is not one `linker calibrate` wrote

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
               "mentions": calibration.mentions, "fitted_at": calibration.fitted_at, "origin": origin,
               "margin_weight": calibration.margin_weight, "auto_from": calibration.auto_from,
               "no_link_below": calibration.no_link_below}
    if origin not in ("user", "default"):
        raise ConfigError(f"calibration origin: expected user or default, found {origin!r}")
    if calibration.scorer != RETRIEVER_SCORER:
        summary.update(retriever_weight=calibration.retriever_weight, accuracy=calibration.accuracy,
                       retriever_accuracy=calibration.retriever_accuracy, rerank_k=calibration.rerank_k,
                       rerank_precision=calibration.rerank_precision)
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
