"""Rule-based assertion of adverse-event spans: negated ("no rash") and hypothetical ("if you develop a rash").

The tagger's status head learnt from a few hundred negated / hypothetical examples and calls nearly every span
positive (``docs/extract.md``, eval/extract/capabilities.md), so `Extractor.extract` runs this step after it
by default (``assertion="rules"``): a span the head calls positive becomes negated or hypothetical when a cue
of ``linker/data/assertion/cues.tsv`` (versioned by its ``manifest.json``) stands in its scope, after NegEx
(Chapman et al. 2001, "A simple algorithm for identifying negated findings and diseases in discharge
summaries"):

- a ``before`` cue counts when it lies within `WINDOW` words before the span, or opens it (a phrase span often
  holds its cue: "no rash", "had no headache"), never as its only word; an ``after`` cue when it starts within `WINDOW` words
  after the span;
- a scope ends at a sentence end (``. ; ! ?``, a line break) and at a ``termination`` cue ("but", "which",
  "developed") between the cue and the span;
- a ``pseudo`` cue ("no change", "not only") hides the cues inside it;
- of several cues the nearest to the span wins.

Only statuses are changed, never offsets: `annotate` codes positive adverse events only, so a negated or
hypothetical span is written with its status and the decision "not coded". English cues only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines

WINDOW = 6  # words of scope on each side, NegEx's 5 plus one for the article or possessive ("no more rash")
COLUMNS = "status<TAB>position<TAB>cue"
_STATUSES = {"negated": ("before", "after"), "hypothetical": ("before", "after"), "pseudo": ("any",),
             "termination": ("any",)}
# How far a scope reaches at most, in characters: WINDOW words of any real length. Unbounded, the search for the
# span's sentence start read the text from its beginning for every span: quadratic, hours for a 5 MB document.
SCOPE_CHARS = 1_000
_SENTENCE_END = re.compile(r"[.;!?](?=\s|$)|\n")
_WORD = re.compile(r"\w+(?:['’]\w+)*")


@dataclass(frozen=True)
class Cues:
    version: str
    before: dict[str, re.Pattern]  # status -> one alternation of its cues
    after: dict[str, re.Pattern]
    pseudo: re.Pattern | None
    termination: re.Pattern | None
    sha256: str  # of the cue rows, so a report names the exact lists it ran with


def _pattern(cues: Sequence[str]) -> re.Pattern | None:
    if not cues:
        return None
    # longest first: "no evidence of" before "no"; words joined by any white space, whole words only
    words = sorted({" ".join(c.lower().split()) for c in cues}, key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(r"\s+".join(map(re.escape, w.split())) for w in words) + r")(?!\w)",
                      re.IGNORECASE)


def read_cues(path: str | Path, lines) -> list[tuple[str, str, str]]:
    rows = []
    for number, line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.rstrip("\n").split("\t")
        if len(cells) != 3 or not cells[2].strip():
            raise InputFormatError(path, COLUMNS, f"{len(cells)} tab-separated column(s): {shorten(line)}", line=number)
        status, position, cue = (c.strip() for c in cells)
        if position not in _STATUSES.get(status, ()):
            raise InputFormatError(path, "negated|hypothetical with before|after, or pseudo|termination with any",
                                   f"{status} {position}", line=number)
        rows.append((status, position, cue))
    return rows


def load_cues(extra: Sequence[str | Path] = ()) -> Cues:
    """The package's cue lists (`linker/data/assertion/`) plus the rows of the user's files of the same columns."""
    return _load(tuple(str(p) for p in extra))


@lru_cache(maxsize=8)
def _load(extra: tuple[str, ...]) -> Cues:
    root = resources.files("linker") / "data" / "assertion"
    text = (root / "cues.tsv").read_text(encoding="utf-8")
    rows = read_cues("cues.tsv", enumerate(text.splitlines(), 1))
    for path in extra:
        rows += read_cues(path, iter_lines(path))
    by = lambda status, position: [c for s, p, c in rows if s == status and p == position]
    return Cues(
        version=json.loads((root / "manifest.json").read_text(encoding="utf-8"))["version"],
        before={s: p for s in ("negated", "hypothetical") if (p := _pattern(by(s, "before")))},
        after={s: p for s in ("negated", "hypothetical") if (p := _pattern(by(s, "after")))},
        pseudo=_pattern(by("pseudo", "any")), termination=_pattern(by("termination", "any")),
        sha256=hashlib.sha256("\n".join("\t".join(r) for r in rows).encode()).hexdigest()[:16])


def _word_bound(text: str, start: int, end: int, words: int, *, backward: bool) -> int:
    """The character where a scope of `words` words ends, going back from `end` (or forward from `start`)."""
    found = list(_WORD.finditer(text, start, end))
    if len(found) <= words:
        return start if backward else end
    return found[-words].start() if backward else found[words - 1].end()


def status_of(text: str, start: int, end: int, cues: Cues | None = None, window: int = WINDOW) -> str | None:
    """"negated" or "hypothetical" when a cue has the span text[start:end] in its scope, else None."""
    cues = cues or load_cues()
    floor, ceiling = max(0, start - SCOPE_CHARS), min(len(text), end + SCOPE_CHARS)
    left = max((m.end() for m in _SENTENCE_END.finditer(text, floor, start)), default=floor)
    right = next((m.start() for m in _SENTENCE_END.finditer(text, end, ceiling)), ceiling)
    words = list(_WORD.finditer(text, start, end))
    # a cue inside the span counts when it opens it ("no rash", "had no headache": the cue "had no"), not further
    # in ("hypothyroidism without thyroid disease" is no negated hypothyroidism)
    inside = words[0].end() if len(words) > 1 else start
    lo = _word_bound(text, left, start, window, backward=True)
    hi = _word_bound(text, end, right, window, backward=False)
    masked = [m.span() for m in cues.pseudo.finditer(text, lo, hi)] if cues.pseudo else []
    stops = [m.span() for m in cues.termination.finditer(text, lo, hi)] if cues.termination else []

    def free(a: int, b: int) -> bool:  # no pseudo cue over the match [a, b)
        return not any(s < b and a < e for s, e in masked)

    def stopped(a: int, b: int) -> bool:  # a termination cue between a and b
        return any(a <= s and e <= b for s, e in stops)

    best: tuple[int, str] | None = None  # (distance in characters, status)
    for status, pattern in cues.before.items():
        for m in pattern.finditer(text, lo, end):
            if m.start() < inside and free(*m.span()) and not stopped(m.end(), start):
                distance = max(0, start - m.end())
                if best is None or distance < best[0]:
                    best = (distance, status)
    for status, pattern in cues.after.items():
        for m in pattern.finditer(text, end, hi):
            if free(*m.span()) and not stopped(end, m.start()):
                distance = m.start() - end
                if best is None or distance < best[0]:
                    best = (distance, status)
    return best[1] if best else None


def assert_spans(text: str, spans, labels: Sequence[str], cues: Cues | None = None) -> list:
    """`spans` (ExtractedSpan) of `text` with the positive ones of `labels` re-marked by `status_of`."""
    cues = cues or load_cues()
    out = []
    for span in spans:
        if span.label in labels and span.status == "positive":
            status = status_of(text, span.start, span.end, cues)
            if status:
                span = replace(span, status=status)
        out.append(span)
    return out


def negated_names(text: str, spans, found: Sequence[tuple[int, int]], evidence, cues: Cues | None = None) -> list:
    """`spans` with each dictionary name `found` in `text` that no span overlaps and that the cues make negated or
    hypothetical, as an AdverseEvent span of that status ("No fever.": returned, and not coded, where the tagger
    found nothing to negate). `evidence(start, end)`: the tagger's in-span probability, its confidence."""
    from linker.extract.data import AE
    from linker.extract.model import ExtractedSpan, overlap_test

    if not found:
        return spans
    cues = cues or load_cues()
    taken = overlap_test((s.start, s.end) for s in spans)
    added = []
    for start, end in found:
        if taken(start, end):
            continue
        status = status_of(text, start, end, cues)
        if status in ("negated", "hypothetical"):
            added.append(ExtractedSpan(start, end, text[start:end], AE, status, evidence(start, end)))
    return sorted([*spans, *added], key=lambda s: (s.start, s.end, s.label)) if added else spans


__all__ = ["WINDOW", "Cues", "assert_spans", "load_cues", "negated_names", "read_cues", "status_of"]
