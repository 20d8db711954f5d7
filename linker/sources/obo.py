"""OBO ontologies (HPO, Disease Ontology, ...) and their Babelon translations.

Paths may mix three kinds of file, told apart by their first line:

- an ``.obo`` file (OBO 1.2/1.4, ``.gz`` allowed): every non-obsolete ``[Term]`` gives its
  ``name`` (term type ``PT``, preferred) and its synonyms whose scope is in
  ``SourceOptions.synonym_scopes`` (term type ``SY_<SCOPE>``, or ``SY_<SCOPE>/<type>`` for a typed
  synonym such as HPO's ``layperson``). ``xref:`` values are kept as ``PREFIX:ID`` (``UMLS:C0002170``;
  Disease Ontology's ``UMLS_CUI:`` prefix becomes ``UMLS:``).
  ``alt_id`` is ignored: the link target is the primary id. Synonyms typed ``obsolete_synonym``
  are marked non-current.
- a Babelon TSV (``hp-es.babelon.tsv``; header with ``subject_id``, ``predicate_id``,
  ``translation_value``, ``translation_language``): ``rdfs:label`` rows become the preferred name in
  that language, ``oboInOwl:has<Scope>Synonym`` rows synonyms; definitions and rows marked
  ``NOT_TRANSLATED`` are skipped.
- an HPO synonyms TSV (``hp-fr.synonyms.tsv``; header with ``subject_id`` and ``translation_value``,
  then a ROBOT template row starting with ``ID`` such as ``AL oboInOwl:hasExactSynonym@fr SPLIT=|``):
  ``|``-separated synonyms; the language comes from the template row, else from the file name.

Translations need the ontology among the paths: those of obsolete or unknown terms are skipped
(they would link to ids that no longer exist) and each translated name carries the term's xrefs.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_identifier
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register

log = logging.getLogger(__name__)

SCOPES = ("EXACT", "RELATED", "BROAD", "NARROW")
# OBO 1.0 spelled the scope in the tag: `exact_synonym: "..." []`.
_OLD_SYNONYM_TAGS = {f"{s.lower()}_synonym": s for s in SCOPES}
_SYNONYM = re.compile(r'^"((?:[^"\\]|\\.)*)"\s*(?:(EXACT|RELATED|BROAD|NARROW)\b)?\s*([^\s\[{]+)?')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t", "W": " "}
# Babelon predicates that carry names; others (IAO:0000115 definitions, comments) are skipped.
_PREDICATES = {
    "rdfs:label": None,
    **{f"oboInOwl:has{s.title()}Synonym": s for s in SCOPES},
}
_SOURCE_NAMES = {"hp": "hpo"}  # `ontology: hp` is better known as HPO


@dataclass(frozen=True)
class OboTerm:
    """One non-obsolete term as read from an OBO file."""

    id: str
    name: str
    synonyms: tuple[tuple[str, str, str], ...]  # (text, scope, type or "")
    xrefs: tuple[str, ...]
    parents: tuple[str, ...] = ()  # `is_a` targets: the term's less specific terms


@dataclass
class OboHeader:
    ontology: str = ""
    data_version: str = ""
    terms: int = 0
    obsolete: int = 0
    nameless: int = 0
    synonym_types: dict[str, str] = field(default_factory=dict)  # `HP:0034334` -> `allelic_requirement`
    extra: dict = field(default_factory=dict)


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)


def _xref(value: str) -> str:
    # Disease Ontology writes UMLS_CUI:C0011860 where HPO writes UMLS:C0002170; one prefix for both.
    prefix, sep, local = value.partition(":")
    return f"UMLS:{local}" if sep and prefix == "UMLS_CUI" else value


def _strip_comment(value: str) -> str:
    # A trailing `! comment` and `{qualifiers}` are annotations, not part of the value.
    value = value.split(" ! ", 1)[0]
    if value.endswith("}") and " {" in value:
        value = value.rsplit(" {", 1)[0]
    return value.strip()


def iter_obo_terms(path: Path, header: OboHeader, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[OboTerm]:
    """Stream the non-obsolete [Term] stanzas of an OBO file; fill `header` as it goes."""
    stanza: str | None = None
    start = 0
    tags: dict[str, list[tuple[int, str]]] = {}

    def finish() -> OboTerm | None:
        if stanza != "Term":
            return None
        ids = tags.get("id")
        if not ids:
            raise InputFormatError(path, "an `id:` line in every [Term] stanza", "a stanza without one", line=start)
        header.terms += 1
        if any(v.lower() == "true" for _, v in tags.get("is_obsolete", [])):
            header.obsolete += 1
            return None
        synonyms = []
        for tag in ("synonym", *_OLD_SYNONYM_TAGS):
            for number, value in tags.get(tag, []):
                match = _SYNONYM.match(value)
                if not match:
                    raise InputFormatError(
                        path, 'a synonym as `"text" SCOPE [xrefs]`', shorten(value), line=number
                    )
                scope = _OLD_SYNONYM_TAGS.get(tag) or match.group(2) or "RELATED"  # OBO's default scope
                kind = match.group(3) or ""
                if ":" in kind:  # a type named by an id: use its label from the header's synonymtypedef
                    kind = header.synonym_types.get(kind, kind)
                synonyms.append((_unescape(match.group(1)).strip(), scope, kind))
        names = tags.get("name", [])
        name = _strip_comment(names[0][1]) if names else ""
        if not name:
            header.nameless += 1
        xrefs = tuple(dict.fromkeys(_xref(v.split()[0]) for _, v in tags.get("xref", []) if v.split()))
        parents = tuple(dict.fromkeys(v.split()[0] for _, v in tags.get("is_a", []) if v.split()))
        term_id = check_identifier(ids[0][1].split()[0] if ids[0][1].split() else "", "a term id", where=path,
                                   line=ids[0][0])
        return OboTerm(term_id, name, tuple(synonyms), xrefs, parents)

    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        line = line.strip()
        if not line or line.startswith("!"):
            continue
        if line.startswith("[") and line.endswith("]"):
            term = finish()
            if term is not None:
                yield term
            stanza, start, tags = line[1:-1].strip(), number, {}
            continue
        tag, sep, value = line.partition(":")
        if not sep:
            raise InputFormatError(path, "a `tag: value` line", shorten(line), line=number)
        tag, value = tag.strip(), value.strip()
        if stanza is None:
            if tag == "ontology":
                header.ontology = value
            elif tag == "data-version":
                header.data_version = value
            elif tag == "format-version":
                header.extra["format_version"] = value
            elif tag == "synonymtypedef":
                type_id, _, label = value.partition(" ")
                header.synonym_types[type_id] = label.strip().strip('"').split('"')[0] or type_id
            continue
        if tag in ("id", "name", "is_obsolete", "xref", "is_a", "synonym", *_OLD_SYNONYM_TAGS):
            tags.setdefault(tag, []).append((number, value if tag in ("name", "synonym") else _strip_comment(value)))
    term = finish()
    if term is not None:
        yield term
    if header.terms == 0:
        raise InputFormatError(path, "an OBO file with [Term] stanzas", "no [Term] stanza", fix="is this an .obo file?")


def read_obo_parents(path: str | Path) -> dict[str, tuple[str, ...]]:
    """Term id -> its `is_a` parents, for the non-obsolete terms of an OBO file (the ontology's hierarchy)."""
    return {term.id: term.parents for term in iter_obo_terms(Path(path), OboHeader()) if term.parents}


def ontology_source(header: OboHeader, path: Path) -> str:
    """The `source` column: `hpo`, `doid`, or the ontology's own name (one token: brat writes it as a db)."""
    name = header.ontology or path.name.split(".")[0]
    name = name.removesuffix(".obo").lower()
    return check_identifier(_SOURCE_NAMES.get(name, name), "an ontology name (the `ontology:` header or the file name)",
                            where=path)


def term_names(
    term: OboTerm,
    source: str,
    scopes: Sequence[str],
    *,
    extra_types: frozenset[str] = frozenset(),
) -> Iterator[ConceptName]:
    """The PT and the kept synonyms of one term; a synonym is kept when its scope is in `scopes`
    or its type is in `extra_types` (the default dictionary adds HPO's lay terms of every scope)."""
    if term.name:
        yield ConceptName(term.id, term.name, "en", source, term.id, "PT", True, True, term.xrefs)
    for text, scope, kind in term.synonyms:
        if text and (scope in scopes or kind in extra_types):
            term_type = f"SY_{scope}/{kind}" if kind else f"SY_{scope}"
            current = kind != "obsolete_synonym"
            yield ConceptName(term.id, text, "en", source, term.id, term_type, False, current, term.xrefs)


def _first_line(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    for _number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if line.strip():
            return line
    return ""


def _kind(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    first = _first_line(path, limits)
    columns = first.split("\t")
    if "subject_id" in columns and "translation_value" in columns:
        return "babelon" if "predicate_id" in columns else "synonyms"
    if first.startswith(("format-version:", "[Term]", "data-version:", "ontology:")) or ".obo" in path.name:
        return "obo"
    raise InputFormatError(
        path,
        "an .obo file, a Babelon TSV (subject_id, predicate_id, translation_value...) or an HPO synonyms TSV",
        shorten(first),
    )


def _header_index(path: Path, header: list[str], required: Sequence[str]) -> dict[str, int]:
    missing = [c for c in required if c not in header]
    if missing:
        raise InputFormatError(path, f"columns {', '.join(required)} in the header", f"no {', '.join(missing)}", line=1)
    return {name: header.index(name) for name in header}


def _cells(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, list[str]]]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if line.strip():
            yield number, line.split("\t")


def iter_babelon(
    path: Path, terms: dict[str, tuple[str, ...]], source: str, scopes: Sequence[str], counts: Counter,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[ConceptName]:
    """Names from a Babelon translation table (columns found by header name)."""
    rows = _cells(path, limits)
    _, header = next(rows)
    col = _header_index(path, header, ("subject_id", "predicate_id", "translation_value", "translation_language"))
    status_col = col.get("translation_status")
    for number, cells in rows:
        if len(cells) < len(header):
            raise InputFormatError(path, f"{len(header)} tab-separated columns", f"{len(cells)}", line=number)
        predicate = cells[col["predicate_id"]]
        if predicate not in _PREDICATES:
            continue
        status = cells[status_col] if status_col is not None else ""
        if status == "NOT_TRANSLATED":
            continue
        scope = _PREDICATES[predicate]
        if scope is not None and scope not in scopes:
            continue
        term_id, text = cells[col["subject_id"]].strip(), cells[col["translation_value"]].strip()
        if term_id not in terms:
            counts["unknown_or_obsolete"] += 1
            continue
        if not text:
            continue
        counts[status or "no_status"] += 1
        counts["names"] += 1
        lang = cells[col["translation_language"]].strip()
        if scope is None:
            yield ConceptName(term_id, text, lang, source, term_id, "PT", True, True, terms[term_id])
        else:
            yield ConceptName(term_id, text, lang, source, term_id, f"SY_{scope}", False, True, terms[term_id])


_TEMPLATE_SYNONYM = re.compile(r"oboInOwl:has(Exact|Related|Broad|Narrow)Synonym@([A-Za-z-]+)")
_FILE_LANG = re.compile(r"-([a-z]{2})\.synonyms\.tsv$")


def iter_synonyms_tsv(
    path: Path, terms: dict[str, tuple[str, ...]], source: str, scopes: Sequence[str], counts: Counter,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[ConceptName]:
    """Names from an HPO `hp-<lang>.synonyms.tsv` (ROBOT template: header, template row, rows)."""
    rows = _cells(path, limits)
    _, header = next(rows)
    col = _header_index(path, header, ("subject_id", "translation_value"))
    type_col = col.get("synonym_type")
    scope, lang = "EXACT", ""
    by_name = _FILE_LANG.search(path.name)
    for number, cells in rows:
        subject = cells[col["subject_id"]].strip()
        if subject == "ID":  # the ROBOT template row says which property and language the values are
            template = _TEMPLATE_SYNONYM.search(cells[col["translation_value"]] if len(cells) > 1 else "")
            if template:
                scope, lang = template.group(1).upper(), template.group(2)
            continue
        if not lang:
            if not by_name:
                raise InputFormatError(
                    path, "a template row `ID  AL oboInOwl:hasExactSynonym@<lang>` or a name like hp-fr.synonyms.tsv",
                    "neither", line=number,
                )
            lang = by_name.group(1)
        if len(cells) <= col["translation_value"]:
            raise InputFormatError(path, "subject_id<TAB>translation_value...", shorten("\t".join(cells)), line=number)
        if scope not in scopes or "NOT_TRANSLATED" in cells:
            continue  # NOT_TRANSLATED rows hold the English synonym awaiting translation
        if subject not in terms:
            counts["unknown_or_obsolete"] += 1
            continue
        kind = cells[type_col].rsplit("#", 1)[-1].strip() if type_col is not None and len(cells) > type_col else ""
        term_type = f"SY_{scope}/{kind}" if kind else f"SY_{scope}"
        for text in cells[col["translation_value"]].split("|"):
            if text.strip():
                counts["names"] += 1
                yield ConceptName(subject, text.strip(), lang, source, subject, term_type, False, True, terms[subject])


def read_obo_paths(
    paths: Sequence[Path], options: SourceOptions, *, extra_types: frozenset[str] = frozenset()
) -> SourceOutput:
    """Shared by the `obo` and `default` sources: ontologies first, then their translations."""
    kinds = [(Path(p), _kind(Path(p), options.limits)) for p in paths]
    ontologies = [p for p, k in kinds if k == "obo"]
    translations = [(p, k) for p, k in kinds if k != "obo"]
    if not ontologies:
        raise ConfigError(
            "the obo source needs an .obo file among its paths (translations are checked against its terms)"
        )
    scopes = tuple(s.upper() for s in options.synonym_scopes)
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ConfigError(f"unknown synonym scope(s) {', '.join(unknown)}; available: {', '.join(SCOPES)}")
    description: dict = {"ontologies": [], "translations": []}
    terms: dict[str, tuple[str, ...]] = {}
    sources: list[str] = []

    def names() -> Iterator[ConceptName]:
        for path in ontologies:
            header = OboHeader()
            for term in iter_obo_terms(path, header, options.limits):
                source = ontology_source(header, path)
                terms[term.id] = term.xrefs
                yield from term_names(term, source, scopes, extra_types=extra_types)
            source = ontology_source(header, path)
            sources.append(source)
            description["ontologies"].append(
                {"path": str(path), "ontology": header.ontology, "source": source, "data_version": header.data_version,
                 "terms": header.terms, "obsolete_skipped": header.obsolete, "nameless": header.nameless}
            )
            log.info("%s: %d terms (%d obsolete skipped)", path, header.terms, header.obsolete)
        for path, kind in translations:
            counts: Counter = Counter()
            reader = iter_babelon if kind == "babelon" else iter_synonyms_tsv
            yield from reader(path, terms, sources[0], scopes, counts, options.limits)
            description["translations"].append(
                {"path": str(path), "kind": kind, "names": counts.pop("names", 0),
                 "unknown_or_obsolete": counts.pop("unknown_or_obsolete", 0), **counts}
            )
            if counts["unknown_or_obsolete"]:
                log.info("%s: %d rows of obsolete or unknown terms skipped", path, counts["unknown_or_obsolete"])

    return SourceOutput(names=names(), description=description)


@register("obo")
def read_obo(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """OBO ontologies plus optional Babelon / HPO synonym translation tables (see module docstring)."""
    if not paths:
        raise ConfigError("the obo source needs paths: an .obo file (e.g. hp.obo) and optional translation TSVs")
    return read_obo_paths(paths, options)
