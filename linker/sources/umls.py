"""UMLS Metathesaurus RRF (MRCONSO.RRF, MRSTY.RRF) -> concept names keyed by CUI.

MRCONSO.RRF holds about 15 million atoms (several GB), so it is streamed once and nothing
proportional to it is kept: rows are filtered as soon as their bytes are read (language first,
before the line is even decoded), and only the rows of the current CUI are buffered -- MRCONSO
is sorted by CUI, so a concept's rows are consecutive. Memory is therefore bounded by the
output (the dictionary's dedupe keys) plus the largest concept, never by the input.

A semantic type or group filter needs MRSTY.RRF; it is read first into the set of CUIs that
carry a wanted type. That set is bounded by the number of CUIs in the release (a few million
in a full UMLS, far fewer after a group filter), not by MRCONSO's size.

Within a CUI the concept's preferred name in each language (TS=P, STT=PF, ISPREF=Y, the
Metathesaurus' own choice) is yielded first and flagged `preferred`, so the dictionary's
first-wins dedupe keeps that flag when other vocabularies repeat the same string. When the
filters removed that row (e.g. `--sab MDR` while the preferred atom is from SNOMED CT), the
first kept row with ISPREF=Y, else the first kept row, stands in: every kept concept has
exactly one preferred name per language.

Lines are read through `linker.fileio`'s bounded layer (``max_line_bytes``, gzip decompressed);
a CUI or SAB that is not one token (white space, a control character) is refused with its line.
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError, UnknownNameError, shorten
from linker.fileio import decode_line, iter_lines, iter_raw_lines, open_binary
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_identifier
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register
from linker.text import LANGUAGE_CODES

log = logging.getLogger(__name__)

MRCONSO_FIELDS = ("CUI", "LAT", "TS", "LUI", "STT", "SUI", "ISPREF", "AUI", "SAUI", "SCUI", "SDUI", "SAB",
                  "TTY", "CODE", "STR", "SRL", "SUPPRESS", "CVF")
MRSTY_FIELDS = ("CUI", "TUI", "STN", "STY", "ATUI", "CVF")
CUI, LAT, TS, STT, ISPREF, AUI, SAB, TTY, CODE, STR, SUPPRESS = 0, 1, 2, 4, 6, 7, 11, 12, 13, 14, 16
_TUI = re.compile(r"^T\d{3}$")


@dataclass(frozen=True)
class SemanticType:
    """One row of the UMLS semantic groups table (McCray et al.; SemGroups.txt, 2018 network)."""

    tui: str
    name: str
    group: str
    group_name: str


@functools.cache
def semantic_types() -> dict[str, SemanticType]:
    """TUI -> SemanticType, from the shipped linker/data/semantic_groups.tsv (127 types, 15 groups)."""
    text = resources.files("linker").joinpath("data/semantic_groups.tsv").read_text(encoding="utf-8")
    table = {}
    for line in text.splitlines():
        if line.strip():
            group, group_name, tui, name = line.split("|")
            table[tui] = SemanticType(tui=tui, name=name, group=group, group_name=group_name)
    return table


def semantic_groups() -> dict[str, str]:
    """Group abbreviation -> group name, e.g. DISO -> Disorders."""
    return {t.group: t.group_name for t in semantic_types().values()}


def wanted_types(types: Sequence[str], groups: Sequence[str]) -> frozenset[str]:
    """The TUIs selected by TUIs or type names (`types`) and group abbreviations (`groups`).

    A well-formed TUI absent from the table is accepted (older releases have types that the
    2018 network retired, e.g. T119 Lipid); a misspelt name or group is an error listing the choices.
    """
    table = semantic_types()
    by_name = {t.name.lower(): t.tui for t in table.values()}
    selected: set[str] = set()
    for value in types:
        key = value.strip()
        if _TUI.match(key.upper()):
            if key.upper() not in table:
                log.warning("semantic type %s is not in the 2018 semantic network; kept as given", key.upper())
            selected.add(key.upper())
        elif key.lower() in by_name:
            selected.add(by_name[key.lower()])
        else:
            raise UnknownNameError("semantic type", value, [t.name for t in table.values()])
    names = semantic_groups()
    for value in groups:
        key = value.strip().upper()
        if key not in names:
            raise UnknownNameError("semantic group", value, names)
        selected.update(t.tui for t in table.values() if t.group == key)
    return frozenset(selected)


def _file(folder: Path, name: str) -> Path | None:
    files = {p.name.lower(): p for p in folder.iterdir() if p.is_file()}
    return files.get(name) or files.get(name + ".gz")


def locate(path: Path) -> tuple[Path, Path | None]:
    """(MRCONSO, MRSTY or None) for a META folder, its parent release folder, or MRCONSO.RRF itself."""
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"{path}: no such file or folder (UMLS META folder or MRCONSO.RRF)")
    if path.is_file():
        return path, _file(path.parent, "mrsty.rrf")
    for folder in (path, *(p for p in path.iterdir() if p.is_dir() and p.name.lower() == "meta")):
        if conso := _file(folder, "mrconso.rrf"):
            return conso, _file(folder, "mrsty.rrf")
    raise MissingInputError(
        f"{path}: no MRCONSO.RRF here or in a META subfolder; pass the META folder of a UMLS release "
        "(as MetamorphoSys writes it) or the MRCONSO.RRF file"
    )


def _release_name(conso: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str | None:
    """The release name (e.g. 2024AA) from release.dat beside META, when present."""
    for folder in (conso.parent, conso.parent.parent):
        dat = folder / "release.dat"
        if dat.is_file():
            for _number, line in iter_lines(dat, max_line_bytes=limits.max_line_bytes):
                if line.startswith("umls.release.name="):
                    return line.split("=", 1)[1].strip()
    return None


def _split(path: Path, number: int, line: str, names: tuple[str, ...]) -> list[str]:
    fields = line.split("|")
    if len(fields) != len(names) + 1 or fields[-1] != "":
        raise InputFormatError(
            path, f"{len(names)} '|'-terminated fields ({'|'.join(names)}|)",
            f"{len(fields) - 1} separators in {shorten(line)}", line=number,
        )
    return fields


def cuis_with_types(mrsty: Path, tuis: frozenset[str], limits: ReadLimits = DEFAULT_LIMITS) -> set[str]:
    """CUIs that carry at least one of `tuis` in MRSTY.RRF (bounded by the release's CUI count)."""
    cuis: set[str] = set()
    for number, line in iter_lines(mrsty, max_line_bytes=limits.max_line_bytes):
        if line.strip():
            fields = _split(mrsty, number, line, MRSTY_FIELDS)
            if fields[1] in tuis:
                cuis.add(fields[0])
    return cuis


def _flush(rows: list[list[str]]) -> Iterator[ConceptName]:
    """One CUI's kept rows: each language's preferred row first, then the rest in file order."""
    best: dict[str, tuple[int, int]] = {}  # LAT -> (rank, row); rank 0 beats 1 beats 2, the first row wins a tie
    for i, f in enumerate(rows):
        rank = 0 if f[TS] == "P" and f[STT] == "PF" and f[ISPREF] == "Y" else 1 if f[ISPREF] == "Y" else 2
        if f[LAT] not in best or rank < best[f[LAT]][0]:
            best[f[LAT]] = (rank, i)
    chosen = {i for _rank, i in best.values()}
    for i in sorted(chosen):
        yield _name(rows[i], True)
    for i, f in enumerate(rows):
        if i not in chosen:
            yield _name(f, False)


def _name(f: list[str], preferred: bool) -> ConceptName:
    code = f[CODE]
    return ConceptName(
        concept_id=f[CUI], name=f[STR], lang=LANGUAGE_CODES.get(f[LAT], f[LAT].lower()), source=f"umls:{f[SAB]}",
        term_id=f[AUI], term_type=f[TTY], preferred=preferred, current=f[SUPPRESS] == "N",
        xrefs=(f"{f[SAB]}:{code}",) if code and code != "NOCODE" else (),
    )


def read_mrconso(
    path: Path, options: SourceOptions, cuis: set[str] | None = None, counts: Counter[str] | None = None
) -> Iterator[ConceptName]:
    """Stream MRCONSO.RRF, filtered by language, SAB, suppression and (optionally) a CUI set.

    `counts` (if given) receives the rows kept and the rows each filter skipped, once read.
    """
    lats = None
    if options.langs:
        wanted = {lang.lower() for lang in options.langs}
        lats = {lat.encode() for lat, iso in LANGUAGE_CODES.items() if iso in wanted}
        # A LAT without an ISO code (e.g. SCR) is named by its lower-case LAT, as `_name` writes it.
        lats |= {lang.upper().encode() for lang in wanted if lang not in LANGUAGE_CODES.values()}
    sabs = set(options.vocabularies) or None
    keep_suppressed = options.include_suppressed and not options.current_only
    total, counts = counts, Counter()
    group: list[list[str]] = []
    previous = ""
    expected_bars = len(MRCONSO_FIELDS)
    checked: set[str] = set()  # SABs already checked (a few dozen)
    with open_binary(path) as handle:
        for number, line in iter_raw_lines(handle, path, max_line_bytes=options.limits.max_line_bytes):
            # Checks on raw bytes first: a row of another language costs a count and a split, no decoding.
            if line.count(b"|") != expected_bars or not line.endswith(b"|"):
                if not line.strip():
                    continue
                _split(path, number, decode_line(line), MRCONSO_FIELDS)  # raises
            if lats is not None and line.split(b"|", 2)[1] not in lats:
                counts["language"] += 1
                continue
            f = decode_line(line).split("|")
            if sabs is not None and f[SAB] not in sabs:
                counts["vocabulary"] += 1
                continue
            if f[SUPPRESS] != "N" and not keep_suppressed:
                counts["suppressed"] += 1
                continue
            if cuis is not None and f[CUI] not in cuis:
                counts["semantic type"] += 1
                continue
            if f[SAB] not in checked:
                checked.add(check_identifier(f[SAB], "a SAB (source vocabulary)", where=path, line=number))
            if f[CUI] != previous:
                check_identifier(f[CUI], "a CUI", where=path, line=number)
                if f[CUI] < previous:
                    raise InputFormatError(
                        path, "rows sorted by CUI, as in a UMLS release", f"{f[CUI]} after {previous}",
                        line=number, fix=f"sort it: LC_ALL=C sort -t'|' -k1,1 -s {path.name}",
                    )
                yield from _flush(group)
                group = []
                previous = f[CUI]
            group.append(f)
            counts["kept"] += 1
    yield from _flush(group)
    log.info("%s: %d rows kept; skipped by filter: %s", path, counts["kept"],
             ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()) if k != "kept") or "none")
    if total is not None:
        total.update(counts)


@register("umls")
def read_umls(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """Read UMLS META folders (or MRCONSO.RRF files) into concept names, CUI as the concept id."""
    located = [locate(Path(p)) for p in paths]
    tuis = wanted_types(options.semantic_types, options.semantic_groups)
    cui_sets: list[set[str] | None] = []
    for conso, mrsty in located:
        if not tuis:
            cui_sets.append(None)
            continue
        if mrsty is None:
            raise MissingInputError(
                f"{conso.parent}: no MRSTY.RRF beside {conso.name}; a semantic type or group filter needs it"
            )
        cui_sets.append(cuis_with_types(mrsty, tuis, options.limits))
        log.info("%s: %d CUIs of the %d wanted semantic types", mrsty, len(cui_sets[-1]), len(tuis))

    description = {
        "release": [_release_name(conso, options.limits) for conso, _ in located],
        "mrconso": [str(conso) for conso, _ in located],
        "mrsty": [str(m) if m else None for _, m in located],
        "semantic_types": sorted(tuis),
    }

    def names() -> Iterator[ConceptName]:
        counts: Counter[str] = Counter()
        for (conso, _mrsty), cuis in zip(located, cui_sets):
            yield from read_mrconso(conso, options, cuis, counts)
        # Filled once streaming ends; the dictionary writes the description after the rows.
        description["rows_kept"] = counts.pop("kept", 0)
        description["rows_skipped"] = dict(sorted(counts.items()))

    return SourceOutput(names=names(), description=description)
