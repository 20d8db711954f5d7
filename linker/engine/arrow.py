"""The Arrow function every engine runs: spans in, one flat result row per span out.

`link_arrow` is `Linker.link_batch` (Arrow in, Arrow out) with the normaliser's rules
(a language the index lacks is linked against all names, `linker.normalize.usable_langs`) and
its candidates laid out as flat list columns, which Parquet, Spark and pandas read without
a nested struct type:

| column | type | |
|---|---|---|
| ``id`` | string | the span's id (the input's ``id``, else ``<shard>:<line or row>`` for shards) |
| ``text``, ``lang`` | string | as given (``lang`` null = any language) |
| ``concept_ids``, ``names``, ``matched_names`` | list<string> | top k, best first; ``names`` are preferred names |
| ``scores`` | list<float32> | the ranking score of each candidate |
| ``confidence`` | float32 | calibrated confidence of the best candidate; null without calibration or when nil |
| ``decision`` | string | ``auto``, ``review`` or ``no link`` (`linker.confidence`); null without calibration |
| ``nil`` | bool | "no link": below ``--min-confidence``, or no candidate at all |

`map_in_arrow` wraps it for Spark's ``mapInArrow``, loading the index once per Python worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from linker.errors import InputFormatError
from linker.link import Linker
from linker.normalize import usable_langs

OUTPUT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("lang", pa.string()),
        ("concept_ids", pa.list_(pa.string())),
        ("names", pa.list_(pa.string())),
        ("matched_names", pa.list_(pa.string())),
        ("scores", pa.list_(pa.float32())),
        ("confidence", pa.float32()),
        ("decision", pa.string()),
        ("nil", pa.bool_()),
    ]
)
"""Columns of every engine's output (see the module docstring)."""

SPARK_SCHEMA = ("id string, text string, lang string, concept_ids array<string>, names array<string>, "
                "matched_names array<string>, scores array<float>, confidence float, decision string, nil boolean")
"""`OUTPUT_SCHEMA` in Spark's DDL, the second argument of ``mapInArrow``."""


def link_arrow(linker: Linker, batch: pa.RecordBatch, *, k: int = 1, lang: str | None = None) -> pa.RecordBatch:
    """Link a batch with columns ``text`` (required), ``id`` and ``lang`` (optional) into `OUTPUT_SCHEMA`.

    `lang` applies to rows whose own ``lang`` is null. Rows keep their order; an empty text is an
    `InputFormatError` naming its row (engines that read files check rows first and name the file).
    """
    names = batch.schema.names
    if "text" not in names:
        raise InputFormatError("record batch", "a column 'text'", f"columns {names}")
    rows = batch.num_rows
    texts = batch.column("text").cast(pa.string())
    given = batch.column("lang").cast(pa.string()).to_pylist() if "lang" in names else [None] * rows
    langs = usable_langs(linker, [row or lang for row in given])
    linked = linker.link_batch(pa.RecordBatch.from_arrays([texts, pa.array(langs, pa.string())], ["text", "lang"]), k=k)
    candidates = linked.column("candidates")
    offsets, values = candidates.offsets, candidates.values

    def per_span(field: str) -> pa.ListArray:
        return pa.ListArray.from_arrays(offsets, values.field(field))

    counts = pc.list_value_length(candidates).to_numpy(zero_copy_only=False)
    starts = offsets.to_numpy()[:-1]
    first = pa.array(starts, pa.int64(), mask=counts == 0)  # null where there is no candidate
    confidence = pc.take(values.field("confidence"), first)
    ids = batch.column("id").cast(pa.string()) if "id" in names else pa.nulls(rows, pa.string())
    return pa.RecordBatch.from_arrays(
        [ids, texts, pa.array(given, pa.string()), per_span("concept_id"), per_span("preferred_name"),
         per_span("matched_name"), per_span("score"), confidence, linked.column("decision"),
         pa.array(counts == 0, pa.bool_())],
        schema=OUTPUT_SCHEMA,
    )


_WORKER_LINKERS: dict[tuple, Linker] = {}  # one per (index, options) in each Python worker process


def _link_partition(index: str, k: int, lang: str | None, load_options: tuple,
                    batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    key = (index, load_options)
    if key not in _WORKER_LINKERS:
        _WORKER_LINKERS[key] = Linker.load(index, **dict(load_options))
    for batch in batches:
        if batch.num_rows:
            yield link_arrow(_WORKER_LINKERS[key], batch, k=k, lang=lang)


def map_in_arrow(index: str | Path, *, k: int = 1, lang: str | None = None,
                 **load_options) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for Spark's ``df.mapInArrow(fn, SPARK_SCHEMA)``: each batch through `link_arrow`.

    The index is loaded on first use in each Python worker and kept for the worker's life (Spark
    reuses its Python workers), so it is loaded once per worker, not once per partition: the
    function is a `functools.partial` of a module-level one, so Spark pickles it by reference and
    the cache lives in the worker's copy of this module. `load_options` go to `Linker.load`
    (rerank, rerank_k, min_confidence, precision).
    """
    return functools.partial(_link_partition, str(index), k, lang, tuple(sorted(load_options.items())))


def nil_count(table: pa.Table | pa.RecordBatch) -> int:
    """Spans of an output table that got "no link"."""
    return int(np.count_nonzero(table.column("nil").to_numpy(zero_copy_only=False)))


__all__ = ["OUTPUT_SCHEMA", "SPARK_SCHEMA", "link_arrow", "map_in_arrow", "nil_count"]
