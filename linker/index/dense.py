"""Dense name index: encoder embeddings of dictionary names in FAISS, inner-product search.

Names are encoded with the passage role and mentions with the query role (e5 prompts), every
vector L2-normalised, so inner product = cosine. The float embeddings are always kept in
``dense/embeddings.npy``: they are the exact index for ``flat`` (rebuilt in memory on load, so
the disk holds them once) and the exact re-ranker for the compressed IVF kinds.

FAISS kinds:

- ``flat``: exact search (default). The lead measured ~220 queries/s over 1M x 384 on 2 cores.
- ``hnsw``: graph search over full vectors, scores exact, recall < 1 (M=32 measured by the lead
  at ~3k queries/s with recall@1 0.9 on 1M names).
- ``ivf-sq8`` / ``ivf-pq`` / ``ivf-pqfs``: inverted lists over 8-bit scalar / product-quantised codes, or
  4-bit product codes scanned with SIMD (FAISS "fast scan": 6x faster than ``ivf-pq`` over 5M names at the same
  code size, with higher recall; eval/scale/report.md); their candidates (`candidates`) are re-scored exactly
  against the float embeddings.

For the approximate kinds the build measures recall@1 and recall@10 against exact search on a
sample of the names encoded as queries, and records them in the parameters for the manifest.

``auto`` (the default) takes ``flat`` up to `AUTO_FLAT_MAX_NAMES` names and ``ivf-pqfs`` above,
where exact search gets slow and its vectors large (eval/scale/report.md); the manifest records the
kind chosen and why. Vectors are stored in ``float16`` for the IVF kinds (``storage`` auto): half
the disk and page cache, and the re-scoring reads them from a memory map, so a served index holds
in memory only the pages its queries touch.

Building is bounded in memory and resumable: names are encoded in chunks of similar length, each
written into a ``.npy`` memmap in a work folder whose ``progress.json`` lists the chunks done with the
sha256 of their vectors; a build interrupted after some chunks encodes only the others when it runs
again with the same names and encoder (a listed chunk whose vectors no longer hash to its sha256 is
encoded again). Chunks are encoded here or, with ``engine="ray"``, by Ray actors
(`linker.engine.encode`); either way the driver writes them, so a killed driver or a lost worker
costs only the chunks in flight.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import logging
import math
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from linker.encoders import check_compile_choice, should_compile
from linker.errors import ConfigError, IndexMismatchError, InputFormatError, UnknownNameError
from linker.extras import check as check_extra, require
from linker.progress import bar, note
from linker.fileio import native_read
from linker.folders import LARGE_MAX_BYTES, folder_file, read_folder_json
from linker.index import NameIndexBase
from linker.index.manifest import read_folder_array, typed_parameters
from linker.index.options import option
from linker.precision import available_cpus, check_precision, in_threads, resolve_precision, thread_budget
from linker.registry import Registry

log = logging.getLogger(__name__)
DENSE_MODULES = ("torch", "sentence_transformers", "faiss")  # the `dense` extra
# What loading a dense index for queries imports, preloaded while its files are checked (`linker.index.IndexKind`):
# the numpy runtime's tokenizer (`linker.runtime`). torch comes in only for models that runtime does not run, and
# FAISS only for the non-flat kinds: importing them in the background slowed the first answer of every other index.
QUERY_MODULES = ("tokenizers",)

FAISS_KINDS = ("flat", "hnsw", "ivf-sq8", "ivf-pq", "ivf-pqfs")
# `faiss_kind="auto"`: flat (exact) up to this many names, ivf-pqfs with exact re-scoring above. On 2 cores a flat
# search over 200,000 names answers ~1,000 queries/s, about what the encoder does (eval/scale/report.md).
AUTO_FLAT_MAX_NAMES = 200_000
STORAGES = ("auto", "fp32", "fp16")  # dtype of dense/embeddings.npy; auto = fp16 for the IVF kinds, fp32 otherwise
SUBDIR = "dense"
EMBEDDINGS = f"{SUBDIR}/embeddings.npy"
FAISS_FILE = f"{SUBDIR}/index.faiss"
PARAMS = f"{SUBDIR}/params.json"
PROGRESS = "progress.json"
WORK_EMBEDDINGS = "embeddings.npy"
STORED_FP16 = "embeddings-fp16.npy"
STORAGE_DTYPES = {"fp32": np.float32, "fp16": np.float16}
# Tokens per batch of a build (padding included): a quarter of `linker.encoders.TOKEN_BUDGET`. A batch's feed-forward
# activations (2,048 x 1,536 float32, 12.6 MB) then stay in a 32 MB L3 cache, and batches cut from names of similar
# length pad less (5% of the tokens against 14%). Default-dictionary names, linker-en fp32, alternating in one
# process: 165 names per CPU-second against 134 at 8,192, the same vectors within 3e-7 (docs/performance.md).
BUILD_TOKEN_BUDGET = 2048
MISSING_SCORE = -np.inf  # score reported beside row -1 (fewer than k names found)


@dataclass(frozen=True)
class DenseConfig:
    """Build (and search) parameters of a dense index; recorded in the manifest."""

    encoder: str = field(default="minilm", metadata=option(
        "--encoder", "dense/hybrid: encoder alias (minilm, e5-small), folder or hub name."))
    precision: str = field(default="auto", metadata=option(  # auto|fp32|bf16|int8 (linker.precision); recorded
        "--precision", "dense/hybrid: auto, fp32, bf16 or int8; auto = the fastest this CPU runs natively that passes "
                       "a check against fp32.", default="auto"))
    batch_size: int = field(default=512, metadata=option(  # most names per batch, filled by token_budget
        "--batch-size", "dense/hybrid: most names per encoding batch (batches are filled by tokens)."))
    token_budget: int = BUILD_TOKEN_BUDGET  # tokens per batch, padding included
    parity_sample: int = 512  # names encoded in fp32 and in the chosen precision to check it (0 = no check)
    compile: str = field(default="auto", metadata=option(  # auto: large CPU builds in bf16 (linker.encoders)
        "--compile", "dense/hybrid: torch.compile the encoder: auto (bf16 CPU builds of >= 20,000 names, with a C++ "
                     "compiler), on or off.", default="auto"))
    chunk_rows: int = 8192  # names encoded between two progress checkpoints (~12 MB at 384-d)
    faiss_kind: str = field(default="auto", metadata=option(  # auto: flat up to AUTO_FLAT_MAX_NAMES; recorded
        "--faiss", "dense/hybrid: FAISS index type: auto (default: flat up to 200,000 names, ivf-pqfs above), flat, "
                   "hnsw, ivf-sq8, ivf-pq, ivf-pqfs."))
    storage: str = field(default="auto", metadata=option(  # dtype of the stored vectors
        "--storage", "dense/hybrid: dtype of the stored name vectors: auto (default: fp16 for the IVF kinds, fp32 "
                     "otherwise), fp32, fp16."))
    engine: str = field(default="local", metadata=option(  # who encodes the chunks (`ENCODING_ENGINES`)
        "--engine", "dense/hybrid: who encodes the names: local (default, this process) or ray (Ray actors; "
                    "resumable)."))
    workers: int = field(default=0, metadata=option(  # 0 = one per CPU of the Ray cluster
        "--workers", "--engine ray: encoding actors (default: one per CPU of the Ray cluster)."))
    address: str = field(default="", metadata=option(  # "" = start a local Ray
        "--address", "--engine ray: the Ray cluster to join (default: start a local Ray)."))
    hnsw_m: int = 32  # the lead's 1M-name measurement: recall@1 0.9 at ~3k q/s
    hnsw_ef_construction: int = 80  # FAISS default 40; 80 buys recall for 2x build time
    hnsw_ef_search: int = 128
    ivf_nlist: int = 0  # 0 = 4 * sqrt(names) (FAISS rule of thumb), at most names / 39 (k-means minimum)
    # 64 lists probed and 8 candidates per wanted hit re-scored: chosen on the 313,349-name union with the lay and
    # NCBI development mentions (ivf-pq: recall@1 0.986 at 16 and 4, 0.995 at 64 and 8, 5,229 searches/s; eval/scale)
    ivf_nprobe: int = 64
    # Sub-quantisers; must divide the dimension. 0 = one byte of code per 8 dimensions: dim / 8 of 8 bits (ivf-pq),
    # dim / 4 of 4 bits (ivf-pqfs); 48 bytes a name at 384 dimensions.
    pq_m: int = 0
    pq_nbits: int = 8  # bits per ivf-pq sub-quantiser (ivf-pqfs: always 4, the only width fast scan has)
    rerank: bool = True  # re-score IVF candidates exactly from the float embeddings
    rerank_factor: int = 8  # extra candidates re-scored per wanted hit, for the first RERANK_HEAD hits
    recall_sample: int = 1000  # names used as queries to measure recall of approximate kinds
    threads: int = field(default=0, metadata=option("--threads"))  # torch and FAISS; 0 = their defaults (all cores)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.faiss_kind not in ("auto", *FAISS_KINDS):
            raise UnknownNameError("FAISS index kind", self.faiss_kind, ("auto", *FAISS_KINDS))
        if self.storage not in STORAGES:
            raise UnknownNameError("vector storage", self.storage, STORAGES)
        ENCODING_ENGINES.get(self.engine)  # an unknown engine names the registered ones
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0 (0 = one per CPU of the Ray cluster), found {self.workers}")
        if self.engine == "local" and (self.workers or self.address):
            raise ConfigError("workers and address are options of engine 'ray'; engine 'local' encodes in this process")
        check_precision(self.precision, allow_none=False)
        check_compile_choice(self.compile)
        positive = {
            "batch_size": self.batch_size, "token_budget": self.token_budget, "chunk_rows": self.chunk_rows, "hnsw_m": self.hnsw_m,
            "hnsw_ef_construction": self.hnsw_ef_construction, "hnsw_ef_search": self.hnsw_ef_search,
            "ivf_nprobe": self.ivf_nprobe, "rerank_factor": self.rerank_factor,
        }
        bad = {k: v for k, v in positive.items() if v < 1}
        if bad:
            raise ConfigError(f"dense index options must be >= 1, found {bad}")
        if self.ivf_nlist < 0 or self.pq_m < 0 or self.recall_sample < 0 or self.threads < 0 or self.parity_sample < 0:
            raise ConfigError("ivf_nlist, pq_m, recall_sample and threads must be >= 0 (0 = automatic / off / default)")
        if not 1 <= self.pq_nbits <= 16:
            raise ConfigError(f"pq_nbits must be in 1..16, found {self.pq_nbits}")

    @classmethod
    def from_dict(cls, params: dict) -> DenseConfig:
        """A recorded config; one written before precisions existed was encoded in fp32, one written
        before `auto` kinds and storages was flat and stored fp32."""
        return cls(**{"precision": "fp32", "faiss_kind": "flat", "storage": "fp32", **typed_parameters(cls, params)})

    def resolved(self, names: int) -> DenseConfig:
        """This config with `faiss_kind` and `storage` decided for an index of `names` names."""
        kind = self.faiss_kind
        if kind == "auto":
            kind = "flat" if names <= AUTO_FLAT_MAX_NAMES else "ivf-pqfs"
        storage = self.storage
        if storage == "auto":
            storage = "fp16" if kind.startswith("ivf") else "fp32"
        return replace(self, faiss_kind=kind, storage=storage)


def _names_key(names: Sequence[str], encoder) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode("utf-8", "surrogatepass") + b"\n")
    digest.update(f"{encoder.spec.name}\0{encoder.spec.revision}\0{encoder.precision}".encode())
    return digest.hexdigest()


def _set_threads(threads: int) -> None:
    if threads:
        faiss = require("faiss", extra="dense", what="a dense index")
        torch = require("torch", extra="dense", what="a dense index")

        faiss.omp_set_num_threads(threads)
        torch.set_num_threads(threads)


STAT_FIELDS = ("tokens", "padded_tokens", "truncated", "tokenize_seconds", "longest")


class LocalEncoding:
    """Encodes chunks in this process with `encoder` (`encode_names`' default runner)."""

    def __init__(self, encoder, *, batch_size: int, token_budget: int) -> None:
        self.encoder, self.batch_size, self.token_budget = encoder, batch_size, token_budget

    def run(self, jobs, advance: Callable[[int], None]):
        """For each (chunk, texts) of `jobs`: (chunk, passage vectors, encoding stats), in order."""
        for chunk, texts in jobs:
            vectors = self.encoder.encode(texts, role="passage", batch_size=self.batch_size,
                                          token_budget=self.token_budget, progress=advance)
            stats = self.encoder.last_stats
            yield chunk, vectors, {field: getattr(stats, field) for field in STAT_FIELDS}


def local_encoding(encoder, config: DenseConfig) -> LocalEncoding:
    """The ``local`` engine: the build's own process encodes, in the config's batches."""
    return LocalEncoding(encoder, batch_size=config.batch_size, token_budget=config.token_budget)


# Who encodes a build's chunks, by `DenseConfig.engine`: name -> (encoder, config) -> a runner like `LocalEncoding`
# (``run(jobs, advance)`` yields (chunk, vectors, stats); ``describe()``, where it has one, goes into the manifest).
# An engine above the index layer registers itself when its module is imported (``ray``: `linker.engine.encode`).
# The registry's loader imports `ENGINE_MODULES` by name before the first read, as `linker.sources` loads its
# readers, so that this module never imports them.
ENGINE_MODULES = ("linker.engine.encode",)


def _load_engines() -> None:
    for module in ENGINE_MODULES:
        importlib.import_module(module)


ENCODING_ENGINES: Registry[Callable[..., LocalEncoding]] = Registry("encoding engine", load=_load_engines)
ENCODING_ENGINES.register("local", local_encoding)


def length_chunks(names: Sequence[str], chunk_rows: int) -> list[np.ndarray]:
    """Name rows in chunks of `chunk_rows`, by length (characters) across the whole list, so that each chunk holds
    names of similar length and its batches pad little; rows sorted within a chunk (the memmap is written front to
    back). The chunking depends only on the names, so a resumed or distributed build encodes the same chunks."""
    n = len(names)
    order = np.argsort(np.fromiter((len(x) for x in names), dtype=np.int64, count=n), kind="stable")
    return [np.sort(order[start : start + chunk_rows]) for start in range(0, n, chunk_rows)]


def encode_names(
    names: Sequence[str],
    encoder,
    work_dir: Path,
    *,
    batch_size: int = 512,
    token_budget: int = BUILD_TOKEN_BUDGET,
    chunk_rows: int = 8192,
    show_progress: bool | None = None,
    progress: Callable[[int], None] | None = None,
    runner=None,
) -> tuple[np.memmap, dict]:
    """Encode `names` (passage role) into ``work_dir/embeddings.npy``, resuming a partial run.

    Chunks come from `length_chunks`; `runner` encodes them (`LocalEncoding` with `encoder` when None;
    `ENCODING_ENGINES`' ``ray``, `linker.engine.encode.RayEncoding`, spreads them over Ray actors). After each chunk the memmap is
    flushed and ``progress.json`` lists the chunks done with the sha256 of their vectors; a rerun with the
    same names, encoder and chunk size (same key) encodes only the others and the listed chunks whose vectors do
    not hash to their sha256 (`_verified_chunks`). Returns the memmap (read-only) and the encoding
    figures (tokens, truncated names, names/s).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    n, dim = len(names), encoder.dim
    key = _names_key(names, encoder)
    progress_path, path = work_dir / PROGRESS, work_dir / WORK_EMBEDDINGS
    chunks = length_chunks(names, chunk_rows)
    fingerprint = {"key": key, "rows": n, "dim": dim, "chunk_rows": chunk_rows}
    vectors, done = _work_vectors(work_dir, fingerprint, chunks)
    start_rows = sum(len(chunks[c]) for c in done)
    reporter = bar(n, initial=start_rows, desc="encoding names", unit="name", show=show_progress)

    def advance(count: int) -> None:  # after each batch, so the progress moves every few seconds
        reporter.update(count)
        if progress is not None:
            progress(count)

    runner = runner or LocalEncoding(encoder, batch_size=batch_size, token_budget=token_budget)
    jobs = ((c, [names[i] for i in chunks[c]]) for c in range(len(chunks)) if c not in done)  # texts made lazily
    totals = {"tokens": 0, "padded_tokens": 0, "truncated": 0, "longest": 0, "tokenize_seconds": 0.0}
    started = time.perf_counter()
    for chunk, encoded, stats in runner.run(jobs, advance):
        encoded = np.ascontiguousarray(encoded, dtype=np.float32)
        vectors[chunks[chunk]] = encoded
        for field in ("tokens", "padded_tokens", "truncated", "tokenize_seconds"):
            totals[field] += stats[field]
        totals["longest"] = max(totals["longest"], stats["longest"])
        vectors.flush()
        release(vectors)
        _trim_heap()
        done[chunk] = hashlib.sha256(encoded).hexdigest()  # the bytes just written, as `_chunk_digest` reads them
        tmp = progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**fingerprint, "done": {str(c): done[c] for c in sorted(done)}}), encoding="utf-8")
        os.replace(tmp, progress_path)
    reporter.close()
    del vectors
    seconds = time.perf_counter() - started
    figures = {
        "names_encoded": n - start_rows, "resumed_at": start_rows, "max_length": encoder.max_length, **totals,
        "tokenize_seconds": round(totals["tokenize_seconds"], 3),
        "names_per_second": round((n - start_rows) / max(seconds, 1e-9), 1),
        "compiled": bool(getattr(encoder, "compiled", False)),  # False also when compiling failed and eager ran
        "engine": getattr(runner, "describe", lambda: {"engine": "local"})(),
    }
    if totals["truncated"]:
        log.warning("%d of %d names were longer than the encoder's %d tokens and were truncated",
                    totals["truncated"], n, encoder.max_length)
    return np.load(path, mmap_mode="r"), figures


def _work_vectors(work_dir: Path, fingerprint: dict, chunks: list[np.ndarray]) -> tuple[np.memmap, dict[int, str]]:
    """`encode_names`'s memmap of the vectors and the chunks already done in it (chunk -> sha256 of its vectors as
    written): a partial run's when ``progress.json`` has the same `fingerprint` (names key, rows, dim, chunk rows)
    and its chunks verify, else a new file and none."""
    progress_path, path = work_dir / PROGRESS, work_dir / WORK_EMBEDDINGS
    n, dim = fingerprint["rows"], fingerprint["dim"]
    done: dict[int, str] = {}
    vectors = None
    if progress_path.is_file() and path.is_file():
        try:
            saved = json.loads(progress_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            saved = {}
        if isinstance(saved, dict) and all(saved.get(field) == value for field, value in fingerprint.items()):
            vectors = _open_work_vectors(path, n, dim)
        if vectors is not None:
            done = _verified_chunks(vectors, chunks, saved.get("done"), progress_path)
            log.info("resuming dense encoding in %s: %d of %d chunks done", work_dir, len(done), len(chunks))
    if not done:
        del vectors  # a mapping of the old file, if any, before it is replaced
        progress_path.unlink(missing_ok=True)
        vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    return vectors, done


def _open_work_vectors(path: Path, n: int, dim: int) -> np.memmap | None:
    """The work folder's vectors, writable, when they are a float32 (n, dim) array; else None (start afresh)."""
    try:
        vectors = np.load(path, mmap_mode="r+", allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None
    return vectors if vectors.dtype == np.float32 and vectors.shape == (n, dim) else None


def _chunk_digest(vectors: np.ndarray, rows: np.ndarray) -> str:
    """sha256 of a chunk's vectors (float32, its rows in order)."""
    return hashlib.sha256(np.ascontiguousarray(vectors[rows], dtype=np.float32)).hexdigest()


def _verified_chunks(vectors: np.ndarray, chunks: list[np.ndarray], saved: object, progress_path: Path) -> dict[int, str]:
    """The chunks that ``progress.json`` lists as done whose vectors still hash to the sha256 recorded when they
    were written. progress.json is only a claim: a work folder altered after a kill (every chunk marked done, an
    old list without hashes, a chunk overwritten) would otherwise give an index of zero vectors that loads and
    answers. Any other listed chunk is logged and encoded again."""
    listed = saved if isinstance(saved, dict) else {str(c): None for c in saved} if isinstance(saved, list) else {}
    done, again = {}, []
    for name, digest in listed.items():
        chunk = int(name) if isinstance(name, str) and name.isascii() and name.isdigit() else -1
        if 0 <= chunk < len(chunks) and isinstance(digest, str) and _chunk_digest(vectors, chunks[chunk]) == digest:
            done[chunk] = digest
        else:
            again.append(name)
        release(vectors)  # a chunk's rows lie all over the file: one pass would leave all of it in this process's RSS
    if again:
        log.warning("%s: %d chunk(s) marked done do not match the sha256 recorded when they were written (%s); "
                    "encoding them again", progress_path, len(again), ", ".join(map(str, again[:5])))
    return done


def read_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]`` (any shape of row numbers). A memory-mapped ``.npy`` is read with pread, row by row, not
    through its mapping: the kernel maps 16 pages around every page a process touches, so re-scoring a short list
    through the mapping leaves the whole file in the server's resident memory after a few thousand queries
    (5M names: 3.8 GB). Read this way, the rows sit in the page cache (shared, reclaimable) and nowhere else."""
    if not (isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.flags.c_contiguous):
        return np.asarray(array[rows])
    unique, inverse = np.unique(rows.reshape(-1), return_inverse=True)
    size = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    fd = os.open(array.filename, os.O_RDONLY)
    try:
        pread, offset = os.pread, array.offset
        data = b"".join([pread(fd, size, offset + row * size) for row in unique.tolist()])
    finally:
        os.close(fd)
    found = np.frombuffer(data, dtype=array.dtype).reshape(len(unique), *array.shape[1:])
    return found[inverse].reshape(*rows.shape, *array.shape[1:])


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc): batches of every length leave the heap fragmented,
    and without this a build's resident memory grows with the number of names (2.5 GB at 313k, 1.7 at 120k)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def release(array: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process's resident memory (they stay in the page cache and the
    file). A pass over a mapped file leaves every page it touched counted in the process's RSS: a 5M-name build
    writes and reads GBs of vectors, and without this its RSS would grow by all of them (eval/scale/report.md)."""
    handle = getattr(array, "_mmap", None)  # numpy's own mmap of the file; None for an array in memory
    if handle is not None and hasattr(handle, "madvise"):
        handle.madvise(mmap.MADV_DONTNEED)


def exact_topk(queries: np.ndarray, embeddings: np.ndarray, k: int, block: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k over a (memmapped) matrix, block by block: bounded memory."""
    faiss = require("faiss", extra="dense", what="a dense index")

    q = len(queries)
    best_scores = np.full((q, k), MISSING_SCORE, dtype=np.float32)
    best_rows = np.full((q, k), -1, dtype=np.int64)
    for start in range(0, len(embeddings), block):
        chunk = np.ascontiguousarray(embeddings[start : start + block], dtype=np.float32)
        # k + 1: an exact tie at the k-th place is then broken by row, as in `search_vectors`.
        scores, rows = faiss.knn(queries, chunk, min(k + 1, len(chunk)), metric=faiss.METRIC_INNER_PRODUCT)
        rows = np.where(rows >= 0, rows + start, -1)
        best_scores, best_rows = _merge(best_scores, best_rows, scores, rows, k)
        release(embeddings)
    return best_scores, best_rows


# Names per block of `flat_search`, and the most (query, name) scores a block holds at once (32 MB of float32).
FLAT_BLOCK = 65536
FLAT_BLOCK_SCORES = 8 << 20


def flat_search(queries: np.ndarray, embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top k of each query over all rows of `embeddings` (FAISS's IndexFlatIP search, without
    FAISS), by (score desc, row asc): the products of a block of names with a block of queries in one BLAS call, then
    the k best of each query, rows tied with the k-th kept until the order by row settles them (FAISS orders a tie
    as its own rounding falls). Returns (scores (q, k) float32, rows (q, k) int64)."""
    q, n = len(queries), len(embeddings)
    k = min(k, n)
    best_scores = np.full((q, 0), MISSING_SCORE, dtype=np.float32)
    best_rows = np.zeros((q, 0), dtype=np.int64)
    step = max(1, FLAT_BLOCK_SCORES // FLAT_BLOCK)
    for start in range(0, n, FLAT_BLOCK):
        names = np.asarray(embeddings[start : start + FLAT_BLOCK], dtype=np.float32)  # (block, dim)
        found_scores, found_rows = [], []
        for first in range(0, q, step):
            scores = queries[first : first + step] @ names.T  # (queries, block)
            found = _top_with_ties(scores, k)
            found_scores.append(np.take_along_axis(scores, found, axis=1))
            found_rows.append(found + start)
        best_scores, best_rows = _merge(best_scores, best_rows, np.concatenate(found_scores),
                                        np.concatenate(found_rows), k)
    # The mapped pages are not released (`release`) here: every search reads them all, and dropping them made
    # each one fault the whole file in again (230 MB: 90 ms of a 120 ms search of the default index).
    return best_scores, best_rows


# Queries per call up to which a flat search of float32 vectors scans them once per query (`_scan`); from one more,
# FAISS's BLAS products over blocks of 1,024 names read them once for all the queries (`faiss.knn`). The default
# index (150,749 names), one thread: one query 12 ms by the scan, 44 by the products; 4 queries 10.4 ms a query by
# the products (bench/flat_search.py, eval/bench/flat_search.md).
SCAN_MAX_QUERIES = 2
# Names fetched past the k asked for: the margin that lets the exact re-scoring prove its top k complete.
FLAT_PAD = 16


def float32_dot_error(dim: int) -> float:
    """A bound on |float32 dot product - exact value| / (|q| |x|) for vectors of `dim` float32 values, summed in any
    order, fused or not: gamma_dim = dim u / (1 - dim u), u = 2^-24 (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.1), doubled for safety, plus the rounding of `exact_scores`' own float32 result."""
    unit = 2.0 ** -24
    return 2 * dim * unit / (1 - dim * unit) + 2 * unit


def float16_scan_slack(dim: int, query_norms: np.ndarray, max_norm: float) -> np.ndarray:
    """A bound on |q . x - the float32 inner product of q with x rounded to float16| for rows x of norm at most
    `max_norm` (`HalfScan`'s pass). Rounding moves a value by at most 2^-11 of itself (2^-10 here, so that an encoder
    that truncates is covered too), or by 2^-24 below float16's normal range; summed over the products, that is at
    most 2^-10 |q| |x| + 2^-24 sqrt(dim) |q| (Cauchy-Schwarz), and the float32 sum adds `float32_dot_error` of
    |q| |x rounded|."""
    unit, subnormal = 2.0 ** -10, 2.0 ** -24 * math.sqrt(dim)
    rounded_norm = max_norm * (1 + unit) + subnormal
    return query_norms * (unit * max_norm + subnormal + float32_dot_error(dim) * rounded_norm)


def max_row_norm(embeddings: np.ndarray, block: int = 65536) -> float:
    """The largest L2 norm of a row of `embeddings` (one pass, block by block)."""
    top = 0.0
    for start in range(0, len(embeddings), block):
        names = np.asarray(embeddings[start : start + block], dtype=np.float32)
        top = max(top, float(np.sqrt(np.einsum("ij,ij->i", names, names, dtype=np.float64).max(initial=0.0))))
    return top


def exact_flat_topk(queries: np.ndarray, embeddings: np.ndarray, k: int, *, max_norm: float, use_faiss: bool = True,
                    scan_max_queries: int = SCAN_MAX_QUERIES, half: HalfScan | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The top k names of each query by (`exact_scores` desc, row asc) over all rows of `embeddings`: proved, not
    hoped. Candidates come from a float32 pass over float32 vectors with FAISS (`_scan` for up to `scan_max_queries`
    queries, `faiss.knn`'s BLAS products for more), or numpy's BLAS products (`flat_search`: without `use_faiss`, and
    for float16 vectors); k + `FLAT_PAD` of them, re-scored exactly. A query's answer is kept when its k-th exact
    score beats the best that any name left out could reach: the last fetched float32 score plus the float32 pass's
    rounding bound (`float32_dot_error` x |q| x `max_norm`). Otherwise it fetches four times as many, up to every
    name. So the answer is the same whatever the processor's kernels and their rounding (an AVX-512 BLAS once broke
    a tie that AVX2 did not), and whichever pass found the candidates. With `half` (float16 copies of the rows), up
    to `scan_max_queries` queries are scanned over those copies instead, under the wider bound of their rounding
    (`float16_scan_slack`).
    Returns (scores (q, k) float32, rows (q, k) int64; row -1 beyond the names)."""
    n, q = len(embeddings), len(queries)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    out_scores = np.full((q, k), MISSING_SCORE, dtype=np.float32)
    out_rows = np.full((q, k), -1, dtype=np.int64)
    if n == 0 or q == 0:
        return out_scores, out_rows
    query_norms = np.linalg.norm(queries.astype(np.float64), axis=1)
    float32_slack = float32_dot_error(queries.shape[1]) * query_norms * max_norm
    float16_slack = None if half is None else float16_scan_slack(queries.shape[1], query_norms, max_norm)
    use_faiss = use_faiss and embeddings.dtype == np.float32 and embeddings.flags.c_contiguous
    pending, fetch = np.arange(q), min(n, k + FLAT_PAD)
    while len(pending):
        slack = float32_slack
        if half is not None and len(pending) <= scan_max_queries:
            approx, rows = half.search(queries[pending], fetch)
            slack = float16_slack
        elif use_faiss and len(pending) <= scan_max_queries:
            approx, rows = _scan(queries[pending], embeddings, fetch)
        elif use_faiss:  # BLAS products: the index set FAISS's `distance_compute_blas_threshold` to 1
            faiss = require("faiss", extra="dense", what="a dense index")
            approx, rows = faiss.knn(queries[pending], embeddings, fetch, metric=faiss.METRIC_INNER_PRODUCT)
        else:
            approx, rows = flat_search(queries[pending], embeddings, fetch)
        scores, rows = sort_hits(exact_scores(queries[pending], embeddings, rows), rows, k)
        # Every name left out scored at most approx[:, -1] in the pass, so at most that plus its slack exactly.
        proved = np.ones(len(pending), bool) if fetch >= n else scores[:, k - 1] > approx[:, -1] + slack[pending]
        out_scores[pending[proved]], out_rows[pending[proved]] = scores[proved], rows[proved]
        pending, fetch = pending[~proved], min(n, fetch * 4)
    return out_scores, out_rows


# Rows from which a scan is cut into one block per core (`_scan`), no block under half of it. The scan is bound by
# memory more than by arithmetic, so a second core gains far less than twice: on the default index (150,749 names,
# 2 cores) 9.05 -> 7.61 ms a scan, a one-mention `Linker.link` 44.4 -> 41.7 ms; blocks of 8,192 rows still gained
# 1.26x over one (eval/bench/flat_search.md, `python -m bench.flat_search`).
SCAN_SPLIT_ROWS = 16_384


def _scan_blocks(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) row blocks of a scan of n rows: `parts` of them (one per thread that will scan them), none
    smaller than half of `SCAN_SPLIT_ROWS`."""
    parts = max(1, min(parts, n // (SCAN_SPLIT_ROWS // 2)))
    bounds = [n * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _scan(queries: np.ndarray, embeddings: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's m best float32 inner products (scores desc), by FAISS's SIMD inner products of one vector with
    every row (`fvec_inner_products_ny`, no copy of the mapped rows) and a partial sort. FAISS's own
    choice between this scan and BLAS products (`distance_compute_blas_threshold`) is process-wide and its meaning
    has changed between versions; here the choice is per call (`SCAN_MAX_QUERIES`). The scan reads every row, and
    one core alone does not reach the memory's bandwidth: the rows are cut into one block per core (`_scan_blocks`),
    the calling thread and kept threads scanning them (`linker.precision.in_threads`; FAISS releases the GIL), no
    more blocks than FAISS may use threads (`omp_set_num_threads`: a dense index's `threads`). Each row's product
    is the same kernel's whichever block holds it: the scores are bit for bit those of one pass."""
    faiss = require("faiss", extra="dense", what="a dense index")
    n, dim = embeddings.shape
    scores = np.empty(n, dtype=np.float32)
    out_scores, out_rows = np.empty((len(queries), m), np.float32), np.empty((len(queries), m), np.int64)
    # One block per core this thread may use (`thread_budget`); the index's `threads`, when set, bound FAISS's too.
    blocks = _scan_blocks(n, thread_budget(faiss.omp_get_max_threads()))

    def block(query: np.ndarray, start: int, end: int) -> None:
        faiss.fvec_inner_products_ny(faiss.swig_ptr(scores[start:end]), faiss.swig_ptr(query),
                                     faiss.swig_ptr(embeddings[start:end]), dim, end - start)

    for i, query in enumerate(queries):
        in_threads(lambda rows: block(query, *rows), blocks, len(blocks))  # noqa: B023 - run before the next query
        top = top_m(scores, m)
        top = top[np.lexsort((top, -scores[top].astype(np.float64)))]
        out_scores[i], out_rows[i] = scores[top], top
    return out_scores, out_rows


# One-query scans an index makes before it keeps float16 copies of its rows for them (`HalfScan`): making them takes
# ~0.15 s and 2 bytes a value (110 MiB for the default index), which a service or a notebook regains within a few
# dozen mentions (~4 ms each), and a CLI call of a few phrases never would.
HALF_SCAN_AFTER = 16
# Rows whose norm exceeds this are not copied to float16 (its largest value is 65,504): the scan stays in float32.
HALF_MAX_NORM = 1e4


class HalfScan:
    """A flat index's rows as float16 copies, in FAISS scalar-quantizer indexes, one per block of `_scan_blocks`: a
    scan reads half the bytes of the float32 one, which is bound by memory. The default index, 2 cores: 8.77 -> 4.45
    ms a query (eval/bench/half_scan.md). `exact_flat_topk` re-scores its candidates from the float32 rows and proves
    them under the rounding's wider bound, so the answers are the float32 scan's, bit for bit."""

    def __init__(self, embeddings: np.ndarray, block: int = 65536) -> None:
        faiss = require("faiss", extra="dense", what="a dense index")
        n, dim = embeddings.shape
        # One block per core of the machine, not of the calling thread's share: the copies outlive this call.
        self.blocks = _scan_blocks(n, min(faiss.omp_get_max_threads(), available_cpus()))
        self.parts = []
        for start, end in self.blocks:
            part = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            for first in range(start, end, block):  # a block at a time: no float32 copy of the whole rows
                part.add(np.ascontiguousarray(embeddings[first : min(end, first + block)], dtype=np.float32))
            self.parts.append(part)

    def search(self, queries: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's m best inner products with the float16 rows (scores desc, then row), as `_scan` returns them."""
        faiss = require("faiss", extra="dense", what="a dense index")
        out_scores, out_rows = np.empty((len(queries), m), np.float32), np.empty((len(queries), m), np.int64)
        found: list = [None] * len(self.parts)

        def part(query: np.ndarray, i: int) -> None:
            scores, rows = self.parts[i].search(query[None], min(m, self.parts[i].ntotal))
            found[i] = (scores[0], rows[0] + self.blocks[i][0])

        for i, query in enumerate(queries):
            in_threads(lambda p: part(query, p), range(len(self.parts)),  # noqa: B023 - run before the next query
                       thread_budget(faiss.omp_get_max_threads()))
            scores, rows = sort_hits(np.concatenate([f[0] for f in found])[None],
                                     np.concatenate([f[1] for f in found])[None], m)
            out_scores[i], out_rows[i] = scores[0], rows[0]
        return out_scores, out_rows


SAMPLE = 64  # `top_m` reads every stride-th score, stride = n / (SAMPLE x m)


def top_m(scores: np.ndarray, m: int) -> np.ndarray:
    """Positions of the m largest of `scores` (any order; ties at the m-th: any of them). A partial sort of every
    score took 2.4 ms of a 13 ms scan of the default index. Instead: the m-th largest of every stride-th score is at
    most the m-th largest of all, so the scores at or above it hold the m largest, and only those (about n / `SAMPLE`
    of them) are partially sorted."""
    n = len(scores)
    if m >= n:
        return np.arange(n)
    stride = n // (SAMPLE * m)
    if stride > 1:
        sample = scores[::stride]
        floor = np.partition(sample, len(sample) - m)[len(sample) - m]
        kept = np.flatnonzero(scores >= floor)
        return kept[np.argpartition(scores[kept], len(kept) - m)[len(kept) - m :]]
    return np.argpartition(scores, n - m)[n - m :]


def _top_with_ties(scores: np.ndarray, k: int) -> np.ndarray:
    """Column numbers of each row's k largest scores, the lowest columns among those tied with the k-th: (rows, k)."""
    if scores.shape[1] <= k:
        return np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]  # each row's k-th largest
    rows, columns = np.nonzero(scores >= kth)  # k or more a row (ties with the k-th), by row then column
    order = np.lexsort((columns, -scores[rows, columns], rows))
    rows, columns = rows[order], columns[order]
    starts = np.searchsorted(rows, np.arange(len(scores)))
    rank = np.arange(len(rows)) - starts[rows]
    return columns[rank < k].reshape(len(scores), k)


def _merge(s1, r1, s2, r2, k):
    scores = np.concatenate([s1, s2], axis=1)
    rows = np.concatenate([r1, r2], axis=1)
    return sort_hits(scores, rows, k)


def exact_scores(vectors: np.ndarray, embeddings: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(q, k) float32 inner products of each query with its rows' name vectors (row -1: -inf).

    Each product of two float32 values is exact in float64, and each pair's products are summed by
    numpy's own reduction over the last axis, the same code for every row of the block: equal name
    vectors get bit-equal scores wherever they are stored and whatever the processor. (A batched
    matmul went to BLAS, whose AVX-512 kernels sum rows in an order that depends on the row's place
    in the block: equal copies came back a few ulps apart and their tie fell by position.)
    """
    safe = np.where(rows >= 0, rows, 0)
    queries = np.asarray(vectors, dtype=np.float64)
    scores = np.empty(rows.shape, dtype=np.float64)
    # In blocks of ~16k (query, name) pairs: the gathered float64 vectors of a block are ~50 MB, where all the
    # pairs of a widened search at once could take GBs.
    step = max(1, 16384 // max(1, rows.shape[1]))
    for start in range(0, len(rows), step):
        names = np.array(read_rows(embeddings, safe[start : start + step]), dtype=np.float64)  # (q, k, d), a copy
        names *= queries[start : start + step, None, :]
        scores[start : start + step] = names.sum(axis=-1)
    return np.where(rows >= 0, scores, MISSING_SCORE).astype(np.float32)


def sort_hits(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k per query, ordered by (score desc, row asc); missing hits (-1) last."""
    scores = np.where(rows < 0, MISSING_SCORE, scores).astype(np.float32)
    tie_rows = np.where(rows < 0, np.iinfo(np.int64).max, rows)
    order = np.lexsort((tie_rows, -scores.astype(np.float64)), axis=1)[:, :k]
    scores = np.take_along_axis(scores, order, axis=1)
    rows = np.take_along_axis(rows, order, axis=1)
    if scores.shape[1] < k:
        pad = k - scores.shape[1]
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=MISSING_SCORE)
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
    return scores, rows.astype(np.int64)


def _stored_fp16(embeddings: np.ndarray, work_dir: Path, block: int = 65536) -> np.memmap:
    """The float32 work vectors as a float16 ``.npy`` beside them, written block by block (never both in memory);
    a cosine moves by ~1e-4, below the gap between neighbours that re-scoring has to order."""
    path = work_dir / STORED_FP16
    stored = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=embeddings.shape)
    for start in range(0, len(embeddings), block):
        stored[start : start + block] = embeddings[start : start + block]
        stored.flush()
        release(stored)  # block by block: the pages written and read would otherwise all stay resident
        release(embeddings)
    del stored
    return np.load(path, mmap_mode="r")


RERANK_HEAD = 20  # hits with rerank_factor extra candidates each (`candidates`)
IVF_MAX_AUTO_LISTS = 4096  # k-means over more lists costs more than 2 cores can give a 5M-name build (eval/scale)
TRAIN_POINTS_PER_LIST = 64  # FAISS warns below 39 and samples at most 256


def _nlist(config: DenseConfig, n: int) -> int:
    # FAISS k-means wants >= 39 training points per centroid; fewer gives empty, useless lists. The rule of thumb
    # 4 * sqrt(n) is capped: k-means and assigning every vector cost names x lists x dimensions.
    nlist = config.ivf_nlist or min(int(round(4 * math.sqrt(n))), n // 39, IVF_MAX_AUTO_LISTS)
    return max(1, min(nlist, n))


def pq_shape(config: DenseConfig, dim: int) -> tuple[int, int]:
    """(sub-quantisers, bits each) of an ivf-pq or ivf-pqfs index of `dim` dimensions."""
    nbits = 4 if config.faiss_kind == "ivf-pqfs" else config.pq_nbits
    return config.pq_m or max(1, dim // nbits), nbits  # a byte of code per 8 dimensions


def candidates(config: DenseConfig, k: int) -> int:
    """IVF hits re-scored exactly for a search of k: each hit, and `rerank_factor` more for each of the first
    `RERANK_HEAD`. Quantised scores misorder neighbours that lie close together, so the head of the list needs many
    candidates; `linker.retrieve` fetches 40 names for 5 concepts and 160, 640 when it widens, and 8 candidates per
    name there re-scored 321, 1,281 and 5,121 rows a mention for little gain (ivf-pqfs over 5M names, development
    mentions: 300 -> 512 mentions/s, concept recall@1 0.996 -> 0.995 and @5 0.986 -> 0.980 against exact search;
    eval/scale/report.md)."""
    return k + config.rerank_factor * min(k, RERANK_HEAD)


def _build_faiss(embeddings: np.ndarray, config: DenseConfig, block: int = 8192):
    """The FAISS structure of `config.faiss_kind` (None for flat: the embeddings are the index)."""
    faiss = require("faiss", extra="dense", what="a dense index")

    n, dim = embeddings.shape
    kind = config.faiss_kind
    if kind == "flat":
        return None
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    else:
        nlist = _nlist(config, n)
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf-sq8":
            index = faiss.IndexIVFScalarQuantizer(
                quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
            )
        else:
            m, nbits = pq_shape(config, dim)
            if dim % m:
                raise ConfigError(f"pq_m={m} must divide the encoder dimension {dim} (e.g. {dim // 8})")
            if n < 2**nbits:
                raise ConfigError(
                    f"{kind} with {nbits}-bit codes needs at least {2**nbits} names to train, found {n}; "
                    "use a smaller pq_nbits or kind flat"
                )
            if kind == "ivf-pqfs":
                index = faiss.IndexIVFPQFastScan(quantizer, dim, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = config.seed
        # TRAIN_POINTS_PER_LIST per centroid (and enough for the PQ codebooks), sampled from the memmap: k-means cost
        # grows with the sample, and 64 points per list train as well as FAISS's 256 for a short list to re-score.
        sample_size = min(n, max(TRAIN_POINTS_PER_LIST * nlist, 2 ** pq_shape(config, dim)[1] * 40 if "pq" in kind else 0))
        rng = np.random.default_rng(config.seed)
        sample = np.sort(rng.choice(n, size=sample_size, replace=False))
        # One FAISS call with no progress of its own: say what is happening before it starts.
        log.info("training FAISS %s (%d lists) on %d of %d vectors", kind, nlist, sample_size, n)
        index.train(_rows_float32(embeddings, sample))
        _trim_heap()  # the freed sample (0.4 GB at 4,096 lists) goes back to the system before the lists fill
    with bar(n, desc=f"adding to FAISS {kind}", unit="vector") as reporter:
        for start in range(0, n, block):
            index.add(np.ascontiguousarray(embeddings[start : start + block], dtype=np.float32))
            reporter.update(min(block, n - start))
            release(embeddings)
    _tune(index, config)
    return index


def _rows_float32(embeddings: np.ndarray, rows: np.ndarray, block: int = 16384) -> np.ndarray:
    """``embeddings[rows]`` as one float32 array, filled block by block: the whole sample is never also held as
    float16 rows and their bytes (`read_rows`), which added 170 MB at 256,000 rows for a moment."""
    out = np.empty((len(rows), embeddings.shape[1]), dtype=np.float32)
    for start in range(0, len(rows), block):
        out[start : start + block] = read_rows(embeddings, rows[start : start + block])
    return out


def _tune(index, config: DenseConfig) -> None:
    if config.faiss_kind == "hnsw":
        index.hnsw.efSearch = config.hnsw_ef_search
    elif config.faiss_kind.startswith("ivf"):
        index.nprobe = config.ivf_nprobe


class DenseNameIndex(NameIndexBase):
    """Encoder + FAISS over dictionary names; `search` maps mentions to name rows.

    Rows are positions in the names list given to `build` (= concept table rows). Scores are
    cosines in [-1, 1]; a query gets fewer than k hits only when the index has fewer than k
    names (or an IVF probe finds fewer), shown as row -1 with score -inf.
    """

    kind = "dense"

    def __init__(self, encoder, config: DenseConfig, embeddings: np.ndarray, faiss_index=None, params: dict | None = None):
        self.encoder = encoder
        self.config = config
        self.embeddings = embeddings  # (n, dim) float32 or float16 (config.storage), usually a read-only memmap
        self.params = dict(params or {})
        # None for flat: `exact_flat_topk` searches the memory-mapped vectors directly. A FAISS IndexFlatIP held a
        # copy of them (230 MB for the default index, copied at every load) for the same products.
        self.faiss_index = faiss_index
        # Every dense search goes through FAISS (a flat one through `faiss.knn`, `exact_flat_topk`): imported here,
        # so that the service's inference threads limit its OpenMP and BLAS threads too (`_limit_math_threads`).
        faiss = require("faiss", extra="dense", what="a dense index")
        # FAISS's own searches (`faiss.knn`, an IVF index's centroids) by BLAS products, whatever the number of
        # queries: a flat search scans for few queries by itself (`exact_flat_topk`). The setting is process-wide.
        faiss.cvar.distance_compute_blas_threshold = 1
        self._max_norm: float | None = None  # the vectors' largest norm, for `exact_flat_topk`'s bound (first search)
        self._scans = 0  # one-query flat searches so far, until `HALF_SCAN_AFTER`
        self._half: HalfScan | None = None
        self._half_lock = threading.Lock()
        self._work_dir: tempfile.TemporaryDirectory | None = None  # owns a temporary build folder
        self._work_path: Path | None = None

    @property
    def size(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        encoder,
        config: DenseConfig,
        *,
        work_dir: Path | None = None,
        show_progress: bool | None = None,
        runner=None,
    ) -> DenseNameIndex:
        """Encode `names` and index them. `work_dir` holds the resumable embeddings (a temporary
        folder when None); keep it stable across runs to resume an interrupted build. `runner`
        encodes the chunks (`encode_names`; None = in this process)."""
        if len(names) == 0:
            raise ConfigError("a dense index needs at least one name, found none")
        _set_threads(config.threads)
        temporary = None
        if work_dir is None:
            temporary = tempfile.TemporaryDirectory(prefix="linker-dense-")
            work_dir = Path(temporary.name)
        started = time.perf_counter()
        requested = config.faiss_kind
        config = config.resolved(len(names))
        if config.precision != encoder.precision:  # the config records what the vectors were encoded in
            config = replace(config, precision=encoder.precision)
        embeddings, encoding = encode_names(
            names, encoder, Path(work_dir), batch_size=config.batch_size, token_budget=config.token_budget,
            chunk_rows=config.chunk_rows, show_progress=show_progress, runner=runner,
        )
        if config.storage == "fp16":
            embeddings = _stored_fp16(embeddings, Path(work_dir))
        encode_seconds = time.perf_counter() - started
        started = time.perf_counter()
        faiss_index = _build_faiss(embeddings, config)
        params = {
            "rows": len(names),
            "dim": int(embeddings.shape[1]),
            "faiss_kind": config.faiss_kind,
            "storage": config.storage,
            "encode_seconds": round(encode_seconds, 3),
            "faiss_seconds": round(time.perf_counter() - started, 3),
            "encoding": encoding,
        }
        if requested == "auto":
            params["faiss_kind_chosen"] = (f"auto: {len(names):,} names, "
                                           f"{'at most' if config.faiss_kind == 'flat' else 'more than'} "
                                           f"{AUTO_FLAT_MAX_NAMES:,}")
        if config.faiss_kind.startswith("ivf"):
            params["ivf_nlist"] = _nlist(config, len(names))
        if "pq" in config.faiss_kind:
            params["pq_m"], params["pq_nbits"] = pq_shape(config, int(embeddings.shape[1]))
        index = cls(encoder, config, embeddings, faiss_index, params)
        index._work_dir = temporary
        index._work_path = Path(work_dir)
        if config.faiss_kind != "flat" and config.recall_sample:
            index.params["recall"] = index.measure_recall(names, config.recall_sample)
        log.debug("dense index: %d names, %s, %s", len(names), config.faiss_kind, index.params)
        return index

    @classmethod
    def from_embeddings(cls, encoder, config: DenseConfig, embeddings: np.ndarray) -> DenseNameIndex:
        """An index over names already encoded by `encoder` (rows of `embeddings`), with the FAISS structure
        `config.faiss_kind` names: what `build` does after encoding (one encoding, several kinds compared)."""
        config = config.resolved(len(embeddings))
        return cls(encoder, config, np.asarray(embeddings, dtype=STORAGE_DTYPES[config.storage]),
                   _build_faiss(embeddings, config))

    def measure_recall(self, names: Sequence[str], sample: int, ks: tuple[int, ...] = (1, 10)) -> dict:
        """Recall of this (approximate) index against exact search on `sample` names (seeded)
        encoded with the query role; see `recall_against_exact`."""
        rng = np.random.default_rng(self.config.seed)
        picked = np.sort(rng.choice(len(names), size=min(sample, len(names)), replace=False))
        texts = [names[i] for i in picked]
        with bar(len(texts), desc="measuring recall: encoding sample queries", unit="query") as reporter:
            queries = self.encoder.encode(texts, role="query", batch_size=self.config.batch_size,
                                          token_budget=self.config.token_budget, progress=reporter.update)
        return recall_against_exact(self, queries, ks)

    def _half_scan(self, queries: int) -> HalfScan | None:
        """The float16 copies for a scan of `queries` queries, made at this index's `HALF_SCAN_AFTER`-th scan."""
        if (self._half is None and queries <= SCAN_MAX_QUERIES and self.embeddings.dtype == np.float32
                and self._max_norm <= HALF_MAX_NORM):
            with self._half_lock:  # one copy, whichever of the service's threads gets there
                self._scans += 1
                if self._half is None and self._scans >= HALF_SCAN_AFTER:
                    self._half = HalfScan(self.embeddings)
        return self._half

    @property
    def query_precision(self) -> str:
        return self.encoder.precision

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """(q, dim) L2-normalised query vectors, in the encoder's precision."""
        return self.encoder.encode(list(queries), role="query", batch_size=self.config.batch_size,
                                   token_budget=self.config.token_budget)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (q, k) float32, name rows (q, k) int64, -1 = none), by (score desc, row asc)."""
        return self.search_vectors(self.encode_queries(queries), k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search with already encoded (L2-normalised) query vectors."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, found {k}")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if len(vectors) == 0:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        if self.faiss_index is None:  # flat: exact, whatever the kernels' rounding
            if self._max_norm is None:
                self._max_norm = max_row_norm(self.embeddings)
            return exact_flat_topk(vectors, self.embeddings, k, max_norm=self._max_norm,
                                   half=self._half_scan(len(vectors)))
        rerank = self.config.rerank and self.config.faiss_kind.startswith("ivf")
        fetch = min(self.size, candidates(self.config, k) if rerank else k)
        # One extra hit so that ties at the k-th place are resolved by row, not by FAISS order.
        scores, rows = self.faiss_index.search(vectors, min(self.size, fetch + 1))
        if rerank:
            # Re-scored one pair at a time, equal vectors score equal and their tie goes by row.
            scores = exact_scores(vectors, self.embeddings, rows)
        return sort_hits(scores, rows, k)

    def save(self, folder: Path) -> dict:
        """Write ``dense/`` into `folder` (embeddings.npy, index.faiss for non-flat, params.json);
        return the parameters for the manifest."""
        faiss = require("faiss", extra="dense", what="a dense index")

        target = Path(folder) / SUBDIR
        target.mkdir(parents=True, exist_ok=True)
        source = Path(getattr(self.embeddings, "filename", "") or "")
        destination = Path(folder) / EMBEDDINGS
        if source.is_file() and self._work_path is not None and source.parent.resolve() == self._work_path.resolve():
            # Built in a work folder: move (a rename on one file system) instead of copying GBs.
            self.embeddings = None
            shutil.move(str(source), destination)
            (self._work_path / PROGRESS).unlink(missing_ok=True)
            self.embeddings = np.load(destination, mmap_mode="r")
        elif not (source.is_file() and source.resolve() == destination.resolve()):
            np.save(destination, np.asarray(self.embeddings, dtype=STORAGE_DTYPES[self.config.storage]))
        files = {"embeddings": EMBEDDINGS}
        if self.config.faiss_kind != "flat":
            faiss.write_index(self.faiss_index, str(Path(folder) / FAISS_FILE))
            files["faiss"] = FAISS_FILE
        spec = self.encoder.spec
        params = {
            **self.params,
            "files": files,
            "encoder": {"name": spec.name, "path": spec.path, "revision": spec.revision, "dim": self.encoder.dim},
            "config": asdict(self.config),
        }
        (Path(folder) / PARAMS).write_text(json.dumps(params, indent=2, ensure_ascii=False), encoding="utf-8")
        return params

    @classmethod
    def load(cls, folder: Path, params: dict | None = None, encoder=None, precision: str | None = None) -> DenseNameIndex:
        """Read ``dense/`` of `folder`; `params` defaults to its params.json, `encoder` to
        load_query_encoder(params' encoder name) in `precision` (None: the precision the index was
        encoded in, `linker.precision.resolve_precision`). Refuses an encoder other than the one
        it was built with."""
        folder = Path(folder)
        if params is None:
            params = read_folder_json(folder, PARAMS, what="dense index parameters (JSON)", fix=REBUILD)
        with native_read(folder / PARAMS, "dense index parameters with config, encoder, files, rows, dim", fix=REBUILD):
            config = DenseConfig.from_dict(params["config"])
            files, rows, dim, built = params["files"], int(params["rows"]), int(params["dim"]), params["encoder"]
            missing = [key for key in ("name", "revision", "dim") if key not in built]
            if missing:
                raise KeyError(f"encoder without {', '.join(missing)}")
            if not isinstance(files, dict) or not isinstance(files.get("embeddings"), str):
                raise TypeError(f"files {files!r}")
            if rows < 1 or dim < 1:
                raise ValueError(f"rows {rows} and dim {dim}, expected both >= 1")
        # Every file it names: inside the folder, a regular file of bounded size (linker.index.manifest).
        named = {key: folder_file(folder, name, max_bytes=LARGE_MAX_BYTES, what=f"the dense index's {key} file",
                                  named_by=f"{folder / PARAMS}: field 'files.{key}'", fix=REBUILD)
                 for key, name in files.items()}
        # Memory-mapped, its header checked against its size, every value finite (NaN scores would rank at random);
        # read before the encoder loads, so that a damaged folder is refused at once.
        embeddings = read_folder_array(folder, files["embeddings"], what="an .npy array of name embeddings",
                                       shape=(rows, dim), mmap=True, max_bytes=LARGE_MAX_BYTES, fix=REBUILD)
        if embeddings.dtype != STORAGE_DTYPES[config.storage]:
            raise InputFormatError(folder / files["embeddings"], f"{config.storage} name embeddings (its storage)",
                                   f"dtype {embeddings.dtype}", fix=REBUILD)
        faiss_index = None
        if "faiss" in files:
            faiss = require("faiss", extra="dense", what="a dense index")
            with native_read(folder / files["faiss"], "a FAISS index file", fix=REBUILD):
                # IVF lists are memory-mapped read-only (IO_FLAG_MMAP): the workers of a machine share their
                # pages; linker never adds to a loaded index. (FAISS 1.15 still reads HNSW/flat storage.)
                faiss_index = faiss.read_index(str(named["faiss"]), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
            if (faiss_index.ntotal, faiss_index.d) != (rows, dim):
                raise IndexMismatchError(f"{folder / files['faiss']}: {faiss_index.ntotal} vectors of {faiss_index.d} "
                                         f"dimensions, expected {rows} of {dim}; rebuild the index")
            _tune(faiss_index, config)
            if config.threads:
                faiss.omp_set_num_threads(config.threads)
        if encoder is None:
            from linker.encoders import load_query_encoder  # numpy for the shipped BERTs in fp32 (linker.runtime)

            encoder = load_query_encoder(_recorded_encoder(params["encoder"]), threads=config.threads or None,
                                         precision=resolve_precision(precision, recorded=config.precision))
        if encoder.precision != config.precision:
            log.info("%s: names encoded in %s, queries in %s", folder, config.precision, encoder.precision)
        if (encoder.spec.revision, encoder.dim) != (built["revision"], built["dim"]):
            raise IndexMismatchError(
                f"{folder}: built with encoder {built['name']!r} ({built['revision']}, {built['dim']}-d), "
                f"given {encoder.spec.name!r} ({encoder.spec.revision}, {encoder.dim}-d); load it with the same "
                "encoder or rebuild the index"
            )
        return cls(encoder, config, embeddings, faiss_index, {k: v for k, v in params.items() if k not in ("files", "encoder", "config")})


REBUILD = "rebuild it with `linker index build`"


def listed_params(folder: Path, manifest: dict) -> dict:
    """``dense/params.json`` of an index folder, every file it names listed in the manifest (so that `verify`
    checked its size and checksum: an unlisted file would be read unverified)."""
    params = read_folder_json(folder, PARAMS, what="dense index parameters (JSON)", fix=REBUILD)
    files, listed = params.get("files"), manifest.get("files")  # no 'files': a folder used on its own, not an index
    for key, name in (files.items() if isinstance(files, dict) and listed is not None else ()):
        if isinstance(name, str) and name not in listed:
            raise InputFormatError(folder / PARAMS, f"field 'files.{key}' naming one of the files the manifest lists",
                                   f"{name!r}, which the manifest does not list (its checksum is unknown)", fix=REBUILD)
    return params


def _recorded_encoder(built: dict) -> str:
    """The name to reload a recorded encoder by: as given at build time, or its absolute folder
    when the name was a relative path that does not resolve from here."""
    name = built["name"]
    base, _, pooling = name.rpartition("#") if name.endswith(("#cls", "#mean")) else (name, "", "")
    from linker.encoders import BUILTIN_ENCODERS

    if base in BUILTIN_ENCODERS or Path(base).exists() or not Path(built.get("path", "")).is_dir():
        return name
    return built["path"] + (f"#{pooling}" if pooling else "")


def recall_against_exact(index: DenseNameIndex, queries: np.ndarray, ks: tuple[int, ...] = (1, 10)) -> dict:
    """Recall@k: the share of the exact top k that the index's top k holds, averaged over queries.

    Ties count as hits: dictionaries repeat names under several concepts, and an approximate
    hit whose exact score equals the k-th exact score (within 1e-5, the float noise between
    FAISS kernels) is as good as the row exact search happened to pick.
    """
    k = min(max(ks), index.size)
    started = time.perf_counter()
    _, approx = index.search_vectors(queries, k)
    approx_seconds = time.perf_counter() - started
    exact_scores, _ = exact_topk(queries, index.embeddings, k)
    result = {"sample": int(len(queries))}
    for cutoff in ks:
        c = min(cutoff, k)
        hits = []
        for query, rows, best in zip(queries, approx[:, :c], exact_scores[:, :c], strict=True):
            found = np.sort(rows[rows >= 0])
            # pread, not the memory map: 10 rows a query through the map left ~64 KB of the file resident around
            # each (1M names: +635 MB, the FAISS stage's peak; eval/scale/report.md)
            true_scores = read_rows(index.embeddings, found).astype(np.float32) @ query
            hits.append(min(int(np.sum(true_scores >= best[-1] - 1e-5)), c) / c)
        result[f"recall_at_{cutoff}"] = round(float(np.mean(hits)), 4)
    result["approx_queries_per_s"] = round(len(queries) / max(approx_seconds, 1e-9), 1)
    return result


def partial_dir(parent: Path, names: Sequence[str], encoder) -> Path:
    """Stable work folder for resumable builds: beside the output, keyed by names + encoder."""
    return Path(parent) / f".dense-partial-{_names_key(names, encoder)[:16]}"


# The build-time check of a precision against fp32 on a sample of the index's own names. The bar is
# looser than the benchmark bar (top-1 agreement >= 99.5% on linking): here each name is a query
# against the other sampled names, whose nearest neighbours are often near-ties (a name and its
# plural), so a little agreement is lost to ties that linking never sees. Measured figures for
# MEDIC and ICD-O names are in eval/bench/bench_encode.md.
PARITY_MIN_AGREEMENT = 0.98
PARITY_MIN_COSINE = 0.99
# Two neighbours whose fp32 cosines differ by less than this are a tie: bf16's per-vector error
# (cosine 0.99999 to fp32, eval/bench/bench_encode.md) moves scores by up to ~1e-3.
PARITY_TIE = 1e-3


def precision_check(names: Sequence[str], reference, candidate, sample: int, seed: int = 0) -> dict:
    """Compare `candidate`'s vectors with `reference`'s (fp32) on a seeded sample of `names`.

    Figures: cosine between the two vectors of each name (passage role; mean and minimum) and the
    agreement of each sampled name's nearest other sampled name (query role against passages);
    the candidate's pick agrees when its fp32 cosine is within PARITY_TIE of fp32's best.
    """
    rng = np.random.default_rng(seed)
    picked = [names[i] for i in np.sort(rng.choice(len(names), size=min(sample, len(names)), replace=False))]
    started = time.perf_counter()
    ref_p, cand_p = (e.encode(picked, role="passage") for e in (reference, candidate))
    ref_q, cand_q = (e.encode(picked, role="query") for e in (reference, candidate))
    cosine = np.sum(ref_p * cand_p, axis=1)
    figures = {"sample": len(picked), "mean_cosine": round(float(cosine.mean()), 6),
               "min_cosine": round(float(cosine.min()), 6)}
    if len(picked) > 1:
        # (sample, sample) similarities; a name's own row is excluded (it would always agree)
        ref_s, cand_s = ref_q @ ref_p.T, cand_q @ cand_p.T
        np.fill_diagonal(ref_s, -np.inf)
        np.fill_diagonal(cand_s, -np.inf)
        chosen = ref_s[np.arange(len(picked)), cand_s.argmax(1)]  # fp32 cosine of the candidate's pick
        figures["top1_agreement"] = round(float(np.mean(chosen >= ref_s.max(1) - PARITY_TIE)), 4)
        figures["tie"] = PARITY_TIE
    figures["passed"] = bool(figures["min_cosine"] >= PARITY_MIN_COSINE
                             and figures.get("top1_agreement", 1.0) >= PARITY_MIN_AGREEMENT)
    figures["seconds"] = round(time.perf_counter() - started, 2)
    return figures


def precision_encoder(names: Sequence[str], config: DenseConfig):
    """Load the config's encoder in the precision to build with, and what decided it.

    ``auto`` takes the fastest precision this processor runs natively and checks it against fp32
    on `config.parity_sample` names; a failed check falls back to fp32. An explicit bf16/int8 is
    checked too (its figures recorded, a failure logged) but kept: the user asked for it.
    """
    from linker.encoders import load_encoder
    from linker.precision import native_precisions

    # int8 runs on the CPU: its fp32 reference is loaded there too, even where a GPU is present
    fp32 = load_encoder(config.encoder, threads=config.threads or None, device="cpu" if config.precision == "int8" else None)
    wanted = resolve_precision(config.precision, device=fp32.device)
    record = {"requested": config.precision, "chosen": wanted, "native": list(native_precisions(fp32.device))}
    compiled = should_compile(config.compile, len(names), wanted, fp32.device)
    if wanted == "fp32":
        return (fp32.compile() if compiled else fp32), record
    encoder = fp32.with_precision(wanted)
    if compiled:  # the check below then runs (and compiles) the very path the names are encoded with
        encoder = encoder.compile()
    if config.parity_sample:
        with note(f"checking {wanted} against fp32 on {min(config.parity_sample, len(names)):,} names"):
            check = precision_check(names, fp32, encoder, config.parity_sample, config.seed)
        record["check"] = check
        if not check["passed"]:
            if config.precision == "auto":
                log.warning("precision %s failed the check against fp32 (%s); building in fp32", wanted, check)
                record["chosen"] = "fp32"
                return fp32, record
            log.warning("precision %s failed the check against fp32 (%s); building in it as asked", wanted, check)
    log.info("dense index precision: %s", record)
    return encoder, record


def build_dense(names: Sequence[str], config: DenseConfig, folder: Path) -> dict:
    """Build and save the dense part of an index folder (dense and hybrid kinds); its manifest fields."""
    check_extra(DENSE_MODULES, extra="dense", what="a dense index")  # one line before any work
    # On Ray the actors encode (eagerly): the driver's encoder only checks the precision and measures recall, and
    # compiling it would cost the driver ~14 CPU-seconds for nothing.
    encoder, precision = precision_encoder(names, replace(config, compile="off") if config.engine == "ray" else config)
    work = partial_dir(Path(folder).parent, names, encoder)
    runner = ENCODING_ENGINES.get(config.engine)(encoder, config)
    index = DenseNameIndex.build(names, encoder, config, work_dir=work, runner=runner)
    index.params["precision"] = precision
    params = index.save(folder)
    shutil.rmtree(work, ignore_errors=True)
    return {"encoder": params["encoder"], "dense": {k: v for k, v in params.items() if k not in ("encoder", "config")}}


def dense_kind():
    """The ``dense`` entry of linker.index.KINDS."""
    from linker.index import IndexKind

    def load(folder: Path, config: DenseConfig, manifest: dict, precision: str | None = None):
        return DenseNameIndex.load(folder, listed_params(folder, manifest), precision=precision)

    return IndexKind("dense", DenseConfig, build_dense, load, DenseConfig.from_dict, preload=QUERY_MODULES)
