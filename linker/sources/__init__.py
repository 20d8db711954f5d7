"""Terminology sources: raw distribution files -> `ConceptName` records (and side tables).

Each source module defines a reader and registers it in `SOURCES` (a `linker.registry.Registry`)
with ``@register("name")``. A reader is a function `read(paths, options) -> SourceOutput`;
`SourceOutput.names` is an iterator so that large inputs (a 15-million-line MRCONSO.RRF) stream
through in bounded memory.

Every source reads through `linker.fileio`'s bounded layer with `SourceOptions.limits`: a line longer
than ``max_line_bytes`` (gzip decompressed) is refused after reading at most that much of it. A
concept id (and a source name) is checked where it is read, with file and line, by
`linker.formats.check_identifier`: one token without white space or control characters, which every
output format can hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.registry import Registry
from linker.schema import ConceptName, HierarchyRow


@dataclass(frozen=True)
class SourceOptions:
    """Filters common to all sources; a source ignores the ones that do not apply to it."""

    langs: tuple[str, ...] = ()  # ISO 639-1 codes to keep; empty keeps all
    vocabularies: tuple[str, ...] = ()  # UMLS SABs to keep; empty keeps all
    semantic_types: tuple[str, ...] = ()  # UMLS TUIs or type names
    semantic_groups: tuple[str, ...] = ()  # UMLS semantic group abbreviations, e.g. DISO
    current_only: bool = False  # drop non-current / obsolete / suppressible names
    include_suppressed: bool = False  # UMLS: keep SUPPRESS O/E/Y rows
    synonym_scopes: tuple[str, ...] = ("EXACT",)  # OBO synonym scopes to read
    meddra_target: str = "pt"  # MedDRA: link names to their PT ("pt") or keep LLT codes ("llt")
    limits: ReadLimits = DEFAULT_LIMITS  # line (and ClaML element) size caps: --max-line-bytes, --max-document-bytes
    exclude_names: tuple[str, ...] = ()  # default source: TSV files of (concept_id, name) pairs left out, e.g. the lay test set's


@dataclass
class SourceOutput:
    """What a source yields: concept names (streamed) and, for MedDRA, the hierarchy side table."""

    names: Iterator[ConceptName]
    hierarchy: Callable[[], list[HierarchyRow]] | None = None  # called after `names` is exhausted
    description: dict = field(default_factory=dict)  # e.g. release version, files read


Reader = Callable[[Sequence[Path], SourceOptions], SourceOutput]


def _load_all() -> None:
    # Imported on the first lookup so that `import linker` stays fast; each module registers itself.
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


SOURCES: Registry[Reader] = Registry("source", load=_load_all)
register = SOURCES.register


def get_source(name: str) -> Reader:
    return SOURCES.get(name)


def available_sources() -> list[str]:
    return SOURCES.names()


def iter_all(outputs: Iterable[SourceOutput]) -> Iterator[ConceptName]:
    for output in outputs:
        yield from output.names
