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
hypothetical span is written with its status and the decision "not coded".

Cue lists per language (`languages`): ``cues.tsv`` (English, the default when a text's language is None) and
``cues.<lang>.tsv`` (es, fr, de, nl, ja), each file's sha256 in the manifest, checked on load. A text of a language
without a list keeps the tagger's statuses: another language's cues would match its words by accident ("no" is a
word in es, "als" in nl and de). Japanese is written without spaces, every character a word character, so its
cues are matched as plain substrings and its scope counts `WINDOW_CHARS` characters (`UNSPACED`); it negates after the
term ("発熱なし"), so its cues are mostly ``after`` ones.
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

from linker.errors import InputFormatError, UnknownNameError, shorten
from linker.fileio import iter_lines
from linker.language import primary

WINDOW = 6  # words of scope on each side, NegEx's 5 plus one for the article or possessive ("no more rash")
COLUMNS = "status<TAB>position<TAB>cue"
_STATUSES = {"negated": ("before", "after"), "hypothetical": ("before", "after"), "pseudo": ("any",),
             "termination": ("any",)}
# How far a scope reaches at most, in characters: WINDOW words of any real length. Unbounded, the search for the
# span's sentence start read the text from its beginning for every span: quadratic, hours for a 5 MB document.
SCOPE_CHARS = 1_000
_SENTENCE_END = re.compile(r"[.;!?](?=\s|$)|\n")
ENGLISH = "en"  # the language of cues.tsv, and of a text whose language is None
# Languages written without spaces between words: whole-word cues and a scope in words cannot work there (every
# character of a Japanese sentence is \w, a sentence is one "word"), so cues are substrings and the scope is
# WINDOW_CHARS characters: NegEx's 6 words are about 12 characters of Japanese (a word of kanji or kana is 2-3
# characters), plus 4 for the cue itself, which lies inside the scope as a cue of several words does in English.
UNSPACED = {"ja": re.compile(r"[。．！？!?]|\n")}  # lang -> its sentence ends (it has no spaces after them)
WINDOW_CHARS = 16
_WORD = re.compile(r"\w+(?:['’]\w+)*")


@dataclass(frozen=True)
class Cues:
    version: str
    before: dict[str, re.Pattern]  # status -> one alternation of its cues
    after: dict[str, re.Pattern]
    pseudo: re.Pattern | None
    termination: re.Pattern | None
    sha256: str  # of the cue rows, so a report names the exact lists it ran with
    lang: str = ENGLISH
    sentence_end: re.Pattern = _SENTENCE_END
    spaced: bool = True  # cues are whole words and the scope counts words; else substrings and characters


def _pattern(cues: Sequence[str], spaced: bool = True) -> re.Pattern | None:
    if not cues:
        return None
    # longest first: "no evidence of" before "no"
    words = sorted({" ".join(c.lower().split()) for c in cues}, key=len, reverse=True)
    if not spaced:
        return re.compile("|".join(map(re.escape, words)), re.IGNORECASE)
    # words joined by any white space, whole words only; a French cue ending in an elided word ("pas d'", "absence
    # d’") is followed by its noun at once, so no word boundary after it
    ends = {w: "" if w[-1] in "'’" else r"(?!\w)" for w in words}
    return re.compile(r"(?<!\w)(?:" + "|".join(r"\s+".join(map(re.escape, w.split())) + ends[w] for w in words) + ")",
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


def cue_file(lang: str) -> str:
    return "cues.tsv" if lang == ENGLISH else f"cues.{lang}.tsv"


def _manifest() -> dict:
    return json.loads((resources.files("linker") / "data" / "assertion" / "manifest.json").read_text(encoding="utf-8"))


def languages() -> tuple[str, ...]:
    """The languages the package has cue lists for (its manifest's files)."""
    return tuple(sorted(entry["lang"] for entry in _manifest()["files"].values()))


def load_cues(extra: Sequence[str | Path] = (), *, lang: str | None = ENGLISH) -> Cues:
    """The package's cue list of `lang` (`linker/data/assertion/`, `languages`) plus the rows of the user's files
    of the same columns. An unknown language is an error naming the known ones (`cues_for` falls back instead)."""
    return _load(tuple(str(p) for p in extra), primary(lang))


def cues_for(lang: str | None) -> Cues | None:
    """The package's cues of a text's language; None (no rules: the tagger's statuses stand) for a language without
    a list. A text of unknown language is not read with the English cues: their words occur in other languages."""
    lang = primary(lang)
    return load_cues(lang=lang) if lang in languages() else None


@lru_cache(maxsize=16)
def _load(extra: tuple[str, ...], lang: str) -> Cues:
    root, manifest = resources.files("linker") / "data" / "assertion", _manifest()
    name = cue_file(lang)
    if name not in manifest["files"]:
        raise UnknownNameError("assertion cue language", lang, languages())
    data = (root / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["files"][name]["sha256"]:
        raise InputFormatError(f"linker/data/assertion/{name}", "the sha256 its manifest.json gives",
                               hashlib.sha256(data).hexdigest(), fix="bump the manifest's version and sha256 with it")
    rows = read_cues(name, enumerate(data.decode("utf-8").splitlines(), 1))
    for path in extra:
        rows += read_cues(path, iter_lines(path))
    spaced = lang not in UNSPACED
    by = lambda status, position: _pattern([c for s, p, c in rows if s == status and p == position], spaced)
    return Cues(
        version=manifest["version"],
        before={s: p for s in ("negated", "hypothetical") if (p := by(s, "before"))},
        after={s: p for s in ("negated", "hypothetical") if (p := by(s, "after"))},
        pseudo=by("pseudo", "any"), termination=by("termination", "any"),
        sha256=hashlib.sha256("\n".join("\t".join(r) for r in rows).encode()).hexdigest()[:16],
        lang=lang, sentence_end=UNSPACED.get(lang, _SENTENCE_END), spaced=spaced)


def _word_bound(text: str, start: int, end: int, words: int, *, backward: bool) -> int:
    """The character where a scope of `words` words ends, going back from `end` (or forward from `start`)."""
    found = list(_WORD.finditer(text, start, end))
    if len(found) <= words:
        return start if backward else end
    return found[-words].start() if backward else found[words - 1].end()


def status_of(text: str, start: int, end: int, cues: Cues | None = None, window: int | None = None) -> str | None:
    """"negated" or "hypothetical" when a cue has the span text[start:end] in its scope, else None. `window`: words
    of scope on each side (`WINDOW`), characters for a language without spaces (`WINDOW_CHARS`)."""
    cues = cues or load_cues()
    floor, ceiling = max(0, start - SCOPE_CHARS), min(len(text), end + SCOPE_CHARS)
    left = max((m.end() for m in cues.sentence_end.finditer(text, floor, start)), default=floor)
    right = next((m.start() for m in cues.sentence_end.finditer(text, end, ceiling)), ceiling)
    if cues.spaced:
        window = window or WINDOW
        words = list(_WORD.finditer(text, start, end))
        # a cue inside the span counts when it opens it ("no rash", "had no headache": the cue "had no"), not
        # further in ("hypothyroidism without thyroid disease" is no negated hypothyroidism)
        inside = words[0].end() if len(words) > 1 else start
        lo = _word_bound(text, left, start, window, backward=True)
        hi = _word_bound(text, end, right, window, backward=False)
    else:  # no words to count: the cue lies before the span, and the scope is characters
        window = window or WINDOW_CHARS
        inside, lo, hi = start, max(left, start - window), min(right, end + window)
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


def assert_spans(text: str, spans, labels: Sequence[str], cues: Cues | None = None, *, lang: str | None = None
                 ) -> list:
    """`spans` (ExtractedSpan) of `text` with the positive ones of `labels` re-marked by `status_of`, with `cues` or
    else those of the text's language `lang` (None: English). A language without cue lists (`languages`) changes
    nothing: no fallback to the English cues."""
    cues = cues or cues_for(lang)
    if cues is None:
        return list(spans)
    out = []
    for span in spans:
        if span.label in labels and span.status == "positive":
            status = status_of(text, span.start, span.end, cues)
            if status:
                span = replace(span, status=status)
        out.append(span)
    return out


def negated_names(text: str, spans, found: Sequence[tuple[int, int]], evidence, cues: Cues | None = None, *,
                  lang: str | None = None) -> list:
    """`spans` with each dictionary name `found` in `text` that no span overlaps and that the cues make negated or
    hypothetical, as an AdverseEvent span of that status ("No fever.": returned, and not coded, where the tagger
    found nothing to negate). `evidence(start, end)`: the tagger's in-span probability, its confidence. `cues`, `lang`:
    as `assert_spans` (a language without cue lists adds nothing)."""
    from linker.extract.data import AE
    from linker.extract.model import ExtractedSpan, overlap_test

    cues = cues or cues_for(lang) if found else None
    if cues is None:
        return spans
    taken = overlap_test((s.start, s.end) for s in spans)
    added = []
    for start, end in found:
        if taken(start, end):
            continue
        status = status_of(text, start, end, cues)
        if status in ("negated", "hypothetical"):
            added.append(ExtractedSpan(start, end, text[start:end], AE, status, evidence(start, end)))
    return sorted([*spans, *added], key=lambda s: (s.start, s.end, s.label)) if added else spans


__all__ = ["WINDOW", "WINDOW_CHARS", "Cues", "assert_spans", "cues_for", "languages", "load_cues", "negated_names",
           "read_cues", "status_of"]
