"""Exactly-once, resumable normalisation of a collection of shards: one Parquet output per input shard.

A job reads Parquet or JSONL (``.jsonl``, ``.jsonl.gz``) shards from a folder or a glob and writes,
for input ``a/part-7.jsonl``, the output ``OUT/a/part-7.parquet`` (`OUTPUT_SCHEMA`), then
``OUT/_SUCCESS``: a JSON manifest with the counts and the index's manifest hash, written last, so
its presence means every shard is done. The engine (`linker.engine.ray`) only decides where
`normalize_shard` runs; everything that makes the result exactly-once is here:

- a shard is checked whole before anything is linked (a bad row fails the shard with the file and
  the line or row, and leaves no output for it), then written through `linker.fileio.atomic_file`:
  an output shard exists complete or not at all, whoever was killed;
- a re-run with the same input, output and options skips the shards whose output exists and
  writes the others; the results are byte-identical, because an output depends only on its input
  shard, the index and the options (``.linker-job.json`` records them; a re-run with others is
  refused unless ``--overwrite``), and temporaries left by dead writers are removed;
- the output folder is checked like every other linker output (`linker.fileio.check_output`):
  never the input, never inside it, never a folder linker did not write.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

import pyarrow as pa
import pyarrow.parquet as pq

from linker.engine.arrow import OUTPUT_SCHEMA, link_arrow, nil_count
from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.fileio import MARKER, atomic_file, check_inputs, check_output, is_temporary, native_read, \
    remove_stale_temporaries
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.formats.jsonl import jsonl_source, read_jsonl
from linker.index.manifest import MANIFEST, read_manifest
from linker.link import Linker
from linker.normalize import BATCH, batched
from linker.rerank import DEFAULT_RERANK_K

log = logging.getLogger(__name__)

SHARD_SUFFIXES = (".parquet", ".jsonl.gz", ".jsonl")
SUCCESS = "_SUCCESS"
JOB = ".linker-job.json"
ROW_GROUP = 65_536
# `Linker.load`'s options that change results, with their defaults: a job records all of them, so the
# CLI (which passes every one) and the Python API (which passes what it is given) resume each other's runs.
LOAD_DEFAULTS = {"rerank": None, "rerank_k": DEFAULT_RERANK_K, "min_confidence": None, "precision": None}  # output rows per Parquet row group: batches are gathered to this size


@dataclass(frozen=True)
class Shard:
    """One input file and the output it gives; `name` is its path relative to the input folder."""

    source: Path
    name: str
    output: Path


def _suffix(path: PurePath) -> str | None:
    return next((s for s in SHARD_SUFFIXES if path.name.endswith(s)), None)


def list_shards(input_spec: str, output: str | Path) -> tuple[Path, list[Shard]]:
    """(input folder, shards) of a folder (every shard below it), a glob or one file, sorted by name.

    Outputs mirror the inputs' paths below the folder (a glob's: the folder before its first
    wildcard), with the suffix ``.parquet``; two inputs that would share an output are refused.
    """
    check_inputs(input_spec, option="--input")
    given = Path(input_spec)
    if given.is_dir():
        base = given
        files = [p for p in given.rglob("*") if p.is_file() and _suffix(p) and not is_temporary(p)
                 and not any(part.startswith(".") for part in p.relative_to(given).parts)]
    elif glob.has_magic(input_spec):
        parts = given.parts
        fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
        base = Path(*parts[:fixed]) if fixed else Path(".")
        files = [Path(p) for p in glob.glob(input_spec, recursive=True) if Path(p).is_file()]
        odd = [p for p in files if not _suffix(p)]
        if odd:
            raise InputFormatError(odd[0], f"a shard named *{', *'.join(SHARD_SUFFIXES)}", f"the file {odd[0].name!r}",
                                   fix="narrow the glob")
    elif given.is_file():
        if not _suffix(given):
            raise InputFormatError(given, f"a shard named *{', *'.join(SHARD_SUFFIXES)}", f"the file {given.name!r}")
        base, files = given.parent, [given]
    else:
        raise MissingInputError(f"{input_spec}: no such file or folder")
    if not files:
        raise MissingInputError(f"{input_spec}: no {', '.join(SHARD_SUFFIXES)} shards there")
    out = Path(output)
    shards, seen = [], {}
    for path in sorted(files):
        name = path.relative_to(base).as_posix()
        target = name[: -len(_suffix(path))] + ".parquet"
        if target in seen:
            raise ConfigError(f"--input: {seen[target]} and {name} would both be written to {out / target}; "
                              "rename one of them")
        seen[target] = name
        shards.append(Shard(path, name, out / target))
    return base, shards


# ----------------------------------------------------------------------------- reading one shard


def _check_lang(lang, where: str) -> None:
    if lang is not None and (not isinstance(lang, str) or not lang.strip()):
        raise InputFormatError(where, '"lang" as a language code such as "en"', f"lang {lang!r}")


def _jsonl_batches(shard: Shard, size: int, limits: ReadLimits) -> Iterator[pa.RecordBatch]:
    # `read_jsonl` checks every line (JSON object, non-empty text, lang, id) and names file:line.
    lines, where = jsonl_source(str(shard.source), limits)
    for spans in batched(read_jsonl(lines(), where), size):
        ids = [f"{shard.name}:{s.line}" if s.record.get("id") is None else str(s.record["id"]) for s in spans]
        yield pa.RecordBatch.from_pydict(
            {"id": ids, "text": [s.text for s in spans], "lang": [s.lang for s in spans]},
            schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())]),
        )


def _parquet_batches(shard: Shard, size: int) -> Iterator[pa.RecordBatch]:
    path = shard.source
    with native_read(path, "a Parquet file of spans"):
        handle = pq.ParquetFile(path)
    fields = {f.name: f.type for f in handle.schema_arrow}
    wanted = {"text": "a string", "lang": "a string", "id": "a string or integer"}
    if "text" not in fields:
        raise InputFormatError(path, "a column 'text'", f"columns {sorted(fields)}")
    for column, expected in wanted.items():
        kind = fields.get(column)
        if kind is not None and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                     or (column == "id" and pa.types.is_integer(kind))):
            raise InputFormatError(path, f"column {column!r} of {expected} type", f"type {kind}")
    columns = [c for c in ("id", "text", "lang") if c in fields]
    row = 0
    with native_read(path, "a Parquet file of spans"):
        for batch in handle.iter_batches(batch_size=size, columns=columns):
            texts = batch.column("text").to_pylist()
            langs = batch.column("lang").to_pylist() if "lang" in fields else [None] * len(texts)
            given = batch.column("id").to_pylist() if "id" in fields else [None] * len(texts)
            for i, (text, lang) in enumerate(zip(texts, langs)):
                where = f"{path} row {row + i + 1}"
                if not isinstance(text, str) or not text.strip():
                    raise InputFormatError(where, "a non-empty text",
                                           f"text {shorten(text)}" if isinstance(text, str) else "a null text")
                _check_lang(lang, where)
            ids = [f"{shard.name}:{row + i + 1}" if value is None else str(value) for i, value in enumerate(given)]
            yield pa.RecordBatch.from_pydict({"id": ids, "text": texts, "lang": [x.strip() if x else None for x in langs]})
            row += len(texts)


def read_shard(shard: Shard, *, batch_size: int = BATCH, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[pa.RecordBatch]:
    """Checked batches (``id``, ``text``, ``lang``) of one shard; a span without an id gets ``<name>:<line/row>``."""
    if shard.source.name.endswith(".parquet"):
        return _parquet_batches(shard, batch_size)
    return _jsonl_batches(shard, batch_size, limits)


# ----------------------------------------------------------------------------- one shard, exactly once


def normalize_shard(linker: Linker, shard: Shard, *, k: int = 1, lang: str | None = None, batch_size: int = BATCH,
                    limits: ReadLimits = DEFAULT_LIMITS) -> dict:
    """Link one shard into its output Parquet file, atomically; return its counts.

    Two passes over the input, like `linker normalize`: the first checks every row (nothing is
    written if one is bad), the second links `batch_size` spans at a time. The output holds only
    what its input, the index and the options determine, so a re-run writes the same bytes.
    """
    spans = sum(batch.num_rows for batch in read_shard(shard, batch_size=batch_size, limits=limits))
    nil, pending = 0, []
    metadata = {"linker.input": shard.name, "linker.input_bytes": str(shard.source.stat().st_size)}
    with atomic_file(shard.output) as tmp:
        with pq.ParquetWriter(tmp, OUTPUT_SCHEMA.with_metadata(metadata)) as writer:
            for batch in read_shard(shard, batch_size=batch_size, limits=limits):
                out = link_arrow(linker, batch, k=k, lang=lang)
                nil += nil_count(out)
                pending.append(out)
                if sum(b.num_rows for b in pending) >= ROW_GROUP:
                    writer.write_table(pa.Table.from_batches(pending))
                    pending = []
            if pending or not spans:
                writer.write_table(pa.Table.from_batches(pending, schema=writer.schema))
    return {"input": shard.name, "spans": spans, "nil": nil}


# ----------------------------------------------------------------------------- the job


def index_hash(index: str | Path) -> str:
    """sha256 of the index's manifest.json, which lists every file's checksum: names the index exactly."""
    folder = Path(index)
    read_manifest(folder)  # a missing or malformed manifest fails here, on the driver, with its path
    return hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()


def job_document(index: str | Path, *, k: int, lang: str | None, batch_size: int, load_options: dict) -> dict:
    """What an output folder's results depend on; a re-run must match it to resume (`prepare_output`)."""
    if k < 1:
        raise ConfigError(f"--k must be at least 1, found {k}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, found {batch_size}")
    unknown = sorted(set(load_options) - set(LOAD_DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown Linker.load option(s) {', '.join(unknown)}; known: {', '.join(LOAD_DEFAULTS)}")
    options = {name: (str(value) if isinstance(value, Path) else value)
               for name, value in {**LOAD_DEFAULTS, **load_options}.items()}
    return {"index": {"name": Path(index).name, "manifest_sha256": index_hash(index)},
            "k": k, "lang": lang, "batch_size": batch_size, **options}


def _differences(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key))


def prepare_output(input_spec: str, output: str | Path, job: dict, *, overwrite: bool = False) -> tuple[list[Shard], list[Shard]]:
    """(all shards, shards still to do) for a job, with the output folder made ready.

    A new folder gets linker's marker and the job document. A folder of an earlier run of the
    same job is resumed: its temporaries whose writer is dead are removed, its finished shards
    are kept. A folder of a different job is refused, or emptied with `overwrite`.
    """
    base, shards = list_shards(input_spec, output)
    out = Path(output)
    check_output(out, inputs=[base, *(s.source for s in shards)], overwrite=True, folder=True)
    job_file = out / JOB
    if out.is_dir() and any(out.iterdir()):
        previous = json.loads(job_file.read_text(encoding="utf-8")) if job_file.is_file() else None
        if overwrite:
            shutil.rmtree(out)
        elif previous != job:
            found = "another linker command's output" if previous is None else f"a run with {_differences(previous, job)}"
            raise ConfigError(f"--output {out} holds {found}; pass --overwrite to replace it, or choose a new folder")
    if not job_file.is_file():
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text(json.dumps({"written_by": "linker"}) + "\n", encoding="utf-8")
        with atomic_file(job_file) as tmp:
            tmp.write_text(json.dumps(job, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for folder in sorted({s.output.parent for s in shards}):
        remove_stale_temporaries(folder)
    pending = [s for s in shards if not _finished(s)]
    if pending:
        (out / SUCCESS).unlink(missing_ok=True)  # _SUCCESS only ever stands beside every shard
    return shards, pending


def _finished(shard: Shard) -> bool:
    """An output exists (atomic_file: it is complete) and was written from an input of this size."""
    if not shard.output.is_file():
        return False
    with native_read(shard.output, "a Parquet shard written by linker"):
        metadata = pq.read_schema(shard.output).metadata or {}
    return metadata.get(b"linker.input_bytes") == str(shard.source.stat().st_size).encode()


def write_success(output: str | Path, shards: list[Shard], job: dict) -> dict:
    """Write ``_SUCCESS`` (counts per shard and in all, the job) once every shard is done; return it."""
    out = Path(output)
    files = []
    for shard in shards:
        with native_read(shard.output, "a Parquet shard written by linker"):
            nil = nil_count(pq.read_table(shard.output, columns=["nil"]))
        spans = pq.read_metadata(shard.output).num_rows
        files.append({"input": shard.name, "output": shard.output.relative_to(out).as_posix(), "spans": spans,
                      "linked": spans - nil, "nil": nil})
    spans = sum(f["spans"] for f in files)
    nil = sum(f["nil"] for f in files)
    manifest = {"written_by": "linker", "job": job, "shards": len(files), "spans": spans, "linked": spans - nil,
                "nil": nil, "files": files}
    with atomic_file(out / SUCCESS) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def failure_message(errors: list[tuple[str, str]], total: int) -> str:
    """One line for shards that failed: each one's error (file and line or row), the rest being done."""
    shown = "; ".join(message for _, message in errors[:3]) + ("; ..." if len(errors) > 3 else "")
    return (f"{len(errors)} of {total} shard(s) failed and have no output ({shown}); the others are written: "
            "fix the input and run the same command again to finish")


__all__ = [
    "JOB", "SHARD_SUFFIXES", "SUCCESS", "Shard", "failure_message", "index_hash", "job_document", "list_shards",
    "normalize_shard", "prepare_output", "read_shard", "write_success",
]
