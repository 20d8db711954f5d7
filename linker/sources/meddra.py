"""MedDRA ASCII distribution (MedAscii folder: llt.asc, pt.asc, mdhier.asc) -> concept names.

MedDRA users link to the Preferred Term: every Lowest Level Term (synonym, lexical variant,
sub-concept) names one PT. So by default an LLT's name becomes a name of its PT's code, and
the PT's own name is its preferred name. Each PT also exists as an LLT with the same code and
name; the PT row is yielded first so that the dictionary's first-wins dedupe keeps it (with
`preferred=True`) and drops the identical LLT row.

A release is one language. Several language releases of one version are read together and
kept apart by the `lang` column, so one table serves English and Spanish mentions alike.

Language is taken, in order, from `meddra_release.asc` (``version$language$...``), else from
the names of the release folder and its parents (``MedDRA_27_0_Spanish``, ``es``, ``SPA``),
else English. The version likewise comes from `meddra_release.asc`, else from a ``27_0`` /
``27.0`` in a folder name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, MissingInputError, UnknownNameError, shorten
from linker.fileio import iter_lines
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.schema import ConceptName, HierarchyRow
from linker.sources import SourceOptions, SourceOutput, register
from linker.text import LANGUAGE_CODES

log = logging.getLogger(__name__)

SOURCE = "meddra"
TARGETS = ("pt", "llt")

# Field names as in the MedDRA ASCII file specification; the count is what a line must have.
LLT_FIELDS = ("llt_code", "llt_name", "pt_code", "llt_whoart_code", "llt_harts_code", "llt_costart_sym",
              "llt_icd9_code", "llt_icd9cm_code", "llt_icd10_code", "llt_currency", "llt_jart_code")
PT_FIELDS = ("pt_code", "pt_name", "null_field", "pt_soc_code", "pt_whoart_code", "pt_harts_code",
             "pt_costart_sym", "pt_icd9_code", "pt_icd9cm_code", "pt_icd10_code", "pt_jart_code")
MDHIER_FIELDS = ("pt_code", "hlt_code", "hlgt_code", "soc_code", "pt_name", "hlt_name", "hlgt_name",
                 "soc_name", "soc_abbrev", "null_field", "pt_soc_code", "primary_soc_fg")

# Language names as MedDRA spells them in release folder names, -> ISO 639-1.
LANGUAGE_NAMES: dict[str, str] = {
    "english": "en", "spanish": "es", "french": "fr", "german": "de", "dutch": "nl", "italian": "it",
    "portuguese": "pt", "brazilian": "pt", "czech": "cs", "hungarian": "hu", "japanese": "ja",
    "chinese": "zh", "russian": "ru", "korean": "ko", "polish": "pl", "swedish": "sv", "danish": "da",
    "finnish": "fi", "greek": "el", "latvian": "lv", "croatian": "hr", "estonian": "et",
    "norwegian": "no", "arabic": "ar", "bulgarian": "bg", "romanian": "ro", "slovak": "sk",
    "slovenian": "sl", "lithuanian": "lt", "ukrainian": "uk", "turkish": "tr", "hebrew": "he",
    "persian": "fa", "basque": "eu",
}
_ISO = set(LANGUAGE_CODES.values()) | set(LANGUAGE_NAMES.values())
_VERSION = re.compile(r"(?<!\d)(\d{1,2})[._](\d)(?!\d)")
_MAX_DEPTH = 3  # MedDRA_27_0_English/MedAscii/llt.asc is two levels below a folder of languages


@dataclass(frozen=True)
class Release:
    """One MedAscii folder: its files, language and version, and where each was learnt from."""

    folder: Path
    files: dict[str, Path]  # lower-case file name -> actual path
    lang: str
    lang_from: str
    version: str | None
    limits: ReadLimits = DEFAULT_LIMITS

    def describe(self) -> dict:
        return {"folder": str(self.folder), "lang": self.lang, "lang_from": self.lang_from, "version": self.version}


def _asc_files(folder: Path) -> dict[str, Path]:
    return {p.name.lower(): p for p in folder.iterdir() if p.is_file()}


def find_releases(path: Path) -> list[Path]:
    """MedAscii folders (those holding llt.asc) at `path` or up to `_MAX_DEPTH` levels below, sorted by path."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    found: list[Path] = []
    level = [path]
    for _ in range(_MAX_DEPTH + 1):
        next_level = []
        for folder in level:
            if "llt.asc" in _asc_files(folder):
                found.append(folder)
            else:
                next_level.extend(sorted(p for p in folder.iterdir() if p.is_dir()))
        level = next_level
    return sorted(found)


def _lang_from_name(name: str) -> str | None:
    for token in re.split(r"[^A-Za-z]+", name):
        low = token.lower()
        if low in LANGUAGE_NAMES:
            return LANGUAGE_NAMES[low]
        if len(token) == 3 and token.isupper() and token in LANGUAGE_CODES:  # SPA, not "fin"al
            return LANGUAGE_CODES[token]
        if len(token) == 2 and low in _ISO:
            return low
    return None


def read_release(folder: Path, root: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Release:
    """Locate the files of one MedAscii folder and work out its language and version."""
    files = _asc_files(folder)
    missing = [name for name in ("llt.asc", "pt.asc") if name not in files]
    if missing:
        raise MissingInputError(
            f"{folder}: a MedDRA MedAscii folder needs llt.asc and pt.asc; missing {', '.join(missing)}"
        )
    lang = lang_from = version = None
    if "meddra_release.asc" in files:
        for number, line in iter_lines(files["meddra_release.asc"], max_line_bytes=limits.max_line_bytes):
            fields = line.split("$")
            if line.strip() and len(fields) >= 2:
                version = fields[0].strip() or None
                name = fields[1].strip()
                lang = LANGUAGE_NAMES.get(name.lower()) or _lang_from_name(name)
                if lang:
                    lang_from = f"{files['meddra_release.asc'].name}:{number}"
                break
    # Folder names from the MedAscii folder up to the folder the user named, and above a named
    # MedAscii folder its release folder too (MedDRA ships MedDRA_27_0_Spanish/MedAscii).
    chain = [folder, *[p for p in folder.parents if p == root or root in p.parents]]
    if chain[-1].name.lower() == "medascii":
        chain.append(chain[-1].parent)
    for part in chain:
        if lang is None and (found := _lang_from_name(part.name)):
            lang, lang_from = found, f"folder name {part.name!r}"
        if version is None and (match := _VERSION.search(part.name)):
            version = f"{match.group(1)}.{match.group(2)}"
    if lang is None:
        lang, lang_from = "en", "default (no language in meddra_release.asc or folder names)"
    return Release(folder=folder, files=files, lang=lang, lang_from=lang_from, version=version, limits=limits)


def _fields(path: Path, number: int, line: str, names: tuple[str, ...]) -> list[str]:
    """Split a `$`-separated line into exactly len(names) fields (the trailing `$` is optional)."""
    fields = line.split("$")
    if fields and fields[-1] == "" and len(fields) == len(names) + 1:
        fields.pop()
    if len(fields) != len(names):
        count = len(fields) - (fields[-1] == "")  # a trailing `$` ends the last field
        raise InputFormatError(
            path, f"{len(names)} '$'-separated fields ({'$'.join(names)}$)",
            f"{count} fields in {shorten(line)}", line=number,
        )
    return fields


def _code(path: Path, number: int, value: str, field: str) -> str:
    code = value.strip()
    if not (code.isascii() and code.isdigit()):  # str.isdigit alone takes '²' and Arabic digits
        raise InputFormatError(path, f"a numeric {field}", shorten(value), line=number)
    return code


def _rows(path: Path, names: tuple[str, ...], limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, list[str]]]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if line.strip():
            yield number, _fields(path, number, line, names)


def _names(release: Release, target: str) -> Iterator[ConceptName]:
    """PT names first (collecting the PT codes), then LLT names checked against them."""
    pt_path, llt_path = release.files["pt.asc"], release.files["llt.asc"]
    pt_codes: set[str] = set()  # bounded by the number of PTs (about 27,000)
    for number, fields in _rows(pt_path, PT_FIELDS, release.limits):
        code = _code(pt_path, number, fields[0], "pt_code")
        pt_codes.add(code)
        yield ConceptName(concept_id=code, name=fields[1].strip(), lang=release.lang, source=SOURCE,
                          term_id=code, term_type="PT", preferred=True)
    for number, fields in _rows(llt_path, LLT_FIELDS, release.limits):
        llt = _code(llt_path, number, fields[0], "llt_code")
        pt = _code(llt_path, number, fields[2], "pt_code")
        if pt not in pt_codes:
            raise InputFormatError(llt_path, f"a pt_code listed in {pt_path.name}", f"pt_code {pt} of LLT {llt}",
                                   line=number, fix="the release is incomplete or mixes versions")
        currency = fields[9].strip().upper()
        if currency not in ("Y", "N"):
            raise InputFormatError(llt_path, "llt_currency Y or N", shorten(fields[9]), line=number)
        yield ConceptName(concept_id=pt if target == "pt" else llt, name=fields[1].strip(), lang=release.lang,
                          source=SOURCE, term_id=llt, term_type="LLT", current=currency == "Y")


def _hierarchy(release: Release) -> list[HierarchyRow]:
    path = release.files.get("mdhier.asc")
    if path is None:
        return []
    rows = []
    for number, f in _rows(path, MDHIER_FIELDS, release.limits):
        codes = [_code(path, number, f[i], MDHIER_FIELDS[i]) for i in range(4)]
        flag = f[11].strip().upper()
        if flag not in ("Y", "N"):
            raise InputFormatError(path, "primary_soc_fg Y or N", shorten(f[11]), line=number)
        rows.append(HierarchyRow(
            pt_code=codes[0], pt_name=f[4].strip(), hlt_code=codes[1], hlt_name=f[5].strip(),
            hlgt_code=codes[2], hlgt_name=f[6].strip(), soc_code=codes[3], soc_name=f[7].strip(),
            soc_abbrev=f[8].strip(), primary_soc=flag == "Y", lang=release.lang,
        ))
    return rows


def releases_for(paths: Sequence[Path], options: SourceOptions) -> list[Release]:
    """All MedAscii releases under `paths`, restricted to `options.langs`, checked to be one version."""
    releases = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise MissingInputError(f"{path}: no such file or folder (MedDRA MedAscii release)")
        folders = find_releases(path)
        if not folders:
            raise MissingInputError(
                f"{path}: no MedDRA MedAscii folder (one with llt.asc and pt.asc) found here or "
                f"up to {_MAX_DEPTH} levels below"
            )
        root = path if path.is_dir() else path.parent
        releases.extend(read_release(folder, root, options.limits) for folder in folders)
    by_lang: dict[str, Release] = {}
    for release in releases:
        if release.lang in by_lang:
            raise ConfigError(
                f"two MedDRA releases for language {release.lang!r}: {by_lang[release.lang].folder} and "
                f"{release.folder}; pass one folder per language"
            )
        by_lang[release.lang] = release
    versions = sorted({r.version for r in releases if r.version})
    if len(versions) > 1:
        raise ConfigError(
            f"MedDRA releases of different versions ({', '.join(versions)}) cannot share one table: "
            + "; ".join(f"{r.folder} is {r.version}" for r in releases if r.version)
        )
    kept = [r for r in releases if not options.langs or r.lang in options.langs]
    for r in releases:
        log.info("MedDRA release %s: language %s (from %s), version %s%s", r.folder, r.lang, r.lang_from,
                 r.version or "unknown", "" if r in kept else " -- skipped by --lang")
    return kept


@register("meddra")
def read_meddra(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """Read MedAscii folders (one per language, or one folder holding several) into concept names."""
    target = options.meddra_target.lower()
    if target not in TARGETS:
        raise UnknownNameError("MedDRA target", options.meddra_target, TARGETS)
    releases = releases_for(paths, options)

    def names() -> Iterator[ConceptName]:
        for release in releases:
            yield from _names(release, target)

    def hierarchy() -> list[HierarchyRow]:
        return [row for release in releases for row in _hierarchy(release)]

    versions = sorted({r.version for r in releases if r.version})
    return SourceOutput(
        names=names(),
        hierarchy=hierarchy,
        description={
            "version": versions[0] if versions else None,
            "languages": [r.lang for r in releases],
            "target": target,
            "releases": [r.describe() for r in releases],
        },
    )
