"""Capability suites (CheckList-style): test cases generated from an index's own concept table.

Two linkers with the same Acc@1 can fail in different ways; a capability suite says which. Cases
are made from the names of the concept table the index was built over, by rules and templates kept
as data files (``linker/data/capabilities/``, versioned by its ``manifest.json``), and scored per
capability:

- **INV** (invariance): the top-1 concept of a name must not change when the name is upper- or
  title-cased, loses its punctuation, gets extra white space, is made plural, has its words
  reordered, gets one or two typing errors (keyboard-adjacent substitution, deletion,
  transposition), is spelt the British/American way, or is wrapped in words a span detector may
  keep (determiners, severity, "history of", negation; ``templates.tsv``).
- **MFT** (minimum functionality): a synonym *held out of the index* must link to its concept
  (lay and abbreviation synonyms separately where the source marks them: ``term_types.tsv``); a
  concept's name in one language must link to it among the names of another (per language pair);
  a short form defined in a context sentence ("... {long} ({short}) ...", ``templates.tsv``) must,
  after the project's abbreviation expansion (`linker.preprocess`), link to the long form's concept.
- **DIR** (directional): for a child concept whose preferred name is held out, its parent must not
  rank above it (OBO ``is_a`` from ``hierarchy``, or ICD-10 code prefixes in the table itself).

"Held out" is a mask over name rows (`Linker.link(exclude=...)`): the cases of one capability are
removed together, as a test set is, so no index needs rebuilding. Sampling: each capability draws
up to `dict_sample` concepts among those the capability can use, with a generator seeded by
(`seed`, capability name), so adding a capability leaves the others' cases unchanged. Cases depend
only on the concept table, so indexes over one table are compared on identical cases.

Intervals are Wilson score intervals (95%) of the failure rate: unlike a bootstrap they are not
degenerate at 0 failures. The "most instructive" failures are those where the linker was most
confidently wrong (score of the wrong top-1 minus the expected concept's score, or the wrong score
alone when the expected concept is not in the top k), at most one per concept, taken in turn from
each variant (template, edit kind) so that ten examples show ten different ways of failing.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import json
import logging
import math
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

import linker
from linker.errors import ConfigError, InputFormatError, shorten
from linker.eval.charts import write_chart
from linker.fileio import Input, atomic_file, check_output, iter_lines, model_inputs
from linker.preprocess import expand_abbreviations, find_abbreviations
from linker.progress import bar
from linker.registry import Registry
from linker.text import code_key, normalize

log = logging.getLogger(__name__)

DATA = "data/capabilities"
DEFAULT_SAMPLE = 200
DEFAULT_SEED = 15
TOP_K = 10  # candidates kept per query: enough to find the expected concept's rank and score
EXAMPLES = 10
LINK_BATCH = 512  # queries per Linker call, as in linker.eval.report
Z95 = 1.959964  # two-sided 95% normal quantile for the Wilson interval
_WORD = re.compile(r"[^\W\d_]{4,}")  # a word of >= 4 letters: typo targets
_PUNCT = re.compile(r"[^\w\s]")

DESCRIPTIONS = {
    "INV case_upper": "name in upper case",
    "INV case_title": "name in title case",
    "INV punctuation": "punctuation and hyphens removed (replaced by a space or joined)",
    "INV whitespace": "extra white space between words and around the name",
    "INV plural": "last word made plural (English suffix rules)",
    "INV word_order": "words of a 2-4 word name permuted",
    "INV typo_1": "one typing error (keyboard-adjacent substitution, deletion or transposition)",
    "INV typo_2": "two typing errors",
    "INV spelling_us_uk": "American spelling made British or British made American",
    "INV wrapper_determiner": "wrapped: determiner (the, a, ...)",
    "INV wrapper_severity": "wrapped: severe, mild, chronic, acute",
    "INV wrapper_history": "wrapped: history of",
    "INV wrapper_negation": "wrapped: no, denies",
    "MFT synonym": "held-out synonym links to its concept",
    "MFT lay_synonym": "held-out lay synonym (HPO layperson, MedDRA LLT) links to its concept",
    "MFT abbreviation_synonym": "held-out abbreviation (source-marked) links to its concept, no context",
    "MFT abbreviation_context": "short form defined in a context sentence links to the long form's concept",
    "DIR parent": "held-out child name: the parent must not rank above the child",
}


# ----------------------------------------------------------------------------- data files


@dataclass(frozen=True)
class Template:
    kind: str  # "wrapper" | "abbreviation"
    capability: str
    lang: str
    text: str
    origin: str  # file:line, for reports and errors


@dataclass(frozen=True)
class SuiteData:
    """The rules and word lists of the suite, read from the package (and the user's templates)."""

    version: str
    templates: tuple[Template, ...]
    spelling: tuple[tuple[str, str], ...]  # (us stem, uk stem)
    plural: tuple[tuple[str, str], ...]  # (singular suffix, plural suffix; "" = no plural)
    keyboard: dict[str, str]  # letter -> its neighbours
    term_types: tuple[tuple[str, str], ...]  # (fnmatch pattern, capability; "" = not a test)
    sha256: dict[str, str]


def _lines(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.splitlines(), 1))


def _rows(path: Path | str, lines: Iterable[tuple[int, str]], columns: int, expected: str) -> Iterator[tuple[int, list[str]]]:
    for number, line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.rstrip("\n").split("\t")
        if len(cells) != columns:
            raise InputFormatError(path, expected, f"{len(cells)} tab-separated column(s): {shorten(line)}", line=number)
        yield number, cells


def _keyboard(rows: list[str]) -> dict[str, str]:
    """Letter -> neighbours on a staggered keyboard: each row sits half a key right of the one above,
    so key c touches keys c and c+1 of the row above and keys c-1 and c of the row below."""
    near: dict[str, set[str]] = {}
    for r, row in enumerate(rows):
        for c, letter in enumerate(row):
            out = near.setdefault(letter, set())
            out.update(row[max(0, c - 1): c] + row[c + 1: c + 2])
            if r > 0:
                out.update(rows[r - 1][c: c + 2])
            if r + 1 < len(rows):
                out.update(rows[r + 1][max(0, c - 1): c + 1])
            out.discard(letter)
    return {k: "".join(sorted(v)) for k, v in near.items()}


TEMPLATE_COLUMNS = "kind<TAB>capability<TAB>lang<TAB>template"


def read_templates(path: Path | str, lines: Iterable[tuple[int, str]] | None = None) -> tuple[Template, ...]:
    """Templates from a TSV of `TEMPLATE_COLUMNS`; a wrapper needs ``{name}``, an abbreviation ``{long}`` and ``{short}``."""
    out = []
    for number, (kind, capability, lang, template) in _rows(path, iter_lines(path) if lines is None else lines,
                                                             4, TEMPLATE_COLUMNS):
        needed = {"wrapper": ("{name}",), "abbreviation": ("{long}", "{short}")}.get(kind)
        if needed is None:
            raise InputFormatError(path, "kind 'wrapper' or 'abbreviation'", repr(kind), line=number)
        missing = [n for n in needed if n not in template]
        if missing or not capability.strip() or not lang.strip():
            raise InputFormatError(path, f"a {kind} template holding {' and '.join(needed)}, with a capability and a language",
                                   shorten(template), line=number)
        out.append(Template(kind, capability.strip(), lang.strip(), template, f"{Path(path).name}:{number}"))
    return tuple(out)


def load_suite_data(extra_templates: Sequence[str | Path] = ()) -> SuiteData:
    """The package's data files plus the user's template files (rows added to the package's)."""
    root = resources.files("linker") / DATA
    texts = {name: (root / name).read_text(encoding="utf-8")
             for name in ("manifest.json", "templates.tsv", "spelling.tsv", "plural.tsv", "keyboard.tsv", "term_types.tsv")}
    sha = {name: hashlib.sha256(text.encode()).hexdigest()[:16] for name, text in texts.items()}
    templates = read_templates("templates.tsv", _lines(texts["templates.tsv"]))
    for path in extra_templates:
        user = list(iter_lines(path))
        sha[str(path)] = hashlib.sha256("\n".join(line for _, line in user).encode()).hexdigest()[:16]
        templates += read_templates(path, user)
    return SuiteData(
        version=json.loads(texts["manifest.json"])["version"],
        templates=templates,
        spelling=tuple((us, uk) for _, (us, uk) in _rows("spelling.tsv", _lines(texts["spelling.tsv"]), 2, "us<TAB>uk")),
        plural=tuple((a, b) for _, (a, b) in _rows("plural.tsv", _lines(texts["plural.tsv"]), 2, "singular<TAB>plural")),
        keyboard=_keyboard([line.strip() for line in texts["keyboard.tsv"].splitlines()
                            if line.strip() and not line.startswith("#")]),
        term_types=tuple((p, c) for _, (p, c) in _rows("term_types.tsv", _lines(texts["term_types.tsv"]), 2, "pattern<TAB>capability")),
        sha256=sha,
    )


# ----------------------------------------------------------------------------- perturbations


def _rng(seed: int, capability: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(capability.encode())])


def _match_case(word: str, like: str) -> str:
    return word.upper() if like.isupper() and len(like) > 1 else word[:1].upper() + word[1:] if like[:1].isupper() else word


def typo(text: str, rng: np.random.Generator, keyboard: dict[str, str]) -> tuple[str, str] | None:
    """One typing error inside a word of >= 4 letters, never on its first letter; (text, edit kind)."""
    words = list(_WORD.finditer(text))
    if not words:
        return None
    word = words[rng.integers(len(words))]
    start, end = word.span()
    kinds = ["substitution", "deletion", "transposition"]
    kind = kinds[rng.integers(3)]
    i = start + 1 + int(rng.integers(end - start - 1))  # a position after the first letter
    if kind == "substitution":
        near = keyboard.get(text[i].lower(), "")
        if not near:
            kind = "deletion"
        else:
            c = near[rng.integers(len(near))]
            return text[:i] + (c.upper() if text[i].isupper() else c) + text[i + 1:], kind
    if kind == "transposition":
        i = min(i, end - 2)
        if text[i] != text[i + 1]:
            return text[:i] + text[i + 1] + text[i] + text[i + 2:], kind
        kind = "deletion"
    return text[:i] + text[i + 1:], kind


def plural(text: str, rules: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """The name with its last word made plural by the first matching suffix rule; (text, rule)."""
    head, _, last = text.rpartition(" ")
    if "," in text or not last.isalpha() or len(last) < 3:
        return None
    lower = last.lower()
    for singular, plural_suffix in rules:
        if lower.endswith(singular):
            if not plural_suffix:
                return None
            if singular == "y" and lower[-2:-1] in "aeiou":
                continue
            stem = last[: len(last) - len(singular)]
            new = stem + (plural_suffix.upper() if last.isupper() else plural_suffix)
            return (f"{head} {new}" if head else new), f"-{singular or '*'} -> -{plural_suffix}"
    return None


@lru_cache(maxsize=8)
def _spelling_patterns(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern, str, str], ...]:
    return tuple((re.compile(rf"\b{re.escape(a)}", re.IGNORECASE), a, b) for us, uk in pairs for a, b in ((us, uk), (uk, us)))


def respell(text: str, pairs: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """American stems made British, or British made American, at the start of words; (text, stems)."""
    for pattern, a, b in _spelling_patterns(tuple(pairs)):
        if pattern.search(text):
            return pattern.sub(lambda m: _match_case(b, m.group(0)), text), f"{a} -> {b}"
    return None


def unpunctuate(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    if not _PUNCT.search(text):
        return None
    if "-" in text and rng.integers(2):
        return re.sub(r"\s+", " ", text.replace("-", "")).strip(), "hyphen joined"
    return re.sub(r"\s+", " ", _PUNCT.sub(" ", text)).strip(), "punctuation to space"


def permute(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    words = text.split()
    if not 2 <= len(words) <= 4:
        return None
    for _ in range(10):
        order = rng.permutation(len(words))
        if list(order) != list(range(len(words))):
            return " ".join(words[i] for i in order), "order " + "".join(str(i + 1) for i in order)
    return None


def initials(name: str) -> str | None:
    """An initialism of a 2-5 word name made only of letters ("Atrial septal defect" -> "ASD")."""
    words = [w for w in re.split(r"[\s-]+", name) if w]
    if not 2 <= len(words) <= 5 or not all(w.isalpha() for w in words):
        return None
    return "".join(w[0] for w in words).upper()


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One test: link `query` (optionally among `target_lang` names only, with `held_out` rows left out)."""

    capability: str  # "INV typo_1", "MFT translation es->en", ...
    variant: str  # the template or edit that made the query
    query: str
    source_name: str  # the concept-table name it was made from
    concept_id: str  # the expected concept (DIR: the child)
    lang: str
    parent_id: str = ""  # DIR: the parent that must not outrank the child
    target_lang: str | None = None  # MFT translation: candidates restricted to this language
    held_out: tuple[int, ...] = ()  # concept-table rows left out of the index for this capability

    @property
    def test(self) -> str:
        return self.capability.split()[0]


@dataclass
class _Table:
    ids: list[str]
    names: list[str]
    langs: list[str]
    types: list[str]
    preferred: list[bool]
    sources: list[str]
    by_concept: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, table) -> _Table:
        t = cls(*(table.column(c).to_pylist() for c in ("concept_id", "name", "lang", "term_type", "preferred", "source")))
        for row, concept_id in enumerate(t.ids):
            t.by_concept.setdefault(concept_id, []).append(row)
        return t

    def preferred_row(self, concept_id: str, lang: str | None = None) -> int | None:
        rows = [r for r in self.by_concept[concept_id] if lang is None or self.langs[r] == lang]
        return next((r for r in rows if self.preferred[r]), rows[0] if rows else None)

    def same_name_rows(self, row: int) -> list[int]:
        """Rows of the same concept whose name normalises to the same text (held out together)."""
        key = normalize(self.names[row])
        return [r for r in self.by_concept[self.ids[row]] if normalize(self.names[r]) == key]


def _sample(rng: np.random.Generator, items: list, n: int) -> list:
    if len(items) <= n:
        return items
    return [items[i] for i in sorted(rng.choice(len(items), size=n, replace=False))]


def icd10_parents(t: _Table) -> dict[str, tuple[str, ...]]:
    """Child code -> its nearest ancestor code in the table, by code prefix, for ICD-10 sources."""
    icd = {t.ids[r] for r in range(len(t.ids)) if t.sources[r].lower().startswith(("icd10", "cie10"))}
    keys = {code_key(c): c for c in icd}
    out = {}
    for concept_id in icd:
        key = code_key(concept_id)
        for end in range(len(key) - 1, 2, -1):
            if key[:end] in keys:
                out[concept_id] = (keys[key[:end]],)
                break
    return out


@dataclass(frozen=True)
class CaseContext:
    """What every case generator draws from: the concept table, the suite's rules and the sampling settings."""

    table: _Table
    data: SuiteData
    sample: int  # concepts drawn per capability, at most
    seed: int
    parents: dict[str, tuple[str, ...]]  # child -> its is_a parents (an OBO hierarchy); may be empty
    concepts: list[str]  # the table's concept ids, sorted
    langs: list[str]  # its languages, sorted
    preferred: dict[str, list[int]]  # concept -> its preferred name rows
    synonyms: dict[str, list[tuple[str, int]]]  # term_types capability -> (concept, row) of its non-preferred names

    @classmethod
    def of(cls, table, data: SuiteData, *, sample: int, seed: int,
           parents: dict[str, tuple[str, ...]] | None) -> CaseContext:
        t = _Table.of(table)
        concepts = sorted(t.by_concept)
        synonyms: dict[str, list[tuple[str, int]]] = {}
        for row in range(len(t.ids)):
            if t.preferred[row]:
                continue
            kind = next((c for p, c in data.term_types if fnmatch.fnmatchcase(t.types[row], p)), "")
            if kind:
                synonyms.setdefault(kind, []).append((t.ids[row], row))
        return cls(t, data, sample, seed, dict(parents or {}), concepts, sorted(set(t.langs)),
                   {c: [r for r in t.by_concept[c] if t.preferred[r]] for c in concepts}, synonyms)


# Name -> a function of a `CaseContext` returning its cases. `generate_cases` calls them in registration order
# (the order below), so the cases of a suite come out in one fixed order; each capability seeds its own generator
# (`_rng`), so a new entry leaves the others' cases unchanged. An entry may make several capabilities (one per
# template capability, term type or language pair).
CASE_GENERATORS: Registry[Callable[[CaseContext], list[Case]]] = Registry("capability generator")


def generate_cases(table, data: SuiteData, *, sample: int = DEFAULT_SAMPLE, seed: int = DEFAULT_SEED,
                   parents: dict[str, tuple[str, ...]] | None = None) -> list[Case]:
    """Every capability's cases for a concept table (a pyarrow table of the concept schema)."""
    context = CaseContext.of(table, data, sample=sample, seed=seed, parents=parents)
    return [case for name in CASE_GENERATORS for case in CASE_GENERATORS[name](context)]


# INV: a concept's preferred name (its first language with a usable one), perturbed.

Perturb = Callable[[str, np.random.Generator, str], "tuple[str, str] | None"]  # (name, rng, lang) -> (text, variant)


def _inv(ctx: CaseContext, capability: str, make: Perturb, langs_ok: Iterable[str] | None = None) -> list[Case]:
    """A sample of the concepts whose preferred name (in `langs_ok`) `make` changes, one case each."""
    t, rng = ctx.table, _rng(ctx.seed, capability)
    allowed = set(langs_ok) if langs_ok is not None else None
    eligible = []
    for concept_id in ctx.concepts:
        for row in (r for r in ctx.preferred[concept_id] if allowed is None or t.langs[r] in allowed):
            made = make(t.names[row], rng, t.langs[row])
            if made is not None and made[0].strip() and made[0] != t.names[row]:
                eligible.append(Case(f"INV {capability}", made[1], made[0], t.names[row], concept_id, t.langs[row]))
                break
    return _sample(rng, eligible, ctx.sample)


@CASE_GENERATORS.register("INV case_upper")
def _case_upper(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "case_upper", lambda name, rng, lang: (name.upper(), "upper"))


@CASE_GENERATORS.register("INV case_title")
def _case_title(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "case_title", lambda name, rng, lang: (name.title(), "title"))


@CASE_GENERATORS.register("INV punctuation")
def _punctuation(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "punctuation", lambda name, rng, lang: unpunctuate(name, rng))


@CASE_GENERATORS.register("INV whitespace")
def _whitespace(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "whitespace", lambda name, rng, lang:
                (" " + "  ".join(name.split()) + " ", "doubled spaces") if " " in name else None)


@CASE_GENERATORS.register("INV plural")
def _plural(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "plural", lambda name, rng, lang: plural(name, ctx.data.plural), langs_ok=["en"])


@CASE_GENERATORS.register("INV word_order")
def _word_order(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "word_order", lambda name, rng, lang: permute(name, rng))


@CASE_GENERATORS.register("INV typo_1")
def _typo_1(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "typo_1", lambda name, rng, lang: typo(name, rng, ctx.data.keyboard))


@CASE_GENERATORS.register("INV typo_2")
def _typo_2(ctx: CaseContext) -> list[Case]:
    def two_typos(name: str, rng: np.random.Generator, lang: str) -> tuple[str, str] | None:
        first = typo(name, rng, ctx.data.keyboard)
        second = typo(first[0], rng, ctx.data.keyboard) if first else None
        return (second[0], f"{first[1]} + {second[1]}") if second else None

    return _inv(ctx, "typo_2", two_typos)


@CASE_GENERATORS.register("INV spelling_us_uk")
def _spelling(ctx: CaseContext) -> list[Case]:
    return _inv(ctx, "spelling_us_uk", lambda name, rng, lang: respell(name, ctx.data.spelling), langs_ok=["en"])


@CASE_GENERATORS.register("INV wrapper_*")
def _wrappers(ctx: CaseContext) -> list[Case]:
    """One capability per wrapper capability of the templates (in template order), in the languages it has."""
    wrappers: dict[str, dict[str, list[Template]]] = {}
    for tpl in ctx.data.templates:
        if tpl.kind == "wrapper":
            wrappers.setdefault(tpl.capability, {}).setdefault(tpl.lang, []).append(tpl)

    def wrap(by_lang: dict[str, list[Template]]) -> Perturb:
        def make(name: str, rng: np.random.Generator, lang: str) -> tuple[str, str] | None:
            options = by_lang.get(lang)
            if not options:
                return None
            tpl = options[rng.integers(len(options))]
            return tpl.text.replace("{name}", name), tpl.text
        return make

    return [case for capability, by_lang in wrappers.items()
            for case in _inv(ctx, f"wrapper_{capability}", wrap(by_lang), langs_ok=list(by_lang))]


# MFT: names held out of the index, or asked for among another language's names, must still find their concept.


@CASE_GENERATORS.register("MFT <term type>")
def _held_out_synonyms(ctx: CaseContext) -> list[Case]:
    """Per `term_types.tsv` capability (sorted): one held-out synonym each of a sample of concepts."""
    t, cases = ctx.table, []
    for kind, rows in sorted(ctx.synonyms.items()):
        capability = f"MFT {kind}"
        rng = _rng(ctx.seed, capability)
        per_concept: dict[str, list[int]] = {}
        for concept_id, row in rows:
            per_concept.setdefault(concept_id, []).append(row)
        for concept_id in _sample(rng, sorted(per_concept), ctx.sample):
            options = per_concept[concept_id]
            row = options[rng.integers(len(options))]
            cases.append(Case(capability, t.types[row], t.names[row], t.names[row], concept_id, t.langs[row],
                              held_out=tuple(t.same_name_rows(row))))
    return cases


@CASE_GENERATORS.register("MFT translation *->*")
def _translations(ctx: CaseContext) -> list[Case]:
    """Per language pair: each other language to the pivot (English when there) and back."""
    pivot = "en" if "en" in ctx.langs else (ctx.langs[0] if ctx.langs else "")
    return [case for other in ctx.langs if other != pivot for src, tgt in ((other, pivot), (pivot, other))
            for case in _translation(ctx, src, tgt)]


def _translation(ctx: CaseContext, src: str, tgt: str) -> list[Case]:
    """A sample of the concepts with names in both languages: the `src` name, among the `tgt` names only."""
    t, capability = ctx.table, f"MFT translation {src}->{tgt}"
    rng = _rng(ctx.seed, capability)
    eligible = []
    for concept_id in ctx.concepts:
        if any(t.langs[r] == tgt for r in t.by_concept[concept_id]):
            row = t.preferred_row(concept_id, src)
            if row is not None:
                eligible.append(Case(capability, f"{src}->{tgt}", t.names[row], t.names[row], concept_id, src,
                                     target_lang=tgt))
    return _sample(rng, eligible, ctx.sample)


@CASE_GENERATORS.register("MFT abbreviation_context")
def _abbreviation_context(ctx: CaseContext) -> list[Case]:
    """A short form defined in an English context sentence: the source's abbreviation synonym, else the initials."""
    tpls = [tpl for tpl in ctx.data.templates if tpl.kind == "abbreviation" and tpl.lang == "en"]
    if not tpls:
        return []
    t, capability = ctx.table, "MFT abbreviation_context"
    rng = _rng(ctx.seed, capability)
    marked = dict(ctx.synonyms.get("abbreviation_synonym", ()))  # concept -> its (last) source short form
    eligible = []
    for concept_id in ctx.concepts:
        long_row = t.preferred_row(concept_id, "en")
        if long_row is None or t.langs[long_row] != "en":
            continue
        long = t.names[long_row]
        if concept_id in marked:
            row = marked[concept_id]
            short, variant, held = t.names[row], "source short form", t.same_name_rows(row)
        else:
            short, variant, held = initials(long), "initials", []
        if short is None:
            continue
        tpl = tpls[rng.integers(len(tpls))]
        sentence = tpl.text.replace("{long}", long).replace("{short}", short)
        query = expand_abbreviations(short, find_abbreviations(sentence))
        eligible.append(Case(capability, f"{variant}: {tpl.text}", query, f"{short} in: {sentence}", concept_id, "en",
                             held_out=tuple(held)))
    return _sample(rng, eligible, ctx.sample)


# DIR: the parent must not outrank the child when the child's preferred name is held out.


@CASE_GENERATORS.register("DIR parent")
def _parent(ctx: CaseContext) -> list[Case]:
    """One case per child with a parent in the table (OBO is_a, else ICD-10 code prefix) and another name left to
    find it by."""
    t, hierarchy = ctx.table, dict(ctx.parents)
    for child, ps in icd10_parents(t).items():
        hierarchy.setdefault(child, ps)
    if not hierarchy:
        return []
    capability = "DIR parent"
    rng = _rng(ctx.seed, capability)
    eligible = []
    for child in ctx.concepts:
        ps = [p for p in hierarchy.get(child, ()) if p in t.by_concept]
        row = t.preferred_row(child, "en") if ps else None
        if row is None:
            continue
        held = t.same_name_rows(row)
        if len(t.by_concept[child]) <= len(held):
            continue  # no other name would be left to find the child by
        for p in ps:
            eligible.append(Case(capability, "is_a" if child in ctx.parents else "code prefix",
                                 t.names[row], t.names[row], child, t.langs[row], parent_id=p, held_out=tuple(held)))
    # one case per child: its first parent in the sample order
    seen: set[str] = set()
    unique = [c for c in eligible if not (c.concept_id in seen or seen.add(c.concept_id))]
    return _sample(rng, unique, ctx.sample)


# ----------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Failure:
    """One failed case: what was asked, what was expected, what came back."""

    query: str
    source_name: str
    variant: str
    expected_id: str
    expected_name: str
    got_id: str  # "" when there was no candidate at all
    got_name: str
    matched_name: str
    score: float
    expected_rank: int  # 1-based rank of the expected concept in the top-k; 0 = not in it
    before_id: str = ""  # INV: the top-1 of the unperturbed name; DIR: the parent id
    margin: float = math.nan  # how confidently wrong: wrong score minus expected score


@dataclass(frozen=True)
class CapabilityRow:
    capability: str
    description: str
    n: int
    failures: int
    rate: float
    low: float
    high: float
    examples: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class CapabilityReport:
    label: str
    index: str
    rows: tuple[CapabilityRow, ...]
    seconds: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def row(self, capability: str) -> CapabilityRow:
        return next(r for r in self.rows if r.capability == capability)

    def to_dict(self) -> dict:
        return asdict(self)


def wilson_interval(failures: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% by default); (nan, nan) when n == 0.

    The interval always holds the observed rate. In floating point centre - half and centre + half
    land a rounding error off their exact values 0 and 1 at 0/n and n/n (1.0 - 1e-16 at 4/4, which
    put the rate outside its own interval and made the chart's error bar negative), so the bounds
    are clamped to the rate and to [0, 1].
    """
    if n == 0:
        return math.nan, math.nan
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def _instructive(failures: list[tuple[str, Failure]], count: int) -> tuple[Failure, ...]:
    """Most confidently wrong first, one per concept, variants taken in turn (see module docstring)."""
    by_variant: dict[str, list[Failure]] = {}
    for variant, f in sorted(failures, key=lambda vf: (-vf[1].margin if not math.isnan(vf[1].margin) else 0.0,
                                                      vf[1].expected_id, vf[1].query)):
        by_variant.setdefault(variant, []).append(f)
    out: list[Failure] = []
    seen: set[str] = set()
    queues = list(by_variant.values())
    while len(out) < count and any(queues):
        for queue in queues:
            while queue:
                f = queue.pop(0)
                if f.expected_id not in seen:
                    seen.add(f.expected_id)
                    out.append(f)
                    break
            if len(out) >= count:
                break
    return tuple(out)


def run_cases(linker_, cases: Sequence[Case], *, label: str | None = None, progress: bool | None = None) -> CapabilityReport:
    """Link every case with `linker_` (a `linker.link.Linker`) and score each capability."""
    started = time.perf_counter()
    size = linker_.concepts.table.num_rows
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault((case.capability, case.target_lang), []).append(i)
    results: list = [None] * len(cases)
    before: dict[str, tuple] = {}
    inv_sources = sorted({c.source_name for c in cases if c.test == "INV"})
    reporter = bar(len(cases) + len(inv_sources), desc="linking capability cases", unit="case", show=progress)

    def link(texts: list[str], **kwargs) -> list:
        out = []
        for start in range(0, len(texts), LINK_BATCH):
            out += linker_.link(texts[start: start + LINK_BATCH], k=TOP_K, **kwargs)
            reporter.update(min(LINK_BATCH, len(texts) - start))
        return out

    for name, result in zip(inv_sources, link(inv_sources)):
        before[name] = result.candidates
    for (capability, target_lang), members in groups.items():
        exclude = None
        held = [r for i in members for r in cases[i].held_out]
        if held:
            exclude = np.zeros(size, dtype=bool)
            exclude[held] = True
        queries = list(dict.fromkeys(cases[i].query for i in members))
        linked = dict(zip(queries, link(queries, lang=target_lang, exclude=exclude)))
        for i in members:
            results[i] = linked[cases[i].query].candidates
    reporter.close()
    link_seconds = time.perf_counter() - started

    rows = []
    for capability in dict.fromkeys(c.capability for c in cases):
        members = [i for i, c in enumerate(cases) if c.capability == capability]
        failed = [(cases[i].variant, f) for i in members
                  if (f := _failure(cases[i], results[i], before.get(cases[i].source_name))) is not None]
        n, k = len(members), len(failed)
        low, high = wilson_interval(k, n)
        rows.append(CapabilityRow(capability, _describe(capability), n, k, k / n if n else math.nan, low, high,
                                  _instructive(failed, EXAMPLES)))
    config = {
        "library_version": linker.__version__,
        "evaluated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "index_version": linker_.version,
        "index_kind": linker_.manifest.get("kind"),
        "encoder": {k: v for k, v in (linker_.manifest.get("encoder") or {}).items() if k != "path"} or None,  # no machine paths
        "reranker": None if linker_.reranker is None else str(linker_.manifest.get("reranker") or "given"),
        "cases": len(cases),
        "top_k": TOP_K,
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    seconds = {"link": round(link_seconds, 3), "total": round(time.perf_counter() - started, 3)}
    return CapabilityReport(label or linker_.index.folder.name, str(linker_.index.folder), tuple(rows), seconds, config)


def _failure(case: Case, cands, prior) -> Failure | None:
    """The case's failure, or None when it passes: INV fails when the top-1 concept differs from `prior`'s (the
    unperturbed name's candidates), DIR when the parent ranks above the child, MFT when the top-1 is not expected."""
    ids = [c.concept_id for c in cands]
    rank = ids.index(case.concept_id) + 1 if case.concept_id in ids else 0
    expected_score = cands[rank - 1].score if rank else math.nan
    top = cands[0] if cands else None
    if case.test == "INV":
        prior_id = prior[0].concept_id if prior else ""
        bad = (top.concept_id if top else "") != prior_id
        before_id = prior_id
    elif case.test == "DIR":
        parent_rank = ids.index(case.parent_id) + 1 if case.parent_id in ids else 0
        bad = parent_rank > 0 and (rank == 0 or parent_rank < rank)
        before_id = case.parent_id
    else:
        bad = top is None or top.concept_id != case.concept_id
        before_id = ""
    if not bad:
        return None
    margin = (top.score - (expected_score if rank else 0.0)) if top else math.nan
    return Failure(
        query=case.query, source_name=case.source_name, variant=case.variant, expected_id=case.concept_id,
        expected_name=case.source_name, got_id=top.concept_id if top else "",
        got_name=top.preferred_name if top else "", matched_name=top.matched_name if top else "",
        score=round(float(top.score), 4) if top else math.nan, expected_rank=rank, before_id=before_id,
        margin=round(float(margin), 4) if not math.isnan(margin) else math.nan)


def _describe(capability: str) -> str:
    if capability in DESCRIPTIONS:
        return DESCRIPTIONS[capability]
    if capability.startswith("MFT translation"):
        return f"name in {capability.split()[-1].split('->')[0]} links to its concept among {capability.split('->')[-1]} names"
    if capability.startswith("INV wrapper_"):
        return f"wrapped by the '{capability.removeprefix('INV wrapper_')}' templates"
    return capability


def evaluate_capabilities(
    index_dirs: Sequence[str | Path],
    *,
    sample: int = DEFAULT_SAMPLE,
    seed: int = DEFAULT_SEED,
    templates: Sequence[str | Path] = (),
    hierarchy: str | Path | None = None,
    labels: Sequence[str] | None = None,
    report_dir: str | Path | None = None,
    name: str | None = None,
    progress: bool | None = None,
    rerank: str | Path | None = None,
    rerank_k: int | None = None,
    overwrite: bool = False,
) -> list[CapabilityReport]:
    """Run the capability suite on each index; cases are generated once per distinct concept table.

    `hierarchy`: an OBO file whose ``is_a`` lines give the DIR cases (ICD-10 code prefixes are
    found in the table itself). `templates`: the user's template files, rows added to the package's.
    `rerank`/`rerank_k`: as `Linker.load` (an index's bound re-ranker is used unless `rerank` is "none").
    The report files replace existing ones only with `overwrite`, and never an input (checked first).
    """
    from linker.link import Linker

    if sample < 1:
        raise ConfigError(f"--dict-sample must be a positive number of concepts, found {sample}")
    if labels is not None and len(labels) != len(index_dirs):
        raise ConfigError(f"{len(labels)} label(s) for {len(index_dirs)} index(es)")
    inputs = [*(Input(d, "--index") for d in index_dirs), *(Input(t, "--templates") for t in templates),
              *([Input(hierarchy, "--hierarchy")] if hierarchy else []), *model_inputs(rerank, "--rerank")]
    if report_dir is not None:
        report_paths(report_dir, name, inputs=inputs, overwrite=overwrite)
    data = load_suite_data(templates)
    parents = None
    if hierarchy is not None:
        from linker.sources.obo import read_obo_parents

        parents = read_obo_parents(hierarchy)
    by_table: dict[str, list[Case]] = {}
    reports = []
    for i, index_dir in enumerate(index_dirs):
        t = time.perf_counter()
        linker_ = Linker.load(index_dir, rerank=rerank, **({} if rerank_k is None else {"rerank_k": rerank_k}))
        load_seconds = time.perf_counter() - t
        sha = linker_.manifest["concepts"]["sha256"]
        t = time.perf_counter()
        if sha not in by_table:
            by_table[sha] = generate_cases(linker_.concepts.table, data, sample=sample, seed=seed, parents=parents)
        generate_seconds = time.perf_counter() - t
        cases = by_table[sha]
        log.info("%s: %d cases", index_dir, len(cases))
        report = run_cases(linker_, cases, label=labels[i] if labels else None, progress=progress)
        report.seconds.update(load_index=round(load_seconds, 3), generate=round(generate_seconds, 3))
        report.config.update({
            "suite_data_version": data.version, "suite_data_sha256": data.sha256, "dict_sample": sample, "seed": seed,
            "templates": [str(p) for p in templates], "hierarchy": str(hierarchy) if hierarchy else None,
            "concept_table_sha256": sha, "interval": "Wilson score, 95%",
        })
        reports.append(report)
    if report_dir is not None:
        write_capability_report(reports, report_dir, name=name, overwrite=overwrite, inputs=inputs)
    return reports


# ----------------------------------------------------------------------------- output


def _pct(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def capability_table(reports: Sequence[CapabilityReport]) -> str:
    """One row per capability, per index: failure rate % [95% interval] and n."""
    capabilities = list(dict.fromkeys(r.capability for rep in reports for r in rep.rows))
    head = ["capability", "what changes"] + [f"{rep.label} fail % [95% CI]" for rep in reports] + ["n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for capability in capabilities:
        # the row's own description: a suite other than this one (the extractor's) describes its capabilities
        described = next((r.description for rep in reports for r in rep.rows if r.capability == capability), "")
        cells = [capability, described or _describe(capability)]
        n = ""
        for rep in reports:
            row = next((r for r in rep.rows if r.capability == capability), None)
            cells.append("" if row is None else f"{_pct(row.rate)} [{_pct(row.low)}, {_pct(row.high)}]")
            n = n or ("" if row is None else f"{row.n:,}")
        lines.append("| " + " | ".join(cells + [n]) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def weakest_failures(reports: Sequence[CapabilityReport]) -> str:
    """Per capability, the weakest index's most instructive failures."""
    out = []
    capabilities = list(dict.fromkeys(r.capability for rep in reports for r in rep.rows))
    for capability in capabilities:
        rows = [(rep, r) for rep in reports for r in rep.rows if r.capability == capability and r.n]
        if not rows:
            continue
        rep, row = max(rows, key=lambda pair: (pair[1].rate, -reports.index(pair[0])))
        out.append(f"### {capability}: weakest is {rep.label} ({_pct(row.rate)}% of {row.n:,} fail)")
        out.append("")
        if not row.examples:
            out.append("No failures.")
            out.append("")
            continue
        extra = {"INV": "top-1 before", "DIR": "parent"}.get(capability.split()[0])
        head = ["query", "variant", "expected", "got (matched name)", "score", "expected rank"] + ([extra] if extra else [])
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f in row.examples:
            got = f"{f.got_id} {f.got_name} ({f.matched_name})" if f.got_id else "no candidate"
            cells = [f"`{_cell(f.query)}`", _cell(f.variant), f"{f.expected_id} {_cell(f.expected_name)}", _cell(got),
                     "" if math.isnan(f.score) else f"{f.score:.3f}", str(f.expected_rank or "–")]
            if extra:
                cells.append(f.before_id)
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _chart(reports: Sequence[CapabilityReport], path: Path, title: str) -> None:
    from linker.extras import require

    matplotlib = require("matplotlib", extra="plots", what="the capability chart")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capabilities = list(dict.fromkeys(r.capability for rep in reports for r in rep.rows))
    height = 0.8 / len(reports)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * len(capabilities) * max(1, len(reports)) ** 0.6))
    y = np.arange(len(capabilities))
    for j, rep in enumerate(reports):
        rows = {r.capability: r for r in rep.rows}
        values = [100 * rows[c].rate if c in rows and rows[c].n else 0 for c in capabilities]
        errors = np.array([[100 * (rows[c].rate - rows[c].low), 100 * (rows[c].high - rows[c].rate)]
                           if c in rows and rows[c].n else [0, 0] for c in capabilities]).T
        # matplotlib refuses a negative error bar: a report read back from JSON may hold a rate a rounding
        # error outside its interval (wilson_interval clamps since), and an unknown bound is no bar at all
        errors = np.clip(np.nan_to_num(errors, nan=0.0), 0.0, None)
        ax.barh(y + j * height, values, height, xerr=errors, capsize=1.5, label=rep.label)
    ax.set_yticks(y + height * (len(reports) - 1) / 2, capabilities, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("failure rate (%), 95% Wilson interval")
    ax.set_xlim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def report_paths(report_dir: str | Path, name: str | None, *, inputs: Sequence[str | Path] = (),
                 overwrite: bool = False) -> dict[str, Path]:
    """The report's files, refused when one exists (without `overwrite`) or is an input."""
    paths = {ext: Path(report_dir) / f"{name or 'capabilities'}.{ext}" for ext in ("json", "md", "png")}
    for path in paths.values():
        check_output(path, inputs=inputs, overwrite=overwrite, option="--report")
    return paths


def write_capability_report(reports: Sequence[CapabilityReport], report_dir: str | Path, *,
                            name: str | None = None, intro: str = "", overwrite: bool = False,
                            inputs: Sequence[str | Path] = ()) -> list[Path]:
    """``NAME.md`` (side-by-side table + weakest system's failures), ``NAME.json`` and ``NAME.png``."""
    if not reports:
        raise ConfigError("no capability report to write")
    name = name or "capabilities"
    paths = report_paths(report_dir, name, inputs=inputs, overwrite=overwrite)
    first = reports[0].config
    with atomic_file(paths["json"]) as tmp:
        tmp.write_text(json.dumps([r.to_dict() for r in reports], ensure_ascii=False, indent=2, default=str) + "\n",
                       encoding="utf-8")
    md = [
        f"# Capability suite: {', '.join(r.label for r in reports)}",
        "",
        *([intro, ""] if intro else []),
        f"Suite data version {first.get('suite_data_version')}, up to {first.get('dict_sample')} concepts per capability, "
        f"seed {first.get('seed')}; failure rate in %, 95% Wilson interval in brackets; n cases per capability "
        f"(identical cases for indexes over one concept table). INV fails when the top-1 concept changes, MFT when "
        "the top-1 is not the expected concept, DIR when the parent ranks above the child.",
        "",
        capability_table(reports),
        "",
        "Indexes: " + "; ".join(f"{r.label} = `{r.config.get('index_version')}`" for r in reports),
        "",
        "Seconds: " + "; ".join(f"{r.label} " + ", ".join(f"{k} {v:.1f}" for k, v in r.seconds.items()) for r in reports),
        "",
        f"Load average while running: {first.get('load_average')} on {first.get('cpu_count')} CPUs.",
        "",
        "## What the weakest system gets wrong",
        "",
        "Up to ten failures per capability, most confidently wrong first, one per concept, spread over variants. "
        "Expected rank – = the expected concept is not in the top 10.",
        "",
        weakest_failures(reports),
    ]
    with atomic_file(paths["md"]) as tmp:
        tmp.write_text("\n".join(md), encoding="utf-8")
    # The tables are written; a chart must never cost them (nor the exit code).
    if not write_chart(paths["png"], lambda tmp: _chart(reports, tmp, name), overwrite=overwrite,
                       tables=f"{paths['md'].name} and {paths['json'].name}"):
        return [paths["json"], paths["md"]]
    return list(paths.values())
