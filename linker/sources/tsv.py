"""Plain name lists: a generic TSV and the BioSyn / MEDIC pipe format.

The format is chosen per file by its first non-empty line:

- **pipe** (the line contains ``||``): ``ID[|ID...]||name[|synonym...]``. This is BioSyn's
  dictionary format (``CUI||name``, one name per line) and CTD's MEDIC as shipped with
  NCBI-disease (``C567755|613097||Tooth Agenesis, Selective, 6|STHAG6``: a MeSH id, then OMIM
  numbers, then the preferred name and synonyms). Rules:
  the first MeSH id on the line (else the first id) is the concept and carries all the line's names; the other ids are
  alternative ids of the same disease and go to ``xrefs`` (one concept, not several: otherwise a
  MeSH id and its OMIM twin would take two of the top-k slots with tied scores). An id of digits
  only is an OMIM number and becomes ``OMIM:<n>``, as the NCBI-disease corpus writes it
  (``OMIM:215600``), while MeSH ids stay bare (``D001943``, ``C567755``); HTML entities in names (``Gelineau&apos;s``,
  ``Alstr&#246;m``) are decoded. The first name of a concept is its preferred name (``PT``), the
  others are ``SY``. Language: ``--lang``'s first value, else ``en``.
- **tsv** (otherwise): ``concept_id<TAB>name[<TAB>lang]``; an optional header row starts with
  ``concept_id``. Without a lang column the language is ``--lang``'s first value, else ``en``; UMLS
  language names in that column (``ENG``, ``SPA``) become ISO codes. The
  first name of a concept in a language is its preferred name.

Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_identifier
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register
from linker.text import LANGUAGE_CODES

log = logging.getLogger(__name__)


def _lines(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, str]]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if line.strip() and not line.startswith("#"):
            yield number, line


def pipe_ids(field: str) -> list[str]:
    """`C567755|613097` -> ['C567755', 'OMIM:613097'] (MEDIC's bare OMIM numbers get their prefix)."""
    ids = [i.strip() for i in field.split("|") if i.strip()]
    return [f"OMIM:{i}" if i.isdigit() else i for i in ids]


def iter_pipe(path: Path, lang: str, source: str, counts: dict,
              limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ConceptName]:
    seen: set[str] = set()
    for number, line in _lines(path, limits):
        ids_field, sep, names_field = line.partition("||")
        ids = pipe_ids(ids_field)
        names = [html.unescape(n).strip() if "&" in n else n.strip() for n in names_field.split("|")]
        names = [n for n in names if n]
        if not sep or not ids or not names:
            raise InputFormatError(path, "ID[|ID...]||name[|synonym...]", shorten(line), line=number)
        for concept_id in ids:
            check_identifier(concept_id, "a concept id", where=path, line=number)
        counts["lines"] += 1
        primary = next((i for i in ids if not i.startswith("OMIM:")), ids[0])
        concept_id, xrefs = primary, tuple(i for i in ids if i != primary)
        first = concept_id not in seen
        seen.add(concept_id)
        for i, name in enumerate(names):
            preferred = first and i == 0
            yield ConceptName(
                concept_id, name, lang, source, concept_id, "PT" if preferred else "SY", preferred, xrefs=xrefs
            )


def iter_tsv(path: Path, lang: str, counts: dict, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ConceptName]:
    seen: set[tuple[str, str]] = set()
    for number, line in _lines(path, limits):
        cells = line.split("\t")
        if number == 1 and cells[0].strip().lower() in ("concept_id", "id", "code"):
            continue
        if len(cells) < 2 or not cells[0].strip() or not cells[1].strip():
            raise InputFormatError(path, "concept_id<TAB>name[<TAB>lang]", shorten(line), line=number)
        concept_id, name = check_identifier(cells[0].strip(), "a concept id", where=path, line=number), cells[1].strip()
        name_lang = cells[2].strip() if len(cells) > 2 and cells[2].strip() else lang
        name_lang = LANGUAGE_CODES.get(name_lang, name_lang)  # UMLS-style ENG/SPA -> en/es
        preferred = (concept_id, name_lang) not in seen
        seen.add((concept_id, name_lang))
        counts["lines"] += 1
        yield ConceptName(concept_id, name, name_lang, "tsv", concept_id, "PT" if preferred else "SY", preferred)


def file_format(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    for _number, line in _lines(path, limits):
        return "pipe" if "||" in line else "tsv"
    raise InputFormatError(path, "concept names, one per line", "an empty file")


@register("tsv")
def read_tsv(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """Generic `concept_id<TAB>name[<TAB>lang]` lists and BioSyn/MEDIC `ID|ID||name|synonym` files."""
    if not paths:
        raise ConfigError("the tsv source needs at least one file (concept_id<TAB>name or ID||name lines)")
    lang = options.langs[0] if options.langs else "en"
    description: dict = {"files": []}

    def names() -> Iterator[ConceptName]:
        for path in map(Path, paths):
            kind = file_format(path, options.limits)
            counts = {"path": str(path), "format": kind, "lines": 0}
            if kind == "pipe":
                source = "medic" if "medic" in path.name.lower() else "biosyn"
                yield from iter_pipe(path, lang, source, counts, options.limits)
            else:
                yield from iter_tsv(path, lang, counts, options.limits)
            description["files"].append(counts)
            log.info("%s: %d lines (%s format)", path, counts["lines"], kind)

    return SourceOutput(names=names(), description=description)
