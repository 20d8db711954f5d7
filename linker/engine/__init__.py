"""Scale-out: the batch normaliser on a cluster, with the same code as `linker normalize`.

- `linker.engine.arrow`: the one function every engine runs, an Arrow record batch of spans in,
  an Arrow record batch of results out (`link_arrow`, `OUTPUT_SCHEMA`), and `map_in_arrow` for
  Spark's ``DataFrame.mapInArrow``.
- `linker.engine.shards`: exactly-once, resumable normalisation of a folder of Parquet / JSONL
  shards into one Parquet shard each, plus the ``_SUCCESS`` manifest; engine-independent.
- `linker.engine.ray`: the same on Ray Data (`normalize_ray`, `link_dataset`); needs ``linker[ray]``.
"""
