"""ICD-O-3 morphology codes from a TSV ``code<TAB>long name<TAB>short name``.

This is the layout of Cantemist's ``valid-codes.tsv``: 58,062 codes of which only 4,205 carry
names; a row with the code alone is valid and yields nothing (the code exists but there is no
name to match). The concept id is the morphology code as written (``8000/3``, ``8000/31``,
``8000/3/H``); the long name is the preferred name (``PT``), the short name a synonym (``SHORT``)
when it differs. Names are Spanish by default (Cantemist's language); ``--lang``'s first value
overrides that. An optional header row starts with ``code``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from linker.errors import ConfigError, InputFormatError, shorten
from linker.fileio import iter_lines
from linker.schema import ConceptName
from linker.sources import SourceOptions, SourceOutput, register

log = logging.getLogger(__name__)

DEFAULT_LANG = "es"
# Morphology code: 4 digits, "/", behaviour digit, optional grade digit, optional "/H" (histology-only).
_CODE = re.compile(r"^\d{4}/\d\d?(/H)?$")


@register("icdo")
def read_icdo(paths: Sequence[Path], options: SourceOptions) -> SourceOutput:
    """ICD-O-3 morphology TSVs (see module docstring)."""
    if not paths:
        raise ConfigError("the icdo source needs a code list such as Cantemist's valid-codes.tsv")
    lang = options.langs[0] if options.langs else DEFAULT_LANG
    description: dict = {"lang": lang, "files": []}

    def names() -> Iterator[ConceptName]:
        for path in map(Path, paths):
            codes = named = 0
            for number, line in iter_lines(path, max_line_bytes=options.limits.max_line_bytes):
                cells = [c.strip() for c in line.split("\t")]
                if not cells[0]:
                    if len(cells) == 1:
                        continue  # blank line
                    raise InputFormatError(path, "code<TAB>long name<TAB>short name", shorten(line), line=number)
                if number == 1 and cells[0].lower() == "code":
                    continue
                if not _CODE.match(cells[0]):
                    raise InputFormatError(
                        path, "an ICD-O-3 morphology code such as 8000/3", shorten(cells[0]), line=number
                    )
                codes += 1
                long_name = cells[1] if len(cells) > 1 else ""
                short_name = cells[2] if len(cells) > 2 else ""
                if not long_name and not short_name:
                    continue
                named += 1
                code = cells[0]
                first = long_name or short_name
                yield ConceptName(code, first, lang, "icdo3", code, "PT", True)
                if short_name and short_name != first:
                    yield ConceptName(code, short_name, lang, "icdo3", code, "SHORT", False)
            description["files"].append({"path": str(path), "codes": codes, "codes_with_names": named})
            log.info("%s: %d codes, %d with names", path, codes, named)

    return SourceOutput(names=names(), description=description)
