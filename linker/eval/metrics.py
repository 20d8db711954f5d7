"""Acc@k with the Medical Crossing / BioSyn conventions, and bootstrap intervals.

A mention is right at k when the top-k *distinct concepts* (the Linker already merges the
names of one concept, so its k candidates are k concepts) contain its gold:

- alternatives: a part with several ids (``A|B`` in BioSyn files) is right if any one is there;
- composite: a mention with several parts (NCBI ``A|B``, ``A+B``) is queried as one string (the
  mention text as written, e.g. "breast and ovarian cancer") unless the dataset split it into
  one text per part (option ``split``; see `mention_hits`), and with ``composite="all"`` (the
  default, as the architecture asks) it counts only if the top-k holds an id of *every* part:
  a two-part mention can then never be right at k=1. ``composite="any"`` counts it when any
  part is found, which is what BioSyn's ``check_label`` does on such mentions; it is offered to
  compare with BioSyn's published numbers, and reports say which rule they used.
- ids compare through `linker.text.code_key` (``s22.49xa`` == ``S22.49XA`` == ``S2249XA``).
- `expand` maps a predicted concept id to the ids it stands for (e.g. an HP term to the UMLS
  CUIs in its xrefs), for gold standards in another id space than the dictionary.

Intervals: percentile bootstrap over mentions, 1000 resamples, fixed seed, so a report is
reproducible to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from linker.errors import UnknownNameError
from linker.text import code_key

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20200  # any fixed value; recorded in every report
COMPOSITE_RULES = ("all", "any")


@dataclass(frozen=True)
class Accuracy:
    """Acc@k of one subset: correct / n, with a 95% bootstrap interval (as fractions)."""

    k: int
    n: int
    correct: int
    value: float
    low: float
    high: float


def mention_hits(
    gold: Sequence[tuple[tuple[str, ...], ...]],
    predicted: Sequence[Sequence[Sequence[str]]],
    k: int,
    *,
    composite: str = "all",
    expand: Callable[[str], Sequence[str]] | None = None,
) -> np.ndarray:
    """(n,) bool: is mention i right at k?

    `predicted[i]` holds one ranking of distinct concept ids per query text of mention i: one for
    a mention linked whole, one per part for a split composite (`Mention.parts_text`). For a split
    mention, rule ``all`` wants every gold part among the parts' top-k together (in any order:
    "pineal and retinal tumours" is annotated retinal first), rule ``any`` wants some gold id in
    every part's top-k, as BioSyn's evaluation does.
    """
    if composite not in COMPOSITE_RULES:
        raise UnknownNameError("composite rule", composite, COMPOSITE_RULES)
    out = np.zeros(len(gold), dtype=bool)
    for i, (parts, rankings) in enumerate(zip(gold, predicted, strict=True)):
        found_per_query = []
        for ranking in rankings:
            found: set[str] = set()
            for concept_id in ranking[:k]:
                found.add(code_key(concept_id))
                if expand is not None:
                    found.update(code_key(x) for x in expand(concept_id))
            found_per_query.append(found)
        gold_keys = [{code_key(a) for a in part} for part in parts]
        if not parts or not found_per_query:
            continue
        if composite == "all":
            union = set().union(*found_per_query)
            out[i] = all(part & union for part in gold_keys)
        elif len(found_per_query) > 1:
            every_gold = set().union(*gold_keys)
            out[i] = all(every_gold & found for found in found_per_query)
        else:
            out[i] = any(part & found_per_query[0] for part in gold_keys)
    return out


def bootstrap_interval(
    hits: np.ndarray, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `hits`; (nan, nan) for an empty subset."""
    n = len(hits)
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = hits.astype(np.float64)
    means = np.empty(resamples)
    for r in range(resamples):  # one draw at a time keeps memory at O(n) for large test sets
        means[r] = values[rng.integers(0, n, n)].mean()
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def accuracy(hits: np.ndarray, k: int, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Accuracy:
    n = int(len(hits))
    correct = int(hits.sum())
    low, high = bootstrap_interval(hits, resamples=resamples, seed=seed)
    return Accuracy(k=k, n=n, correct=correct, value=correct / n if n else float("nan"), low=low, high=high)
