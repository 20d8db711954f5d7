"""Concept tables: build from sources, write and read parquet, describe.

A concept table is one parquet file with `CONCEPT_SCHEMA`, plus JSON metadata (what was read,
with which options, by which library version). MedDRA's hierarchy goes to a sibling file
``<name>.hierarchy.parquet``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from operator import attrgetter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import linker
from linker.errors import LinkerError, MissingInputError
from linker.fileio import Input, atomic_file, check_output, native_read
from linker.folders import sha256_file
from linker.progress import bar
from linker.schema import CONCEPT_SCHEMA, HIERARCHY_SCHEMA, ConceptName, HierarchyRow, validate_concept_table
from linker.sources import SourceOptions, SourceOutput, get_source

log = logging.getLogger(__name__)

META_KEY = b"linker"
BATCH_ROWS = 65_536  # rows per parquet row group written; bounds the builder's buffer
PROGRESS_STEP = 4096  # names read between two progress updates


@dataclass(frozen=True)
class SourceSpec:
    """One `--source NAME PATH...` of a build."""

    name: str
    paths: tuple[Path, ...]


@dataclass(frozen=True)
class BuildSummary:
    out: Path
    rows: int
    concepts: int
    duplicates_dropped: int
    filtered_out: int
    hierarchy_rows: int
    seconds: float


@dataclass
class ConceptTable:
    """A concept table read back from parquet, with its metadata and optional hierarchy."""

    path: Path
    table: pa.Table
    meta: dict
    hierarchy: pa.Table | None

    @property
    def sha256(self) -> str:
        return sha256_file(self.path)


def hierarchy_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name.removesuffix(".parquet") + ".hierarchy.parquet")


def _keep(name: ConceptName, options: SourceOptions) -> bool:
    if options.langs and name.lang not in options.langs:
        return False
    if options.current_only and not name.current:
        return False
    return bool(name.name.strip()) and bool(name.concept_id.strip())


def _batches(names: Iterable[ConceptName]) -> Iterator[pa.RecordBatch]:
    buffer: list[ConceptName] = []
    for name in names:
        buffer.append(name)
        if len(buffer) >= BATCH_ROWS:
            yield _to_batch(buffer)
            buffer = []
    if buffer:
        yield _to_batch(buffer)


_FIELDS = attrgetter(*CONCEPT_SCHEMA.names)


def _to_batch(rows: list[ConceptName]) -> pa.RecordBatch:
    # One attrgetter call per row and a transpose: a third faster than getattr per field and row.
    columns = dict(zip(CONCEPT_SCHEMA.names, map(list, zip(*map(_FIELDS, rows)))))
    return pa.RecordBatch.from_pydict(columns, schema=CONCEPT_SCHEMA)


def build_dictionary(
    sources: Sequence[SourceSpec],
    out: str | Path,
    *,
    options: SourceOptions = SourceOptions(),
    overwrite: bool = False,
) -> BuildSummary:
    """Read every source, filter, drop duplicate (concept_id, name, lang) rows, write parquet atomically.

    The first occurrence of a duplicate wins, so sources yield a concept's preferred name first.
    Memory grows with the output only (one 8-byte key per kept row), never with the input.
    An existing `out` is replaced only with `overwrite`; it may never be one of the inputs.
    """
    started = dt.datetime.now(dt.timezone.utc)
    out = Path(out)
    if not sources:
        raise LinkerError("no source given; pass --source NAME PATH...")
    _check_table_output(out, [p for spec in sources for p in spec.paths], overwrite, option="--source",
                        extra=[Input(Path(p), "--exclude-names") for p in options.exclude_names])
    outputs = _open_sources(sources, options)
    concepts: set[str] = set()
    counts = Counter()
    hierarchy: list[HierarchyRow] = []
    reporter = bar(desc=f"reading {', '.join(spec.name for spec in sources)}", unit="name")
    with atomic_file(out) as tmp:
        with pq.ParquetWriter(tmp, CONCEPT_SCHEMA, compression="zstd") as writer:
            for batch in _batches(_kept_names(outputs, options, counts, concepts, hierarchy, reporter)):
                writer.write_batch(batch)
            # Sources fill their description (counts, skipped rows) while streaming, so the
            # metadata goes into the footer once every name has been read.
            meta = {
                "library_version": linker.__version__,
                "built_at": started.isoformat(timespec="seconds"),
                "sources": [
                    {"name": spec.name, "paths": [str(p) for p in spec.paths], **output.description}
                    for spec, output in outputs
                ],
                "options": asdict(options),
            }
            writer.add_key_value_metadata({META_KEY: json.dumps(meta).encode()})
        if counts["rows"] == 0:
            raise LinkerError(
                f"no concept names left after reading and filtering {', '.join(s.name for s in sources)}; "
                "check the paths and the --lang/--sab/--sty/--group filters"
            )
        if hierarchy:
            with atomic_file(hierarchy_path(out)) as tmp_h:
                pq.write_table(_hierarchy_table(hierarchy), tmp_h, compression="zstd")
    if not hierarchy:
        hierarchy_path(out).unlink(missing_ok=True)  # a stale side table must not outlive its table
    seconds = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    summary = BuildSummary(
        out=out,
        rows=counts["rows"],
        concepts=len(concepts),
        duplicates_dropped=counts["duplicates"],
        filtered_out=counts["filtered"],
        hierarchy_rows=len(hierarchy),
        seconds=round(seconds, 3),
    )
    log.debug("wrote %s: %d names of %d concepts in %.1fs", out, summary.rows, summary.concepts, seconds)
    return summary


def _open_sources(sources: Sequence[SourceSpec], options: SourceOptions) -> list[tuple[SourceSpec, SourceOutput]]:
    """`build_dictionary`'s readers, one per source, each over its paths (checked to exist first)."""
    outputs = []
    for spec in sources:
        reader = get_source(spec.name)
        for path in spec.paths:
            if not Path(path).exists():
                raise MissingInputError(f"{path}: no such file or folder (source {spec.name})")
        outputs.append((spec, reader(list(spec.paths), options)))
    return outputs


def _kept_names(outputs: list[tuple[SourceSpec, SourceOutput]], options: SourceOptions, counts: Counter,
                concepts: set[str], hierarchy: list[HierarchyRow], reporter) -> Iterator[ConceptName]:
    """`build_dictionary`'s names: those `options` keep, the first of each (concept_id, name, lang). Counts the rows
    kept, filtered and duplicate in `counts`, collects the concepts and each source's side table once its names
    are read, and reports progress."""
    seen: set[int] = set()  # one 8-byte key per kept row: memory grows with the output, never with the input
    read = 0
    for _spec, output in outputs:
        for name in output.names:
            read += 1
            if read % PROGRESS_STEP == 0:  # per name would cost more than the filtering itself
                reporter.update(PROGRESS_STEP)
            if not _keep(name, options):
                counts["filtered"] += 1
                continue
            key = hash((name.concept_id, name.name, name.lang))
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            concepts.add(name.concept_id)
            counts["rows"] += 1
            yield name
        if output.hierarchy is not None:
            hierarchy.extend(output.hierarchy())
    reporter.update(read % PROGRESS_STEP)
    reporter.close()


def _hierarchy_table(rows: list[HierarchyRow]) -> pa.Table:
    unique = list(dict.fromkeys(rows))
    return pa.Table.from_pydict(
        {f.name: [getattr(r, f.name) for r in unique] for f in HIERARCHY_SCHEMA}, schema=HIERARCHY_SCHEMA
    )


def _read_parquet(path: Path) -> tuple[pa.Table, dict | None]:
    """A parquet file's rows (without the footer's key-value metadata, as `pq.read_table` gives them) and that
    metadata. Through `pq.ParquetFile`: `pq.read_table` goes through pyarrow.dataset, which imports pandas, a second
    of a `linker link` start-up on a busy machine."""
    with pq.ParquetFile(path) as parquet:
        return parquet.read().replace_schema_metadata(None), parquet.metadata.metadata


def read_concept_table(path: str | Path) -> ConceptTable:
    """Read a concept table written by `build_dictionary` (or any parquet with the concept schema)."""
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"{path}: no such concept table; build one with `linker dict build`")
    if path.is_dir():
        # manifest.json marks an index folder (linker.index.manifest, which imports this module).
        what = "an index folder" if (path / "manifest.json").is_file() else "a folder"
        copy = f" (the index's own copy is {path / 'concepts.parquet'})" if what == "an index folder" else ""
        raise MissingInputError(
            f"{path}: expected a concept table (.parquet), found {what}; `dict info`, `index build --dict` and "
            f"`train --dict` take the concept table from `linker dict build`{copy}"
        )
    with native_read(path, "a parquet concept table"):
        table, raw_meta = _read_parquet(path)
        # The footer's key-value metadata: `build_dictionary` adds it after streaming the rows, where
        # the Arrow schema stored in the file can no longer carry it.
        raw_meta = (raw_meta or {}).get(META_KEY)
        meta = json.loads(raw_meta) if raw_meta else {}
    table = validate_concept_table(table, str(path))
    side = hierarchy_path(path)
    hierarchy = None
    if side.exists():
        with native_read(side, "a parquet hierarchy table"):
            hierarchy = _read_parquet(side)[0]
    return ConceptTable(path=path, table=table, meta=meta, hierarchy=hierarchy)


def alternative_ids(table: pa.Table, *, strip_prefix: str | None = None) -> dict[str, frozenset[str]]:
    """code_key(id) -> the code keys of the ids that name the same concept, read from the ``xrefs`` column.

    A concept and each of its xrefs are alternatives of each other, both ways and one step only:
    MEDIC's ``C567755`` and its OMIM twin ``OMIM:613097`` (NCBI-disease annotates with either; a
    disease that MEDIC lists on an OMIM-only line and as another disease's alternative is then
    reached both ways), but two HPO terms that share a UMLS xref do not become one concept.
    `strip_prefix` (``UMLS``) also adds the xrefs of that prefix without it (``UMLS:C0002170`` ->
    ``C0002170``), for gold standards written in that id space (Mantra's CUIs). Evaluation
    (`linker.eval.report.gold_matcher`) and training (`linker.train.biosyn`) both read alternatives here.
    """
    from linker.text import code_key

    tag = None if strip_prefix is None else strip_prefix.rstrip(":").upper() + ":"
    out: dict[str, set[str]] = {}
    for concept_id, xrefs in zip(table.column("concept_id").to_pylist(), table.column("xrefs").to_pylist()):
        key = code_key(concept_id)
        for xref in xrefs or ():
            alternatives = [xref] + ([xref[len(tag):]] if tag and xref.upper().startswith(tag) else [])
            for alt in map(code_key, alternatives):
                if alt != key:
                    out.setdefault(key, set()).add(alt)
                    out.setdefault(alt, set()).add(key)
    return {k: frozenset(v) for k, v in out.items()}


def describe(path: str | Path, *, samples: int = 5) -> dict:
    """Counts of concepts and names per source, language and term type, and a few sample rows."""
    ct = read_concept_table(path)
    table = ct.table

    def counts_by(column: str) -> dict[str, dict[str, int]]:
        grouped = table.group_by(column).aggregate([("name", "count"), ("concept_id", "count_distinct")])
        rows = sorted(grouped.to_pylist(), key=lambda r: (-r["name_count"], str(r[column])))
        return {str(r[column]): {"names": r["name_count"], "concepts": r["concept_id_count_distinct"]} for r in rows}

    step = max(1, table.num_rows // max(samples, 1))
    sample_rows = [table.slice(i, 1).to_pylist()[0] for i in range(0, table.num_rows, step)][:samples]
    return {
        "path": str(ct.path),
        "names": table.num_rows,
        "concepts": len(set(table.column("concept_id").to_pylist())),
        "non_current_names": table.num_rows - sum(table.column("current").to_pylist()),
        "by_source": counts_by("source"),
        "by_lang": counts_by("lang"),
        "by_term_type": counts_by("term_type"),
        "hierarchy_rows": 0 if ct.hierarchy is None else ct.hierarchy.num_rows,
        "meta": ct.meta,
        "samples": sample_rows,
    }


def _check_table_output(out: Path, inputs: Sequence[str | Path], overwrite: bool, *, option: str,
                        tables: bool = False, extra: Sequence[Input] = ()) -> None:
    """The table and its hierarchy side table are outputs; neither may touch an input. With `tables` the inputs
    are concept tables, whose side tables are read too (`read_concept_table`); a source's files have none."""
    named = [Input(Path(p), option) for p in inputs] + list(extra)
    if tables:
        named += [Input(hierarchy_path(p), f"the hierarchy side table of {p}") for p in inputs]
    check_output(out, inputs=named, overwrite=overwrite, option="--out")
    check_output(hierarchy_path(out), inputs=named, overwrite=True, option=f"--out {out}: its hierarchy side table")


def merge_tables(paths: Sequence[str | Path], out: str | Path, *, overwrite: bool = False) -> BuildSummary:
    """Concatenate concept tables, dropping duplicate (concept_id, name, lang) rows; first table wins.

    An existing `out` is replaced only with `overwrite`; it may never be one of the inputs.
    """
    started = dt.datetime.now(dt.timezone.utc)
    if not paths:
        raise LinkerError("no concept table given to merge")
    _check_table_output(Path(out), paths, overwrite, option="dict merge", tables=True)
    tables = [read_concept_table(p) for p in paths]
    combined = pa.concat_tables([t.table for t in tables])
    keys = [hash(k) for k in zip(*(combined.column(c).to_pylist() for c in ("concept_id", "name", "lang")))]
    first: dict[int, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    merged = combined.take(sorted(first.values()))
    meta = {
        "library_version": linker.__version__,
        "built_at": started.isoformat(timespec="seconds"),
        "merged_from": [{"path": str(t.path), **t.meta} for t in tables],
    }
    hierarchies = [t.hierarchy for t in tables if t.hierarchy is not None]
    with atomic_file(out) as tmp:
        pq.write_table(merged.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), tmp, compression="zstd")
        if hierarchies:
            with atomic_file(hierarchy_path(out)) as tmp_h:
                pq.write_table(pa.concat_tables(hierarchies), tmp_h, compression="zstd")
    if not hierarchies:
        hierarchy_path(out).unlink(missing_ok=True)
    return BuildSummary(
        out=Path(out),
        rows=merged.num_rows,
        concepts=len(set(merged.column("concept_id").to_pylist())),
        duplicates_dropped=combined.num_rows - merged.num_rows,
        filtered_out=0,
        hierarchy_rows=sum(h.num_rows for h in hierarchies),
        seconds=round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 3),
    )
