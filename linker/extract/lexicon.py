"""A dictionary's names found in text: the lookup that a tagger takes as evidence.

On the TAC 2017 labels a plain lookup of the training labels' MedDRA names (lower case, whole words, longest match
first) found more reactions than the tagger did (test recall 75.8 against 66.6). The tagger therefore reads the
names of the dictionary it codes with: each name found in a text is proposed as a term, and kept when the tagger's
own in-span probability over its word pieces reaches the release's ``lexicon`` threshold (chosen on dev; 0 keeps
every match, which is the plain lookup added to the tagger's spans). `linker.extract.model.decode` applies it.

Names and text are compared as `linker.text.normalize` "words" makes them (NFKC, lower case, punctuation as white
space), word by word, so "Nausea/vomiting" matches "nausea vomiting" and "rash" never matches inside "crash".
Names that only grade an event ("Severe", "Mild": HPO has them as concepts) are left out: `MODIFIERS`, the Severity
mentions of the TAC 2017 training labels, written by ``python -m linker.extract.lexicon ../shared/data/tac2017/train_xml``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

from importlib import resources
from pathlib import Path

from linker.text import normalize

MAX_WORDS = 6  # names of more words are rare as written mentions and cost a lookup per word of every text
MIN_CHARS = 3  # "BP", "Q": two-letter names match abbreviations and units far more often than events
_WORD = re.compile(r"[^\W_]+")
MODIFIERS_FILE = "data/lexicon/modifiers.txt"


@functools.cache
def modifiers() -> frozenset[str]:
    """The normalised words that grade an event (`MODIFIERS_FILE`, one a line, # comments)."""
    text = (resources.files("linker") / MODIFIERS_FILE).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


@functools.cache
def modifier_words() -> frozenset[str]:
    """Every word of `modifiers` ("mild to moderate": mild, to, moderate)."""
    return frozenset(word for phrase in modifiers() for word in phrase.split())


class Lexicon:
    """The normalised names of a dictionary, matched longest first, left to right, without overlaps."""

    def __init__(self, names: Iterable[str], *, source: str = "") -> None:
        self.source = source  # what the names are, for logs and reports
        keys, skip = set(), modifiers()
        for name in names:
            if not isinstance(name, str):
                continue
            key = normalize(name, "words")
            if len(key) >= MIN_CHARS and key.count(" ") < MAX_WORDS and key not in skip:
                keys.add(key)
        self.keys = frozenset(keys)
        self.longest = max((key.count(" ") + 1 for key in keys), default=0)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of the names found in `text`: at each word the longest name that starts
        there, then on after it."""
        words = [(m.start(), m.end(), unicodedata.normalize("NFKC", m.group()).lower()) for m in _WORD.finditer(text)]
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


HEADER = """# Words that grade an event, not events: the Severity mentions of the 101 TAC 2017 training labels
# (../shared/data/tac2017/train_xml, public NLM / FDA), normalised as linker.text.normalize(..., "words"), those
# without digits. A dictionary name equal to one of them (HPO's "Severe", "Mild", "Progressive") is no evidence of
# an adverse event (linker.extract.lexicon). Written by: python -m linker.extract.lexicon ../shared/data/tac2017/train_xml
"""

if __name__ == "__main__":
    import sys

    sys.stdout.write(HEADER + "".join(f"{word}\n" for word in severity_words(Path(sys.argv[1]))))


__all__ = ["Lexicon", "MAX_WORDS", "MIN_CHARS", "modifiers", "severity_words"]
