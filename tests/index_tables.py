"""Write the tiny concept table of tests/fixtures/index (TSV) as the parquet files an index is built from."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from linker.dictionary import hierarchy_path
from linker.schema import CONCEPT_SCHEMA, HIERARCHY_SCHEMA

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "index"


def _read_tsv(path: Path, schema: pa.Schema) -> pa.Table:
    columns = [f.name for f in schema if f.name != "xrefs"]
    options = pacsv.ConvertOptions(column_types={f.name: f.type for f in schema if f.name != "xrefs"},
                                   include_columns=columns)
    return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter="\t"), convert_options=options)


def write_concepts(out: Path, *, hierarchy: bool = True, rows: list[dict] | None = None) -> Path:
    """concepts.tsv (or `rows`) -> `out` parquet with CONCEPT_SCHEMA; hierarchy.tsv beside it when asked."""
    if rows is None:
        table = _read_tsv(FIXTURE / "concepts.tsv", CONCEPT_SCHEMA)
        table = table.append_column("xrefs", pa.array([[]] * table.num_rows, type=pa.list_(pa.string())))
    else:
        defaults = {"source": "test", "term_type": "SY", "preferred": False, "current": True, "xrefs": []}
        full = [{**defaults, "term_id": r["concept_id"], **r} for r in rows]
        table = pa.Table.from_pylist(full, schema=CONCEPT_SCHEMA)
    pq.write_table(table.select(CONCEPT_SCHEMA.names).cast(CONCEPT_SCHEMA), out)
    if hierarchy and rows is None:
        pq.write_table(_read_tsv(FIXTURE / "hierarchy.tsv", HIERARCHY_SCHEMA).cast(HIERARCHY_SCHEMA),
                       hierarchy_path(out))
    return out
