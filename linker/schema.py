"""One concept schema: the concept table, one row per (concept, name).

Every source parser produces `ConceptName` records; `dictionary` turns them into an Arrow
table with `CONCEPT_SCHEMA` and writes it to parquet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from linker.errors import InputFormatError

CONCEPT_SCHEMA = pa.schema(
    [
        pa.field("concept_id", pa.string(), nullable=False),  # link target: PT code, CUI, ICD code, HP id
        pa.field("name", pa.string(), nullable=False),  # surface form as in the source
        pa.field("lang", pa.string(), nullable=False),  # ISO 639-1: en, es, fr, de, nl, ...
        pa.field("source", pa.string(), nullable=False),  # e.g. meddra, umls:MSH, icd10cm, hpo
        pa.field("term_id", pa.string(), nullable=False),  # the source's id for this name (LLT code, AUI, ...)
        pa.field("term_type", pa.string(), nullable=False),  # PT, LLT, SY, ...
        pa.field("preferred", pa.bool_(), nullable=False),  # the concept's preferred name in this language
        pa.field("current", pa.bool_(), nullable=False),  # False for MedDRA non-current LLTs and the like
        pa.field("xrefs", pa.list_(pa.string()), nullable=False),  # e.g. UMLS:C0002170 for an HPO term
    ]
)

HIERARCHY_SCHEMA = pa.schema(
    [
        pa.field("pt_code", pa.string(), nullable=False),
        pa.field("pt_name", pa.string(), nullable=False),
        pa.field("hlt_code", pa.string(), nullable=False),
        pa.field("hlt_name", pa.string(), nullable=False),
        pa.field("hlgt_code", pa.string(), nullable=False),
        pa.field("hlgt_name", pa.string(), nullable=False),
        pa.field("soc_code", pa.string(), nullable=False),
        pa.field("soc_name", pa.string(), nullable=False),
        pa.field("soc_abbrev", pa.string(), nullable=False),
        pa.field("primary_soc", pa.bool_(), nullable=False),
        pa.field("lang", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class ConceptName:
    """One name of one concept, as a source parser yields it."""

    concept_id: str
    name: str
    lang: str
    source: str
    term_id: str
    term_type: str
    preferred: bool = False
    current: bool = True
    xrefs: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class HierarchyRow:
    """One PT -> HLT -> HLGT -> SOC path of MedDRA (a PT may have several, one primary)."""

    pt_code: str
    pt_name: str
    hlt_code: str
    hlt_name: str
    hlgt_code: str
    hlgt_name: str
    soc_code: str
    soc_name: str
    soc_abbrev: str
    primary_soc: bool
    lang: str


def validate_concept_table(table: pa.Table, where: str) -> pa.Table:
    """Check that `table` has the concept schema's columns and types; return it cast to the schema."""
    missing = [f.name for f in CONCEPT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise InputFormatError(
            where,
            f"a linker concept table with columns {', '.join(CONCEPT_SCHEMA.names)}",
            f"no column(s) {', '.join(missing)}",
            fix="build one with `linker dict build`",
        )
    try:
        return table.select(CONCEPT_SCHEMA.names).cast(CONCEPT_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
        raise InputFormatError(where, "concept table column types", str(exc)) from None
