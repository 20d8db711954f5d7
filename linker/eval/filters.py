"""Medical Crossing test-set filters: how much of a score is memorisation?

- ``full``: the test mentions as given.
- ``dict`` / ``train``: drop a test mention whose normalised text is a reference string
  (``dict``: the dictionary's names; ``train``: the training mentions).
- ``dict0.2`` / ``train0.2``: also drop it when some reference r is close:
  ``lev(m, r) / max(len(m), len(r)) < 0.2`` (unit-cost Levenshtein on characters, *strictly*
  below: a pair at exactly 0.2 is kept). Duplicate test mentions are kept (each is scored).

Modes: ``faithful`` normalises with ``normalize(x, "faithful")`` (``lower().strip()``, the
paper's own filtering); ``biosyn`` with ``normalize(x, "biosyn")`` (punctuation to spaces) and,
when an abbreviation table is given (``short<TAB>long`` lines, e.g. made from Ab3P output as
BioSyn did), expands whole-word abbreviations in both mentions and references first. No
abbreviation detector is bundled: without a table nothing is expanded.

Reproduced subset sizes (the published ones; integration tests assert them), training filter,
faithful mode, reference set = the *training* split's mention texts only:

- Cantemist: test (brat ``test.zip``, 3,635) against ``train.zip`` (6,396 mentions):
  Filtered 998, Filtered0.2 711. Adding dev1/dev2 to the references gives fewer (see tests).
- CodiEsp-D: test ``testX.tsv`` DIAGNOSTICO (3,665) against ``trainX.tsv`` DIAGNOSTICO (7,209):
  Filtered 1,386, Filtered0.2 1,167.

Speed: Levenshtein is bounded below by the length difference, so only references with
``|len(r) - len(m)| < 0.2 * max(len(m), len(r))`` can be close; references are bucketed by length
and each mention is compared (rapidfuzz, C++) with the buckets in that window only.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rapidfuzz import process
from rapidfuzz.distance import Levenshtein

from linker.errors import ConfigError, InputFormatError, UnknownNameError, shorten
from linker.fileio import iter_lines
from linker.text import normalize

log = logging.getLogger(__name__)

THRESHOLD = 0.2  # the paper's normalised-Levenshtein cut-off


@dataclass(frozen=True)
class FilterSpec:
    """A named filter: which reference set, and whether near matches are dropped too."""

    name: str
    reference: str | None  # "dict" | "train" | None (full)
    fuzzy: bool


FILTERS: dict[str, FilterSpec] = {
    "full": FilterSpec("full", None, False),
    "dict": FilterSpec("dict", "dict", False),
    "dict0.2": FilterSpec("dict0.2", "dict", True),
    "train": FilterSpec("train", "train", False),
    "train0.2": FilterSpec("train0.2", "train", True),
}
FILTER_MODES = ("faithful", "biosyn")


def get_filter(name: str) -> FilterSpec:
    try:
        return FILTERS[name]
    except KeyError:
        raise UnknownNameError("filter", name, FILTERS) from None


def read_abbreviations(path) -> dict[str, str]:
    """``short<TAB>long`` lines -> {short (lower case): long}."""
    table: dict[str, str] = {}
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise InputFormatError(path, "'abbreviation<TAB>long form'", shorten(line), line=number)
        table[fields[0].strip().lower()] = fields[1].strip()
    return table


class Normaliser:
    """The filter's text key: a normalisation mode plus optional abbreviation expansion."""

    def __init__(self, mode: str = "faithful", abbreviations: Mapping[str, str] | None = None) -> None:
        if mode not in FILTER_MODES:
            raise UnknownNameError("filter mode", mode, FILTER_MODES)
        if abbreviations and mode != "biosyn":
            raise ConfigError("abbreviation expansion belongs to the biosyn filter mode; add --mode biosyn")
        self.mode = mode
        self.abbreviations = {k.lower(): v for k, v in (abbreviations or {}).items()}
        self._word = re.compile(r"\b(" + "|".join(map(re.escape, sorted(self.abbreviations, key=len, reverse=True))) + r")\b") \
            if self.abbreviations else None

    def __call__(self, text: str) -> str:
        if self._word is not None:
            text = self._word.sub(lambda m: self.abbreviations[m.group(1)], text.lower())
        return normalize(text, self.mode)  # type: ignore[arg-type]


class ReferenceSet:
    """Normalised reference strings, held as a set (exact test) and length buckets (near test)."""

    def __init__(self, strings: Iterable[str], normaliser: Normaliser) -> None:
        self.normaliser = normaliser
        self.strings = {s for s in (normaliser(x) for x in strings) if s}
        self.by_length: dict[int, list[str]] = defaultdict(list)
        for s in sorted(self.strings):
            self.by_length[len(s)].append(s)

    def __len__(self) -> int:
        return len(self.strings)

    def contains(self, mention: str) -> bool:
        return self.normaliser(mention) in self.strings

    def near(self, mention: str) -> bool:
        """True when some reference r has lev(m, r) / max(len) < 0.2 (exact matches included)."""
        m = self.normaliser(mention)
        if m in self.strings:
            return True
        n = len(m)
        # lev >= |len(r) - n|, so r can qualify only if |len(r) - n| < 0.2 * max(n, len(r)):
        # for len(r) >= n that is 4 len(r) < 5 n, for len(r) < n it is 5 len(r) > 4 n (integers).
        low, high = 4 * n // 5 + 1, (5 * n - 1) // 4
        candidates = [r for length in range(max(low, 1), high + 1) for r in self.by_length.get(length, ())]
        if not candidates:
            return False
        best = process.extractOne(m, candidates, scorer=Levenshtein.normalized_distance,
                                  score_cutoff=THRESHOLD, processor=None)
        if best is None:
            return False
        # The float score may sit on the boundary; decide it in integers: 5 * lev < max_len.
        r = best[0]
        return Levenshtein.distance(m, r) * 5 < max(len(m), len(r))


def filter_indices(
    texts: Sequence[str], name: str, *, references: Mapping[str, ReferenceSet | None]
) -> list[int]:
    """Indices of the test mentions that filter `name` keeps (order and duplicates preserved)."""
    spec = get_filter(name)
    if spec.reference is None:
        return list(range(len(texts)))
    refs = references.get(spec.reference)
    if refs is None:
        what = "a dictionary (the index's concept table)" if spec.reference == "dict" else "training mentions (--train SPEC)"
        raise ConfigError(f"filter {name!r} needs {what}")
    test = refs.near if spec.fuzzy else refs.contains
    return [i for i, text in enumerate(texts) if not test(text)]
