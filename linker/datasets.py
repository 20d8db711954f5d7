"""Labelled datasets: annotated corpora -> a flat list of `Mention`s with gold concept ids.

Read by evaluation (`linker.eval`), training (`linker.train`) and index priors (`linker.index.build_index(prior=...)`)
alike, so this module sits below all three and imports none of them.

A dataset is named by a spec ``FORMAT:PATH[#OPTIONS]``; OPTIONS are ``&``-separated flags or
``key=value`` pairs (``brat:Mantra-GSC-brat.zip#lang=es``, ``codiesp:testX.tsv#P``).

Gold ids keep two different kinds of "several ids" apart, because they score differently
(see `linker.eval.metrics`): ``Mention.gold`` is a tuple of *parts*; every part must be found
(a composite mention names several concepts), and each part is a tuple of *alternative* ids,
any one of which is right. How each format spells them, read from the data itself:

- ``pubtator`` (NCBI-disease, BC5CDR): ``A|B`` is a composite mention (NCBI marks all of them
  ``CompositeMention`` or ``Modifier``, e.g. "breast and ovarian cancer" ``D001943|D010051``;
  BC5CDR adds the part texts in a 7th column) and ``A+B`` is one mention that only the two
  concepts together describe ("renal hamartomas" ``D007674+D006222``); both are parts that must
  all be right. The corpora have no alternatives. Mentions whose id is ``-1`` (BC5CDR: no
  concept) are left out, and counted in the log. NCBI ids ``MESH:D…`` and bare ``D…`` are the same
  concept in MEDIC; the ``MESH:`` prefix is removed so that both compare equal.
  Options rewrite the mention texts as BioSyn's query preprocessing did (`linker.preprocess`):
  ``abbrev`` expands abbreviations defined in the same abstract ("WD" -> "Wilson disease"),
  ``split`` splits composite mentions into one text per concept (``Mention.parts_text``),
  ``typos=FILE`` fixes words from a ``typo||correction`` list, and ``biosyn`` does ``abbrev``,
  ``split``, lower case and punctuation removal together and reads a mixed MeSH/OMIM list
  (``OMIM:201400|C535668``, one disease with two ids) as alternatives, not as two parts.
- ``biosyn`` (BioSyn's processed ``*.concept`` files ``doc||start|end||type||mention||cui``):
  ``|`` separates alternatives, as BioSyn's own ``check_label`` treats it, and ``+`` parts.
- ``tsv`` (``id<TAB>mention[<TAB>lang]``) and ``query`` (``id||mention``): as ``biosyn``.
- ``brat`` (Cantemist, Mantra GSC): one id per text-bound annotation, from its ``AnnotatorNotes``:
  the whole note for Cantemist (an ICD-O-3 morphology code ``8000/3``; the 307 ``/H`` codes, a
  Cantemist extension for codes absent from the official list, are read without ``/H`` because
  only the base codes have names), the first quoted field for Mantra
  (``"C0030705", "Patients", …``). Discontinuous spans ``10 20;30 40`` give start 10, end 40.
  The language comes from a folder named after it (``Mantra-GSC/Spanish/…`` -> ``es``);
  option ``lang=xx`` keeps that language only, and gives it to files whose folders name none.
  Options ``abbrev`` and ``typos=FILE`` rewrite mention texts as for ``pubtator``, the abbreviations
  found in the document's ``.txt`` ("carcinoma ductal infiltrante (CDI)" -> "CDI" in a mention is
  expanded).
- ``lay`` (``linker/data/lay/lay_test.tsv``, ``lay_dev.tsv``): a header ``text<TAB>concept_ids<TAB>origin``,
  then one phrase per row, ``|`` separating alternative gold ids; option ``origin=A,B`` keeps those origins.
- ``codiesp`` (``*X.tsv``): option ``D`` (diagnoses, the default) or ``P`` (procedures);
  language ``es``; codes as written (``s22.49xa``); metrics compare them through
  `linker.text.code_key`.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError, UnknownNameError, shorten
from linker.fileio import Input
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.formats.brat import brat_sources, read_source
from linker.formats.codiesp import read_codiesp
from linker.formats.mention_lists import read_biosyn, read_id_list
from linker.formats.pubtator import read_pubtator
from linker.preprocess import expand_abbreviations, find_abbreviations, fix_typos, read_typos, split_composite
from linker.registry import Registry
from linker.text import normalize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mention:
    """One test mention: its text, its gold ids (parts x alternatives), language and place."""

    text: str
    gold: tuple[tuple[str, ...], ...]
    lang: str = "en"
    doc_id: str = ""
    start: int = -1
    end: int = -1
    parts_text: tuple[str, ...] = ()  # a composite mention split into one text per concept (option split)

    @property
    def composite(self) -> bool:
        return len(self.gold) > 1

    @property
    def queries(self) -> tuple[str, ...]:
        """The text(s) to link: the parts of a split composite mention, else the mention itself."""
        return self.parts_text or (self.text,)


@dataclass(frozen=True)
class DatasetSpec:
    format: str
    path: Path
    options: dict[str, str]
    limits: ReadLimits = DEFAULT_LIMITS
    lenient: bool = False  # brat: skip (and log) annotations whose span does not fit the .txt

    def __str__(self) -> str:
        opts = "&".join(k if v == "" else f"{k}={v}" for k, v in self.options.items())
        return f"{self.format}:{self.path}" + (f"#{opts}" if opts else "")


LANGUAGE_FOLDERS = {"english": "en", "spanish": "es", "french": "fr", "german": "de", "dutch": "nl",
                    "italian": "it", "portuguese": "pt"}

Loader = Callable[[DatasetSpec], list[Mention]]
LOADERS: Registry[Loader] = Registry("dataset format")  # FORMAT of a spec -> its loader


def parse_spec(spec: str) -> DatasetSpec:
    """Split ``FORMAT:PATH[#OPTIONS]``; an unknown format lists the known ones."""
    fmt, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise InputFormatError("dataset spec", "FORMAT:PATH[#OPTIONS], e.g. pubtator:NCBItestset_corpus.txt",
                               shorten(spec), fix=f"FORMAT is one of {', '.join(LOADERS.names())}")
    LOADERS.get(fmt)  # an unknown format names the known ones
    path, _, opts = rest.partition("#")
    options: dict[str, str] = {}
    for item in filter(None, opts.split("&")):
        key, _, value = item.partition("=")
        options[key.strip()] = value.strip()
    return DatasetSpec(fmt, Path(path), options)


# Spec options whose value is a file the loader reads (so an input no output may touch).
PATH_OPTIONS = ("typos",)


def spec_inputs(spec: str, option: str = "--dataset") -> list[Input]:
    """Every path dataset `spec` reads, for `linker.fileio.check_output`: its PATH, the files its options
    name (``typos=FILE``) and, for one brat ``.ann`` file, the ``.txt`` read beside it."""
    parsed = parse_spec(spec)
    inputs = [Input(parsed.path, option)]
    if parsed.format == "brat" and parsed.path.suffix == ".ann":
        inputs.append(Input(parsed.path.with_suffix(".txt"), f"the text of {option} {parsed.path}"))
    inputs += [Input(Path(parsed.options[key]), f"{key}= of {option} {parsed.path}")
               for key in PATH_OPTIONS if parsed.options.get(key)]
    return inputs


def load_dataset(spec: str, *, limits: ReadLimits = DEFAULT_LIMITS, lenient: bool = False) -> list[Mention]:
    """Read the mentions of a dataset spec (see the module docstring for the formats).

    The files are read by `linker.formats` under `limits`; `lenient` skips brat annotations whose
    spans do not fit their .txt (logged) instead of failing.
    """
    parsed = parse_spec(spec)
    parsed = DatasetSpec(parsed.format, parsed.path, parsed.options, limits, lenient)
    if not parsed.path.exists():
        raise MissingInputError(f"{parsed.path}: no such file or folder (dataset {spec})")
    mentions = LOADERS.get(parsed.format)(parsed)
    log.info("read %d mentions from %s", len(mentions), spec)
    return mentions


def _check_options(spec: DatasetSpec, allowed: set[str]) -> None:
    unknown = set(spec.options) - allowed
    if unknown:
        raise UnknownNameError(f"{spec.format} option", sorted(unknown)[0], allowed or {"(none)"})


def _parts(ids: str, *, part_seps: str, alt_sep: str | None) -> tuple[tuple[str, ...], ...]:
    """'A|B+C' -> parts, each a tuple of alternatives, split by the format's separators."""
    parts = [ids]
    for sep in part_seps:
        parts = [p for chunk in parts for p in chunk.split(sep)]
    out = []
    for part in parts:
        alts = part.split(alt_sep) if alt_sep else [part]
        alts = tuple(dict.fromkeys(a.strip() for a in alts if a.strip()))
        if alts:
            out.append(alts)
    return tuple(out)


def _files(path: Path, suffix: str) -> list[Path]:
    return sorted(path.rglob(f"*{suffix}")) if path.is_dir() else [path]


# --------------------------------------------------------------------------- pubtator


def _mesh(code: str) -> str:
    return code[5:] if code.startswith("MESH:") else code


@LOADERS.register("pubtator")
def _load_pubtator(spec: DatasetSpec) -> list[Mention]:
    _check_options(spec, {"lang", "abbrev", "split", "typos", "biosyn"})
    lang = spec.options.get("lang", "en")
    biosyn = "biosyn" in spec.options
    rewrite = _MentionRewriter(abbrev=biosyn or "abbrev" in spec.options, split=biosyn or "split" in spec.options,
                               typos=spec.options.get("typos"), biosyn_text=biosyn)
    mentions: list[Mention] = []
    skipped = 0
    for file in _files(spec.path, ".txt"):
        for row in read_pubtator(file, limits=spec.limits):
            if row.ids.strip() in {"", "-1"}:
                skipped += 1
                continue
            gold = _parts(row.ids, part_seps="|+", alt_sep=None)
            gold = tuple(tuple(_mesh(a) for a in part) for part in gold)
            if biosyn and len(gold) > 1 and _mixed_mesh_omim(gold):
                gold = (tuple(a for part in gold for a in part),)
            text, parts_text = rewrite(row.doc, row.doc_text, row.text, len(gold))
            mentions.append(Mention(text, gold, lang, row.doc, row.start, row.end, parts_text))
    if skipped:
        log.info("%s: left out %d mentions without a concept id (-1)", spec.path, skipped)
    if rewrite.counts:
        log.info("%s: %s", spec.path, ", ".join(f"{k} {v}" for k, v in sorted(rewrite.counts.items())))
    return mentions


def _mixed_mesh_omim(gold: tuple[tuple[str, ...], ...]) -> bool:
    omim = [a.startswith("OMIM:") for part in gold for a in part]
    return any(omim) and not all(omim)


class _MentionRewriter:
    """Applies `linker.preprocess` to mentions, caching each document's abbreviations; counts changes."""

    def __init__(self, *, abbrev: bool, split: bool, typos: str | None, biosyn_text: bool) -> None:
        self.abbrev, self.split, self.biosyn_text = abbrev, split, biosyn_text
        if typos is not None and not Path(typos).is_file():
            raise MissingInputError(f"{typos}: no such typo list (dataset option typos=FILE)")
        self.typos = read_typos(typos) if typos else {}
        self._doc: tuple[str, dict[str, str]] = ("", {})
        self.counts: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def __call__(self, doc: str, doc_text: Sequence[str], text: str, n_parts: int) -> tuple[str, tuple[str, ...]]:
        """(rewritten text, part texts) of one mention of `doc`, whose title and abstract are `doc_text`."""
        original = text
        if self.abbrev:
            if self._doc[0] != doc:  # mentions come grouped by document: detect its abbreviations once
                self._doc = (doc, find_abbreviations(" ".join(doc_text)))
            text = expand_abbreviations(text, self._doc[1])
            if text != original:
                self._count("abbreviations expanded")
        parts: tuple[str, ...] = ()
        if self.split and n_parts > 1:
            parts = split_composite(text, n_parts) or ()
            self._count("composites split" if parts else "composites left whole")

        def finish(t: str) -> str:
            t = fix_typos(t, self.typos)
            return normalize(t, "biosyn") if self.biosyn_text else t

        return finish(text), tuple(finish(p) for p in parts)


# --------------------------------------------------------------------------- brat


def _language_of(name: str) -> str | None:
    for folder in re.split(r"[/\\!]", name):
        if folder.lower() in LANGUAGE_FOLDERS:
            return LANGUAGE_FOLDERS[folder.lower()]
    return None


def _note_id(note: str) -> str:
    note = note.strip()
    if note.startswith('"'):
        first = next(csv.reader(io.StringIO(note), skipinitialspace=True), [""])
        return first[0].strip() if first else ""
    if note.endswith("/H"):
        note = note[:-2]
    return note


@LOADERS.register("brat")
def _load_brat(spec: DatasetSpec) -> list[Mention]:
    _check_options(spec, {"lang", "abbrev", "typos"})
    wanted = spec.options.get("lang")
    rewrite = _MentionRewriter(abbrev="abbrev" in spec.options, split=False, typos=spec.options.get("typos"),
                               biosyn_text=False)
    mentions: list[Mention] = []
    unnoted = skipped = untexted = 0
    for source in brat_sources(spec.path, limits=spec.limits):
        lang = _language_of(source.name) or wanted or "und"
        if wanted and lang != wanted:
            continue
        doc = read_source(source, lenient=spec.lenient)
        for message in doc.skipped:
            log.warning("skipped %s", message)
        skipped += len(doc.skipped)
        if rewrite.abbrev and doc.text is None and doc.entities:
            untexted += 1
        for entity in doc.entities:
            code = _note_id(doc.notes.get(entity.tid, ""))
            if not code:
                unnoted += 1
                continue
            # The source name (archive!member) keys the document: Mantra's languages reuse file names.
            text, _parts = rewrite(source.name, (doc.text or "",), entity.text, 1)
            mentions.append(Mention(text, ((code,),), lang, Path(source.name.split("!")[-1]).stem,
                                    entity.start, entity.end))
    if unnoted:
        log.info("%s: left out %d annotations without an AnnotatorNotes id", spec.path, unnoted)
    if skipped:
        log.warning("%s: skipped %d annotations whose spans do not fit their .txt (--lenient)", spec.path, skipped)
    if untexted:
        log.warning("%s: %d documents have no .txt beside their .ann: no abbreviations found in them", spec.path,
                    untexted)
    if rewrite.counts:
        log.info("%s: %s", spec.path, ", ".join(f"{k} {v}" for k, v in sorted(rewrite.counts.items())))
    return mentions


# --------------------------------------------------------------------------- codiesp


@LOADERS.register("codiesp")
def _load_codiesp(spec: DatasetSpec) -> list[Mention]:
    _check_options(spec, {"D", "P", "lang"})
    if "D" in spec.options and "P" in spec.options:
        raise InputFormatError("codiesp options", "D (diagnoses) or P (procedures)", "both")
    label = "PROCEDIMIENTO" if "P" in spec.options else "DIAGNOSTICO"
    lang = spec.options.get("lang", "es")
    return [Mention(row.text, ((row.code,),), lang, row.doc, row.start, row.end)
            for row in read_codiesp(spec.path, limits=spec.limits) if row.label == label]


# --------------------------------------------------------------------------- biosyn, tsv, query


@LOADERS.register("biosyn")
def _load_biosyn(spec: DatasetSpec) -> list[Mention]:
    _check_options(spec, {"lang"})
    lang = spec.options.get("lang", "en")
    return [Mention(row.text, _parts(row.ids, part_seps="+", alt_sep="|"), lang, row.doc, row.start, row.end)
            for file in _files(spec.path, ".concept") for row in read_biosyn(file, limits=spec.limits)]


def _id_list(spec: DatasetSpec) -> list[Mention]:
    _check_options(spec, {"lang"})
    default_lang = spec.options.get("lang", "en")
    return [Mention(row.text, _parts(row.ids, part_seps="+", alt_sep="|"), row.lang or default_lang,
                    spec.path.name, row.line, row.line)
            for row in read_id_list(spec.path, spec.format, limits=spec.limits)]


@LOADERS.register("tsv")
def _load_tsv(spec: DatasetSpec) -> list[Mention]:
    return _id_list(spec)


@LOADERS.register("lay")
def _load_lay(spec: DatasetSpec) -> list[Mention]:
    from linker.fileio import iter_lines

    _check_options(spec, {"origin", "lang"})
    origins = set(filter(None, spec.options.get("origin", "").split(",")))
    out = []
    for number, line in iter_lines(spec.path, max_line_bytes=spec.limits.max_line_bytes):
        fields = line.split("\t")
        if number == 1:
            if fields[:3] != ["text", "concept_ids", "origin"]:
                raise InputFormatError(spec.path, "a header text<TAB>concept_ids<TAB>origin", shorten(line), line=1)
            continue
        if not line.strip():
            continue
        if len(fields) != 3 or not fields[0].strip() or not fields[1].strip():
            raise InputFormatError(spec.path, "text<TAB>concept_ids<TAB>origin", shorten(line), line=number)
        gold = _parts(fields[1], part_seps="", alt_sep="|")
        if not gold:  # "|" alone: a row without an answer would be scored as a miss
            raise InputFormatError(spec.path, "concept_ids as one or more ids separated by '|'",
                                   f"no concept id in {shorten(fields[1])}", line=number)
        if not origins or fields[2] in origins:
            out.append(Mention(fields[0], gold, spec.options.get("lang", "en"), spec.path.name, number, number))
    return out


@LOADERS.register("query")
def _load_query(spec: DatasetSpec) -> list[Mention]:
    return _id_list(spec)


def available_formats() -> list[str]:
    return LOADERS.names()
