"""Mention rewriting before linking: abbreviations defined in the document, typos, composites.

BioSyn (Sung et al. 2020) and the systems compared with it link NCBI-disease mentions only after
three rewrites of the query, which its published 91.1 Acc@1 depends on:

1. **Abbreviations** defined in the same document are expanded: "WD" becomes "Wilson disease"
   when the abstract says "Wilson disease (WD)". BioSyn ran Ab3P (a C++ tool); we detect the
   definitions with the Schwartz & Hearst (2003) algorithm, which needs no resources: a short
   form in parentheses, and the shortest run of preceding words whose letters contain the short
   form's characters in order, the first one starting a word; failing that, the preceding words
   whose initials are the short form's letters in another order ("Myotonic dystrophy (DM)").
2. **Typos** from a ``typo||correction`` list (``ncbi-spell-check.txt``) are fixed word by word.
3. **Composite mentions** ("breast and ovarian cancer", two gold ids) are split into one text per
   concept ("breast cancer", "ovarian cancer") by coordination patterns, so that each part can be
   linked on its own; a mention no pattern fits stays whole.

These are pure functions over strings; `linker.datasets` applies them per document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from linker.errors import InputFormatError, shorten
from linker.fileio import iter_lines

# ----------------------------------------------------------------------------- abbreviations

_PAREN = re.compile(r"\(([^()]{1,40})\)")
_SENTENCE_END = re.compile(r"[.!?;:]\s")


def _short_form_ok(short: str) -> bool:
    """Schwartz & Hearst's short-form test: 2-10 characters, at most 2 words, a letter, starts alphanumeric."""
    return (2 <= len(short) <= 10 and len(short.split()) <= 2 and any(c.isalpha() for c in short)
            and short[0].isalnum())


def _best_long_form(short: str, words: str) -> str | None:
    """The shortest suffix of `words` holding the short form's characters in order (S&H 2003, fig. 2).

    Characters are matched right to left; the short form's first character must start a word.
    """
    s, i = len(short) - 1, len(words) - 1
    while s >= 0:
        c = short[s].lower()
        if not c.isalnum():
            s -= 1
            continue
        while i >= 0 and (words[i].lower() != c or (s == 0 and i > 0 and words[i - 1].isalnum())):
            i -= 1
        if i < 0:
            return None
        i -= 1
        s -= 1
    start = words.rfind(" ", 0, i + 1) + 1
    return words[start:].strip()


def _initials_any_order(short: str, words: list[str]) -> str | None:
    """The last len(short) words when their initials are the short form's letters in another order.

    Latin-ordered short forms of English names: "Myotonic dystrophy (DM)" (dystrophia myotonica),
    "congenital myotonic dystrophy (CDM)". Only all-letter short forms of 2-5 characters.
    """
    if not (short.isalpha() and 2 <= len(short) <= 5) or len(words) < len(short):
        return None
    tail = words[-len(short):]
    initials = sorted(w[0].lower() for w in tail if w)
    return " ".join(tail) if initials == sorted(short.lower()) else None


def find_abbreviations(text: str) -> dict[str, str]:
    """Short form -> long form for every "long form (SHORT)" definition in `text`; first one wins.

    >>> find_abbreviations("causing Wilson disease (WD). Mutations in WD ...")
    {'WD': 'Wilson disease'}
    """
    found: dict[str, str] = {}
    for match in _PAREN.finditer(text):
        short = re.split(r"[;,] ", match.group(1))[0].strip()
        if not _short_form_ok(short) or short in found:
            continue
        before = text[: match.start()]
        cut = max((m.end() for m in _SENTENCE_END.finditer(before)), default=0)
        words = before[cut:].split()
        # S&H window: at most min(|SF| + 5, 2 |SF|) words before the parenthesis.
        window = words[-min(len(short) + 5, 2 * len(short)):]
        if not window:
            continue
        long = _best_long_form(short, " ".join(window)) or _initials_any_order(short, window)
        if not long or len(long) <= len(short) or short in long.split() or "(" in long or ")" in long:
            continue
        found[short] = long
    return found


def expand_abbreviations(mention: str, abbreviations: Mapping[str, str]) -> str:
    """Replace every whole token that is a known short form (also inside "A/B" and before a comma).

    Repeated until nothing changes (a long form may hold another short form), at most 3 rounds.
    """
    if not abbreviations:
        return mention
    text = mention
    for _ in range(3):
        tokens = []
        for token in text.split():
            comma = token.endswith(",")
            core = token[:-1] if comma else token
            core = "/".join(abbreviations.get(piece, piece) for piece in core.split("/"))
            tokens.append(core + ("," if comma else ""))
        new = " ".join(tokens)
        if new == text:
            break
        text = new
    return text


# ----------------------------------------------------------------------------- typos


def read_typos(path) -> dict[str, str]:
    """``typo||correction`` lines (BioSyn's ``ncbi-spell-check.txt``) -> {typo: correction}."""
    table: dict[str, str] = {}
    for number, line in iter_lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        typo, sep, correction = line.partition("||")
        if not sep or not typo.strip() or not correction.strip():
            raise InputFormatError(path, "'typo||correction'", shorten(line), line=number)
        table[typo.strip().lower()] = correction.strip()
    return table


def fix_typos(text: str, typos: Mapping[str, str]) -> str:
    """Replace whole words found in `typos` (compared in lower case)."""
    if not typos:
        return text
    return re.sub(r"\w+", lambda m: typos.get(m.group(0).lower(), m.group(0)), text)


# ----------------------------------------------------------------------------- composites

_WORD = r"[\w'-]+"
# "carcinoma of the breast and ovary" -> "carcinoma of breast", "carcinoma of ovary"
_HEAD_OF = re.compile(rf"(?P<head>{_WORD}) of (?:both )?(?:the )?(?P<first>(?:{_WORD} )*?{_WORD}) (?:and|or) (?:the )?"
                      rf"(?P<second>(?:{_WORD} ?)+)$")
# "breast, ovarian and/or endometrial cancer" -> one text per modifier + the shared stem
_LIST = re.compile(rf"(?P<mods>(?:{_WORD},? )+?)(?:and/or|and|or|&) (?:the )?(?P<last>{_WORD}) (?P<stem>.+)$")
# "hereditary breast/ovarian cancer" -> "hereditary breast cancer", "hereditary ovarian cancer"
_SLASH = re.compile(r"(?P<pre>(?:\S+ )*)(?P<a>[^\s/]+)/(?P<b>[^\s/]+)(?P<post>(?: \S+)*)$")


def split_composite(mention: str, parts: int) -> tuple[str, ...] | None:
    """One text per concept of a composite mention naming `parts` concepts, or None if no pattern fits.

    The patterns are coordination with a shared head ("X of A and B"), a shared stem
    ("A, B and C cancer") or a slash ("A/B syndrome"); as a last resort, one word per concept when
    the counts agree ("hypotonia hyperreflexia"). A split is kept only if it yields exactly `parts`
    texts, so that part i can be scored against gold concept i.
    """
    text = " ".join(mention.split())
    if parts < 2:
        return None
    candidates: list[list[str]] = []
    if m := _HEAD_OF.match(text):
        candidates.append([f"{m['head']} of {m['first']}", f"{m['head']} of {m['second'].strip()}"])
    if m := _LIST.match(text):
        mods = [w.strip() for w in m["mods"].split(",") if w.strip()]  # "sporadic breast, brain" -> 2 modifiers
        candidates.append([f"{mod} {m['stem']}" for mod in [*mods, m["last"]]])
    if (m := _SLASH.match(text)) and "and/or" not in text:
        pre, post = m["pre"].strip(), m["post"].strip()
        candidates.append([" ".join(filter(None, (pre, x, post))) for x in (m["a"], m["b"])])
    candidates.append(text.split())
    for candidate in candidates:
        if len(candidate) == parts:
            return tuple(candidate)
    return None


__all__ = ["find_abbreviations", "expand_abbreviations", "read_typos", "fix_typos", "split_composite"]
