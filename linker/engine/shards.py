"""Exactly-once, resumable normalisation of a collection of shards: one Parquet output per input shard.

A job reads Parquet or JSONL (``.jsonl``, ``.jsonl.gz``) shards from a folder or a glob and writes,
for input ``a/part-7.jsonl``, the output ``OUT/a/part-7.parquet`` (`OUTPUT_SCHEMA`), then
``OUT/_SUCCESS``: a JSON manifest with the counts and the index's manifest hash, written last, so
its presence means every shard is done. The engine (`linker.engine.ray`) only decides where
`normalize_shard` runs; everything that makes the result exactly-once is here:

- a shard is checked whole before anything is linked (a bad row fails the shard with the file and
  the line or row, and leaves no output for it), then written through `linker.fileio.atomic_file`:
  an output shard exists complete or not at all, whoever was killed;
- a shard is read within `ReadLimits`: a JSONL line, or a Parquet value, above ``max_line_bytes``
  and a Parquet row group above ``max_document_bytes`` (from its footer, before it is read) fail it;
  a truncated or non-gzip ``.gz`` fails it with its name like any other bad input;
- a re-run with the same input, output and options skips the shards whose output was written from
  an input with the same content (its sha256 is in the output's metadata) and writes the others:
  a shard edited or replaced since is linked again. The results are byte-identical, because an
  output depends only on its input shard, the index and the options (``.linker-job.json`` records
  them; a re-run with others is refused unless ``--overwrite``), and temporaries left by dead
  writers are removed. An output whose input is gone (renamed, removed) is never kept silently:
  the re-run is refused, naming it;
- the output folder is checked like every other linker output (`linker.fileio.check_output`):
  never an input (a shard, the index, a re-ranker folder), never inside one, never a folder linker
  did not write; and every output file resolves inside it, whatever ``..`` or symlink a glob holds.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from linker.engine.arrow import OUTPUT_SCHEMA, link_arrow, nil_count
from linker.errors import ConfigError, InputFormatError, MissingInputError, shorten
from linker.fileio import MARKER, READ_ERRORS, FileNamer, Input, atomic_file, check_inputs, check_output, \
    is_temporary, model_inputs, native_read, read_failure, remove_stale_temporaries
from linker.folders import sha256_file
from linker.formats import DEFAULT_LIMITS, ReadLimits
from linker.formats.jsonl import jsonl_source, read_jsonl
from linker.formats.writers import WRITERS, register_writer
from linker.index.manifest import MANIFEST, read_manifest
from linker.link import Linker
from linker.normalize import BATCH, batched

log = logging.getLogger(__name__)

SHARD_SUFFIXES = (".parquet", ".jsonl.gz", ".jsonl")
SUCCESS = "_SUCCESS"
JOB = ".linker-job.json"
JOB_MAX_BYTES = 1 << 20  # a job document is a few hundred bytes; a larger one is not ours
ROW_GROUP = 65_536  # output rows per Parquet row group: batches are gathered to this size
# `Linker.load`'s options that change results, with their defaults: a job records all of them, so the
# CLI (which passes every one) and the Python API (which passes what it is given) resume each other's runs.
LOAD_DEFAULTS = {"rerank": None, "rerank_k": None, "min_confidence": None, "precision": None}
# What an output shard's Parquet metadata says about the input it was written from.
INPUT_NAME, INPUT_BYTES, INPUT_SHA256 = "linker.input", "linker.input_bytes", "linker.input_sha256"


@dataclass(frozen=True)
class Shard:
    """One input file and the output it gives; `name` is its path relative to the input folder."""

    source: Path
    name: str
    output: Path


def _suffix(path: PurePath) -> str | None:
    return next((s for s in SHARD_SUFFIXES if path.name.endswith(s)), None)


def _absolute(path: str | Path) -> Path:
    """`path` absolute, with ``.`` and ``..`` folded away by name (symlinks are kept as named)."""
    return Path(os.path.abspath(path))


def list_shards(input_spec: str, output: str | Path) -> tuple[Path, list[Shard]]:
    """(input folder, shards) of a folder (every shard below it), a glob or one file, sorted by name.

    Outputs mirror the inputs' paths below the folder (a glob's: the folder before its first
    wildcard, or, when a ``..`` after a wildcard leads out of it, the deepest folder holding every
    match), with the suffix ``.parquet``. A name therefore never holds ``..`` nor an absolute part,
    and every output is checked to resolve inside `output` and to be none of the inputs. A file
    matched twice (``in/*/../x.jsonl``) is one shard; two inputs that would share an output (case ignored, as on
    macOS and Windows) are refused, as is a name that `linker.fileio.safe_stem` refuses.
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
    distinct: dict[str, Path] = {}
    for path in sorted(files):
        distinct.setdefault(os.path.realpath(path), path)
    files = sorted(distinct.values())
    # Names come from the paths folded by name, relative to a folder that holds every one of them:
    # no name can climb out with `..`, however the glob was written.
    absolute = {path: _absolute(path) for path in files}
    root = _absolute(base)
    if not all(root in p.parents for p in absolute.values()):
        root = base = Path(os.path.commonpath([p.parent for p in absolute.values()]))
    out = Path(output)
    shards, namer = [], FileNamer(out)  # each name passes safe_stem; two on one file (case ignored) are refused
    for path in files:
        name = absolute[path].relative_to(root).as_posix()
        target = name[: -len(_suffix(path))] + ".parquet"
        shards.append(Shard(path, name, namer.files(target.split("/"), [""], owner=f"shard {name!r}", where=path)[0]))
    confine_outputs(out, shards)
    return base, shards


def confine_outputs(output: str | Path, shards: Iterable[Shard]) -> None:
    """Refuse an output file that resolves (symlinks followed) outside `output`, or onto an input shard."""
    out = Path(output)
    root = Path(os.path.realpath(out))
    shards = list(shards)
    sources = {Path(os.path.realpath(s.source)): s for s in shards}
    for shard in shards:
        target = Path(os.path.realpath(shard.output))
        if root not in target.parents:
            raise ConfigError(f"--output {out}: the output of {shard.name} resolves to {target}, outside the output "
                              "folder; remove the symlink in it or choose a new folder")
        if target in sources:
            raise ConfigError(f"--output {out}: the output of {shard.name} would replace the input "
                              f"{sources[target].source}; choose an output outside every input")


# ----------------------------------------------------------------------------- reading one shard


def _check_lang(lang, where: str) -> None:
    if lang is not None and (not isinstance(lang, str) or not lang.strip()):
        raise InputFormatError(where, '"lang" as a language code such as "en"', f"lang {lang!r}")


def _jsonl_batches(shard: Shard, size: int, limits: ReadLimits) -> Iterator[pa.RecordBatch]:
    # `read_jsonl` checks every line (JSON object, non-empty text, lang, id) and names file:line;
    # `jsonl_source` caps every line (decompressed) at `limits.max_line_bytes`.
    lines, where = jsonl_source(str(shard.source), limits)
    for spans in batched(read_jsonl(lines(), where), size):
        ids = [f"{shard.name}:{s.line}" if s.record.get("id") is None else str(s.record["id"]) for s in spans]
        yield pa.RecordBatch.from_pydict(
            {"id": ids, "text": [s.text for s in spans], "lang": [s.lang for s in spans]},
            schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())]),
        )


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _row_group_plan(path: Path, metadata: pq.FileMetaData, g: int, columns: list[str], size: int,
                    limits: ReadLimits) -> tuple[int, bool]:
    """(rows per batch, whether DELTA_BYTE_ARRAY pages are read) for row group `g`, once its span columns are checked from the footer, before reading.

    A few KB of compressed Parquet can hold gigabytes: a row group's span columns may hold at most
    ``max_document_bytes`` (uncompressed pages). Decoded values can still outgrow the pages: a
    dictionary repeats one value in every row (read as a DictionaryArray and checked before it is
    decoded, `_checked_batch`), and DELTA_BYTE_ARRAY repeats a prefix, so a row group with that
    encoding is read in batches of at most max_document_bytes / (its page bytes) rows, each value being
    no longer than its pages."""
    group = metadata.row_group(g)
    chunks = [group.column(c) for c in range(group.num_columns) if group.column(c).path_in_schema in columns]
    total = sum(chunk.total_uncompressed_size for chunk in chunks)
    if total > limits.max_document_bytes:
        raise InputFormatError(f"{path} row group {g + 1}",
                               f"at most {limits.max_document_bytes:,} bytes of spans per row group (uncompressed)",
                               f"{total:,} bytes", fix="write the shard with smaller row groups, or raise --max-document-bytes")
    delta = [chunk.total_uncompressed_size for chunk in chunks if "DELTA_BYTE_ARRAY" in chunk.encodings]
    return (max(1, min(size, limits.max_document_bytes // max(delta))), True) if delta else (size, False)


def _checked_batch(path: Path, batch: pa.RecordBatch, row: int, limits: ReadLimits) -> pa.RecordBatch:
    """The batch with its text columns decoded, each value checked against ``max_line_bytes`` (a value is
    capped like a JSONL line) and each column's batch against ``max_document_bytes``, before decoding."""
    arrays = []
    for array, field in zip(batch.columns, batch.schema):
        if not _is_text(field.type):
            arrays.append(array)
            continue
        if pa.types.is_dictionary(field.type):
            lengths = pc.take(pc.binary_length(array.dictionary), array.indices)
        else:
            lengths = pc.binary_length(array)
        lengths = pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False)
        over = np.flatnonzero(lengths > limits.max_line_bytes)
        if over.size:
            i = int(over[0])
            raise InputFormatError(f"{path} row {row + i + 1}", f"a {field.name} of at most {limits.max_line_bytes:,} bytes",
                                   f"{int(lengths[i]):,} bytes", fix="raise --max-line-bytes if this value is genuine")
        if int(lengths.sum()) > limits.max_document_bytes:
            raise InputFormatError(f"{path} rows {row + 1}-{row + len(lengths)}",
                                   f"at most {limits.max_document_bytes:,} bytes of {field.name} per {len(lengths):,} rows",
                                   f"{int(lengths.sum()):,} bytes", fix="raise --max-document-bytes if these texts are genuine")
        arrays.append(array.dictionary_decode() if pa.types.is_dictionary(field.type) else array)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _parquet_batches(shard: Shard, size: int, limits: ReadLimits) -> Iterator[pa.RecordBatch]:
    path = shard.source
    with native_read(path, "a Parquet file of spans"):
        handle = pq.ParquetFile(path)
    fields = {f.name: f.type for f in handle.schema_arrow}
    wanted = {"text": "a string", "lang": "a string", "id": "a string or integer"}
    if "text" not in fields:
        raise InputFormatError(path, "a column 'text'", f"columns {sorted(fields)}")
    for column, expected in wanted.items():
        kind = fields.get(column)
        if kind is not None and not (_is_text(kind) or (column == "id" and pa.types.is_integer(kind))):
            raise InputFormatError(path, f"column {column!r} of {expected} type", f"type {kind}")
    columns = [c for c in ("id", "text", "lang") if c in fields]
    text_columns = [c for c in columns if _is_text(fields[c])]
    row = 0
    with native_read(path, "a Parquet file of spans"):
        encoded = pq.ParquetFile(path, read_dictionary=text_columns)
        for g in range(handle.metadata.num_row_groups):
            rows, delta = _row_group_plan(path, handle.metadata, g, columns, size, limits)
            # read_dictionary cannot read DELTA_BYTE_ARRAY pages; those row groups come in small batches instead
            for batch in (handle if delta else encoded).iter_batches(batch_size=rows, row_groups=[g], columns=columns):
                batch = _checked_batch(path, batch, row, limits)
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
                yield pa.RecordBatch.from_pydict({"id": ids, "text": texts,
                                                  "lang": [x.strip() if x else None for x in langs]})
                row += len(texts)


def read_shard(shard: Shard, *, batch_size: int = BATCH, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[pa.RecordBatch]:
    """Checked batches (``id``, ``text``, ``lang``) of one shard; a span without an id gets ``<name>:<line/row>``.

    Whatever the file holds, a failure to read it (a truncated or non-gzip ``.gz``, an I/O error)
    is an `InputFormatError` naming it (`linker.fileio.read_failure`), never a traceback.
    """
    reader = _parquet_batches if shard.source.name.endswith(".parquet") else _jsonl_batches
    try:
        yield from reader(shard, batch_size, limits)
    except READ_ERRORS as exc:
        raise read_failure(exc, shard.source) from None


def file_sha256(path: Path) -> str:
    """sha256 of a shard's bytes: what ties an output shard to the input content it was linked from."""
    with native_read(path, "a readable shard"):
        return sha256_file(path)


# ----------------------------------------------------------------------------- one shard, exactly once


@register_writer("parquet", folder=False)
def write_parquet(tables: Iterable[pa.Table], output: Path, *, schema: pa.Schema) -> int:
    """Arrow tables into one Parquet file (a shard's temporary, under `atomic_file`), one write per table as they
    come, so that a shard's row groups are what its caller chose; the rows written."""
    rows = 0
    with pq.ParquetWriter(output, schema) as writer:
        for table in tables:
            writer.write_table(table)
            rows += table.num_rows
    return rows


def normalize_shard(linker: Linker, shard: Shard, *, k: int = 1, lang: str | None = None, batch_size: int = BATCH,
                    limits: ReadLimits = DEFAULT_LIMITS) -> dict:
    """Link one shard into its output Parquet file, atomically; return its counts.

    Two passes over the input, like `linker normalize`: the first checks every row (nothing is
    written if one is bad), the second links `batch_size` spans at a time. The output holds only
    what its input, the index and the options determine, so a re-run writes the same bytes. Its
    metadata records the input's size and sha256, taken before the first pass and checked again
    after the second: an input that changed meanwhile fails the shard instead of being half-linked.
    """
    size, digest = shard.source.stat().st_size, file_sha256(shard.source)
    spans = sum(batch.num_rows for batch in read_shard(shard, batch_size=batch_size, limits=limits))
    nil = 0
    metadata = {INPUT_NAME: shard.name, INPUT_BYTES: str(size), INPUT_SHA256: digest}
    schema = OUTPUT_SCHEMA.with_metadata(metadata)

    def tables() -> Iterator[pa.Table]:
        nonlocal nil
        pending: list[pa.RecordBatch] = []
        for batch in read_shard(shard, batch_size=batch_size, limits=limits):
            out = link_arrow(linker, batch, k=k, lang=lang)
            nil += nil_count(out)
            pending.append(out)
            if sum(b.num_rows for b in pending) >= ROW_GROUP:
                yield pa.Table.from_batches(pending)
                pending = []
        if pending or not spans:
            yield pa.Table.from_batches(pending, schema=schema)

    with atomic_file(shard.output) as tmp:
        WRITERS.get("parquet").write(tables(), tmp, schema=schema)
        if file_sha256(shard.source) != digest:  # raising here removes the temporary: no output
            raise InputFormatError(shard.source, "a shard that stays the same while it is linked",
                                   "a file that changed meanwhile", fix="run the same command again once it is written")
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
    # The columns too: shards written by a linker of other columns (before `decision`) are not resumed into one job.
    return {"index": {"name": Path(index).name, "manifest_sha256": index_hash(index)},
            "k": k, "lang": lang, "batch_size": batch_size, **options, "columns": OUTPUT_SCHEMA.names}


def job_inputs(index: str | Path, load_options: dict) -> list[Input]:
    """The folders a job reads besides its shards (`linker.normalize.linker_inputs` before loading): the
    index, a re-ranker folder, the index's encoder folder; no output may be, contain or lie inside one."""
    encoder = read_manifest(index).get("encoder")
    return [Input(Path(index), "--index"), *model_inputs(load_options.get("rerank"), "--rerank"),
            *model_inputs(encoder.get("path") if isinstance(encoder, dict) else None, "the index's encoder")]


def read_job(path: Path) -> dict:
    """An output folder's ``.linker-job.json``; a damaged one is one line naming it."""
    fix = "pass --overwrite to link the job afresh, or choose a new folder"
    if not path.is_file():  # a folder, a device or a dangling link where linker writes a file
        raise InputFormatError(path, "the job document linker wrote (a file)", "something else", fix=fix)
    try:
        size = path.stat().st_size
        if size > JOB_MAX_BYTES:
            raise InputFormatError(path, f"the job document linker wrote (at most {JOB_MAX_BYTES:,} bytes)",
                                   f"{size:,} bytes", fix=fix)
        job = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        message = " ".join(str(exc).split())[:200]
        raise InputFormatError(path, "the job document linker wrote (JSON)", f"{type(exc).__name__}: {message}",
                               fix=fix) from None
    if not isinstance(job, dict):
        raise InputFormatError(path, "the job document linker wrote (a JSON object)", type(job).__name__, fix=fix)
    return job


def _differences(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key))


def prepare_output(input_spec: str, output: str | Path, job: dict, *, overwrite: bool = False,
                   protected: Iterable[str | Path | Input] = ()) -> tuple[list[Shard], list[Shard]]:
    """(all shards, shards still to do) for a job, with the output folder made ready.

    A new folder gets linker's marker and the job document. A folder of an earlier run of the
    same job is resumed: its temporaries whose writer is dead are removed, its finished shards
    (written from inputs with today's content) are kept; one whose input is gone is refused, by
    name. A folder of a different job is refused, or emptied with `overwrite`. `protected`: other
    inputs (`job_inputs`), which the output may not equal, contain or lie inside either.
    """
    base, shards = list_shards(input_spec, output)
    out = Path(output)
    check_output(out, inputs=[base, *protected, *(s.source for s in shards)], overwrite=True, folder=True)
    job_file = out / JOB
    if out.is_dir() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        else:
            previous = read_job(job_file) if job_file.exists() or job_file.is_symlink() else None
            if previous != job:
                found = "another linker command's output" if previous is None else f"a run with {_differences(previous, job)}"
                raise ConfigError(f"--output {out} holds {found}; pass --overwrite to replace it, or choose a new folder")
    if not job_file.is_file():
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text(json.dumps({"written_by": "linker"}) + "\n", encoding="utf-8")
        with atomic_file(job_file) as tmp:
            tmp.write_text(json.dumps(job, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for folder in sorted({s.output.parent for s in shards}):
        remove_stale_temporaries(folder)
    orphans = _orphans(out, shards)
    pending = [s for s in shards if not _finished(s)]
    if pending or orphans:
        (out / SUCCESS).unlink(missing_ok=True)  # _SUCCESS only ever stands beside every shard of the input
    if orphans:
        shown = ", ".join(f"{rel} (from {name})" for rel, name in orphans[:3]) + (", ..." if len(orphans) > 3 else "")
        raise ConfigError(f"--output {out} holds {len(orphans)} output shard(s) whose input is gone: {shown}; "
                          "pass --overwrite to link the job afresh, or remove those files to keep the rest")
    return shards, pending


def _output_metadata(path: Path) -> dict[bytes, bytes] | None:
    """The metadata of an output shard, or None when it cannot be read (then it is written again)."""
    try:
        return pq.read_schema(path).metadata or {}
    except Exception as exc:  # noqa: BLE001 - ours, written atomically: damaged by someone else
        log.warning("%s: unreadable (%s); linking its shard again", path, " ".join(str(exc).split())[:200])
        return None


def _orphans(out: Path, shards: list[Shard]) -> list[tuple[str, str]]:
    """(output, the input it was linked from) of every output shard that no input shard gives any more."""
    expected = {s.output for s in shards}
    found = []
    for path in sorted(out.rglob("*.parquet")):
        if path in expected or not path.is_file() or is_temporary(path):
            continue
        metadata = _output_metadata(path) or {}
        found.append((path.relative_to(out).as_posix(), metadata.get(INPUT_NAME.encode(), b"?").decode("utf-8", "replace")))
    return found


def _finished(shard: Shard) -> bool:
    """An output exists (atomic_file: it is complete) and was written from an input with today's content."""
    if not shard.output.is_file():
        return False
    metadata = _output_metadata(shard.output)
    if metadata is None:
        return False
    if (metadata.get(INPUT_BYTES.encode()) == str(shard.source.stat().st_size).encode()
            and metadata.get(INPUT_SHA256.encode()) == file_sha256(shard.source).encode()):
        return True
    log.info("%s: changed since its output was written; linking it again", shard.source)
    return False


def write_success(output: str | Path, shards: list[Shard], job: dict) -> dict:
    """Write ``_SUCCESS`` (counts per shard and in all, the job) once every shard is done; return it."""
    out = Path(output)
    files = []
    for shard in shards:
        with native_read(shard.output, "a Parquet shard written by linker"):
            nil = nil_count(pq.read_table(shard.output, columns=["nil"]))
            metadata = pq.read_schema(shard.output).metadata or {}
        spans = pq.read_metadata(shard.output).num_rows
        files.append({"input": shard.name, "input_sha256": metadata.get(INPUT_SHA256.encode(), b"").decode(),
                      "output": shard.output.relative_to(out).as_posix(), "spans": spans, "linked": spans - nil, "nil": nil})
    spans = sum(f["spans"] for f in files)
    nil = sum(f["nil"] for f in files)
    manifest = {"written_by": "linker", "job": job, "shards": len(files), "spans": spans, "linked": spans - nil,
                "nil": nil, "files": files}
    with atomic_file(out / SUCCESS) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def failure_message(errors: list[tuple[str, str]], total: int) -> str:
    """One line for shards that failed: each one's error (file and line or row), the rest being done.

    Every failed shard is named: the first three with their error, any others by name."""
    shown = "; ".join(message for _, message in errors[:3])
    if len(errors) > 3:
        more = [name for name, _ in errors[3:]]
        shown += f"; and {len(more)} more: " + ", ".join(more[:20]) + (", ..." if len(more) > 20 else "")
    return (f"{len(errors)} of {total} shard(s) failed and have no output ({shown}); the others are written: "
            "fix the input and run the same command again to finish")


__all__ = [
    "JOB", "SHARD_SUFFIXES", "SUCCESS", "Shard", "confine_outputs", "failure_message", "file_sha256", "index_hash",
    "job_document", "job_inputs", "list_shards", "normalize_shard", "prepare_output", "read_job", "read_shard",
    "write_success",
]
