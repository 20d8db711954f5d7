"""Which of linker's languages a text is written in, when its document does not say (`detect`).

`linker annotate` picks the tagger by language (English: linker-ae; es, fr, de, nl, ja: linker-ae-multi) and the
assertion cues by language, so a document without a ``lang`` needs one. Japanese is told by its script (kana, or
Han characters with no Latin words around them); the five Latin-script languages by their most frequent short
words, which clinical text keeps ("the", "of", "and"; "de", "la", "el"; "le", "les", "des"; "der", "die", "und";
"het", "een", "van"). A text with none of them is English, the tagger's and the index's first language. This is
no general language identifier: it chooses among these six and is meant for sentences and documents, not for
single words (a mention's language is its document's).
"""

from __future__ import annotations

import re
from collections import Counter

LANGUAGES = ("en", "es", "fr", "de", "nl", "ja")
DEFAULT = "en"

# Function words frequent in one language and rare in the other four (none is shared: "de" is Spanish, French and
# Dutch, so it counts for none of them). Lower case, matched as whole words.
_WORDS = {
    "en": "the of and with was were is are to in on for after patient this that had has have developed not",
    "es": "el los las del y con por para una se que fue es paciente tras desde presenta sin pero también años al",
    "fr": "le les des du et avec pour une est sont été par dans chez patient depuis sans mais je j ai au aux après ans à sous lors",
    "de": "der die das und mit ist sind ein eine nach bei von zu nicht kein keine ich habe seit aber auch wurde",
    "nl": "het een van en met is zijn werd na bij voor niet geen ik heb sinds maar ook patiënt naar",
}
_VOTES = {word: lang for lang, words in _WORDS.items() for word in words.split()
          if sum(word in w.split() for w in _WORDS.values()) == 1}
_WORD = re.compile(r"[^\W\d_]+")
# The characters of scripts written without spaces between words, as one regex class body: Han (with Extension A and
# the compatibility ideographs), 々〆〇, Hiragana, Katakana with its phonetic extension, and half-width Katakana.
# Each is a unit of its own where words are matched (`linker.extract.lexicon`) and a span never widens across them
# to a "whole word" (`linker.extract.model`): a Japanese sentence is one run of \w characters.
CJK = "\u3005-\u3007\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
# Japanese text holds CJK characters in nearly every sentence; Han alone (a Chinese text) is read as Japanese too,
# the only CJK language linker has.
_CJK_CHAR = re.compile(f"[{CJK}]")


def primary(tag: str | None) -> str:
    """The ISO 639-1 code of a language tag, as every choice by language reads it (the tagger, the assertion cues):
    None is English, "en-US", "en_GB" and "EN" are "en", "ja-JP" is "ja"."""
    return DEFAULT if tag is None else tag.strip().lower().replace("_", "-").split("-")[0]


def detect(text: str) -> str:
    """One of `LANGUAGES`: "ja" when kana or Han characters outnumber the Latin-script words, else the language
    of the most function words of `_WORDS` (ties and none: English)."""
    head = text[:10_000]  # the first 10,000 characters tell as well as the whole
    cjk = len(_CJK_CHAR.findall(head))
    latin = [w for w in _WORD.findall(head.lower()) if not _CJK_CHAR.search(w)]
    if cjk and cjk >= len(latin):
        return "ja"
    votes = Counter(_VOTES[w] for w in latin if w in _VOTES)
    if not votes:
        return DEFAULT
    ranked = votes.most_common(2) + [(DEFAULT, 0)]
    return ranked[0][0] if ranked[0][1] > ranked[1][1] else DEFAULT


__all__ = ["CJK", "DEFAULT", "LANGUAGES", "detect"]
