"""The one text normalisation used when building indexes, querying them and evaluating.

Modes:
- ``default``: Unicode NFKC, lower case, white space collapsed. Accents are kept because they
  separate words in Spanish, French and German ("ano" vs "año").
- ``words``: ``default`` with punctuation as white space ("Aplasia/Hypoplasia" -> "aplasia hypoplasia",
  "toe(s)" -> "toe s"), so that a mention written without a name's punctuation gets the same
  character n-grams; unlike ``biosyn`` it keeps NFKC. The capability suite found char 1-2 tf-idf's
  top-1 changing when a name lost its punctuation; ``--normalization words`` repairs that and raises
  Acc@1 on every tf-idf benchmark (eval/capabilities/capabilities_fix.md).
- ``faithful``: ``lower().strip()`` only, exactly as the Medical Crossing filtering does.
- ``biosyn``: as BioSyn's preprocessing: lower case, punctuation replaced by spaces, white space collapsed.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from linker.errors import UnknownNameError

Mode = Literal["default", "words", "faithful", "biosyn"]
MODES: tuple[str, ...] = ("default", "words", "faithful", "biosyn")

_SPACES = re.compile(r"\s+")
# Punctuation as Unicode defines it (categories P* and S*), so that "¿", "«" and "–" go too.
_PUNCT = re.compile(r"[^\w\s]|_")


def normalize(text: str, mode: Mode = "default") -> str:
    """Normalise `text` for matching; see the module docstring for the modes."""
    if mode == "default":
        return _SPACES.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()
    if mode == "words":
        return _SPACES.sub(" ", _PUNCT.sub(" ", unicodedata.normalize("NFKC", text).lower())).strip()
    if mode == "faithful":
        return text.lower().strip()
    if mode == "biosyn":
        return _SPACES.sub(" ", _PUNCT.sub(" ", text.lower())).strip()
    raise UnknownNameError("normalisation mode", mode, MODES)


def code_key(code: str) -> str:
    """The form in which concept ids are compared: trimmed, upper case, dots removed.

    ICD-10 codes arrive as ``s22.49xa`` (CodiEsp), ``S2249XA`` (CMS order file) or ``S22.49XA``;
    all compare equal. Ids of other terminologies (``8000/3``, ``C0002170``, ``HP:0001596``,
    ``10001234``) contain no dots and are only trimmed and upper-cased.
    """
    return code.strip().upper().replace(".", "")


def icd10cm_code(code: str) -> str:
    """Canonical ICD-10-CM display form: upper case with the dot after the category (``S22.49XA``)."""
    key = code_key(code)
    return key if len(key) <= 3 else f"{key[:3]}.{key[3:]}"


# UMLS / MedDRA language names -> ISO 639-1, used by the UMLS and MedDRA sources and by the CLI's --lang.
LANGUAGE_CODES: dict[str, str] = {
    "ENG": "en", "SPA": "es", "FRE": "fr", "GER": "de", "DUT": "nl", "ITA": "it", "POR": "pt",
    "JPN": "ja", "CHI": "zh", "CZE": "cs", "HUN": "hu", "RUS": "ru", "KOR": "ko", "POL": "pl",
    "SWE": "sv", "NOR": "no", "DAN": "da", "FIN": "fi", "GRE": "el", "HEB": "he", "TUR": "tr",
    "LAV": "lv", "CRO": "hr", "EST": "et", "BAQ": "eu", "ARA": "ar", "UKR": "uk", "PER": "fa",
}
