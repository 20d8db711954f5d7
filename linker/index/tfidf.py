"""Character n-gram tf-idf over dictionary names, with exact sparse cosine top-k.

The default is character trigrams inside word boundaries (``char_wb``, 3-3) over names and
mentions normalised as BioSyn does (lower case, punctuation to spaces): over NCBI-disease,
Cantemist, CodiEsp-D and Mantra it was the most accurate setting on average and visits about a
tenth of the postings of the Medical Crossing setting per query (eval/tfidf_defaults/tfidf_defaults.md, a study
now retired). That setting, character uni+bigrams as the Medical Crossing baseline
and BioSyn's sparse encoder used, stays available as the preset ``medical-crossing``.

The build counts n-grams chunk by chunk into one growing vocabulary, keeping per-name counts as
bytes, then writes idf-weighted, L2-normalised rows into the final arrays: peak memory stays near
the final matrix's size, where scikit-learn's ``fit_transform`` holds two or three copies of it.
The result equals ``TfidfVectorizer(...).fit_transform`` up to the order of the columns.

Persistence never pickles: the vocabulary is JSON, the idf vector ``.npy``, the name matrix a
scipy ``.npz`` of plain arrays (``scipy.sparse.load_npz`` reads it with ``allow_pickle=False``).
On load the vectoriser is rebuilt from vocabulary + idf, so queries are transformed exactly as
at build time. The ``.npz`` is written uncompressed with every array starting on a 64-byte
boundary of the file (`save_npz_aligned`), so that a load memory-maps the matrix read-only
(`load_npz_mapped`) instead of reading it: the workers of a node (Ray actors, service processes)
share its pages through the page cache. It stays a plain scipy ``.npz``; one written before
(unaligned) is read into memory as before. An index that searches with maxscore also stores that
search's postings and bounds (`POSTINGS`, one ``.npy`` per array), which a load maps and checks in
one pass instead of computing them (at 5M names that took the load's peak from 7.4 to 3.4 GB,
eval/scale/report.md); an index built before them computes them at load.

Search is `sparse_dot_topn.sp_matmul_topn` (a multi-threaded sparse product that keeps only the
top n per row; on one thread its OpenMP kernel, `sorted_top_n`), over chunks of queries so that memory stays bounded: a full scipy product
followed by a sort materialises every non-zero query-name score (measured by the lead on 200k
names: ~95 queries/s at 2.6 GiB, against ~600 queries/s at 0.3 GiB with sp_matmul_topn).
The names are searched in shards of `SHARD_NAMES`, so that the array in which the product accumulates
a query's scores stays small enough for the CPU cache; whether that pays off depended on the run on
the shared 2-core machine (eval/bench/bench_link.md compares it with one product over all names).

`TfidfConfig.search` picks the search: ``exact`` is that product; ``maxscore``
(`linker.index.maxscore`) gives the same top-k with certified early termination: it reads a
query's n-grams rarest first and stops reading when no name it has not seen can reach the k-th
score (given concept codes, the k-th concept's: `linker.retrieve` asks it for the top-k concepts
directly); ``auto`` (the default) is exact up to `exact_max_names` names and maxscore above;
``approximate`` (a lever kept for comparison): a query's n-grams found in more than
`candidate_df` of the names do not select candidates, the best-scoring names of the rest are
rescored exactly with the whole query. eval/bench/bench_link.md compares them.
A mention that shares no n-gram with the vocabulary has an all-zero vector and gets no
candidates (rows -1), never arbitrary ones.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zipfile
from array import array
from itertools import islice
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer
from sparse_dot_topn import _core as sparse_dot_topn_core
from sparse_dot_topn import sp_matmul_topn

from linker.errors import ConfigError, InputFormatError
from linker.index import NameIndexBase, maxscore
from linker.folders import LARGE_MAX_BYTES, folder_file, read_folder_json
from linker.index.manifest import npy_header, read_folder_array
from linker.index.tfidf_config import (  # noqa: F401 - the config, its names and presets, kept importable from here
    ANALYZERS, LEGACY_PARAMETERS, PRESETS, SEARCHES, TfidfConfig, config_from_manifest, get_preset)
from linker.progress import track
from linker.fileio import native_read
from linker.text import normalize
from linker.precision import thread_budget

log = logging.getLogger(__name__)

VOCABULARY = "tfidf/vocabulary.json"
IDF = "tfidf/idf.npy"
MATRIX = "tfidf/names.npz"
# maxscore's postings and bounds (`maxscore.Postings`), one .npy per array, and its block size: written at build time
# when the index searches with maxscore, mapped at load. An index built before them computes them at load.
POSTINGS = "tfidf/maxscore"
POSTINGS_PARAMS = "tfidf/maxscore/params.json"
MIN_ROWS_PER_THREAD = 8  # queries per extra sparse-product thread (see `search_vectors`)
BUILD_CHUNK = 8_192  # names analysed per step of the build: bounds its temporaries
SHARD_NAMES = 131_072  # names per product: a 512 KiB score accumulator (see the module docstring)
MIN_CANDIDATES = 64  # approximate search: names rescored per query, at least, and 4x the names asked for
MIN_RARE_NGRAMS = 3  # approximate search: a query's rarest n-grams that select candidates however common
# maxscore under a language mask (otherwise it searches concepts itself, `search_concepts`): names
# fetched per wanted concept before `linker.retrieve` widens. Its cost grows with the k it
# certifies (a lower k-th score prunes less), while widening repeats the search only for the
# queries whose names cover too few concepts.
MAXSCORE_FETCH_PER_CONCEPT = 2


def _vectorizer(config: TfidfConfig, vocabulary: dict[str, int] | None = None) -> TfidfVectorizer:
    # lowercase=False: linker.text.normalize already did it (the one normaliser of the project).
    return TfidfVectorizer(
        analyzer=config.analyzer,
        ngram_range=(config.ngram_min, config.ngram_max),
        lowercase=False,
        sublinear_tf=config.sublinear_tf,
        dtype=np.float32,
        vocabulary=vocabulary,
    )


def _fit_transform(names: Sequence[str], analyze, config: TfidfConfig
                   ) -> tuple[dict[str, int], np.ndarray, sp.csr_matrix]:
    """Vocabulary (n-gram -> column), idf and the L2-normalised tf-idf rows of `names`.

    Peak memory stays near the result's size (module docstring): the n-gram counts of each chunk
    of names are written straight into the final arrays, allocated once at an upper bound of the
    number of n-grams (the pages never written are never resident), then weighted and normalised
    in place.
    """
    width = config.ngram_max - config.ngram_min + 1
    # Per n, a text of L characters has at most 3L word-padded n-grams (L+2 per word of >= 1 character).
    capacity = width * 3 * (sum(map(len, names)) + len(names))
    indices = np.empty(capacity, dtype=np.int32)
    data = np.empty(capacity, dtype=np.float32)
    row_nnz = np.zeros(len(names), dtype=np.int64)
    vocabulary: dict[str, int] = {}
    lookup = vocabulary.get
    df = np.zeros(0, dtype=np.int64)  # names per n-gram
    position = 0
    # Counting n-grams is most of the build's time: its progress is the build's.
    stream = iter(track(names, total=len(names), desc="tf-idf n-grams", unit="name"))
    for start in range(0, len(names), BUILD_CHUNK):
        texts = [normalize(n, config.normalization) for n in islice(stream, BUILD_CHUNK)]
        lengths = np.empty(len(texts), dtype=np.int64)
        columns = array("i")  # 4 bytes an n-gram; a list of Python ints would take ten times that
        for i, text in enumerate(texts):
            grams = analyze(text)
            lengths[i] = len(grams)
            # Looked up in C first (map): after the first chunks almost every n-gram is known, and the per-n-gram
            # setdefault below was a third of a build (5M names: 121 s).
            ids = list(map(lookup, grams))
            if None in ids:
                ids = [vocabulary.setdefault(gram, len(vocabulary)) for gram in grams]
            columns.extend(ids)
        rows = np.repeat(np.arange(len(texts), dtype=np.int32), lengths)
        counts = sp.csr_matrix((np.ones(len(columns), dtype=np.float32), (rows, np.frombuffer(columns, dtype=np.int32))),
                               shape=(len(texts), len(vocabulary)))  # sums repeated n-grams of a name
        del columns, rows
        counts.sum_duplicates()
        df = np.concatenate([df, np.zeros(len(vocabulary) - len(df), dtype=np.int64)])
        df += np.bincount(counts.indices, minlength=len(vocabulary))  # per chunk: bincount makes int64 copies
        end = position + counts.nnz
        if end > capacity:  # normalisation lengthened the texts beyond the bound: grow (a copy, rare)
            capacity = 2 * end
            indices, data = np.resize(indices, capacity), np.resize(data, capacity)
        indices[position:end] = counts.indices
        data[position:end] = counts.data
        row_nnz[start : start + len(texts)] = np.diff(counts.indptr)
        position = end
    for _ in stream:  # ends the progress report (the generator closes its bar when exhausted)
        pass
    nnz = position
    indices, data = indices[:nnz], data[:nnz]
    # Smoothed idf as scikit-learn's TfidfTransformer computes it (smooth_idf=True).
    idf = np.log((1 + len(names)) / (1 + df)) + 1.0
    weights = idf.astype(np.float32)
    for first in range(0, nnz, BUILD_CHUNK * 64):  # in place, a slice at a time: no full-size temporary
        part = slice(first, min(nnz, first + BUILD_CHUNK * 64))
        if config.sublinear_tf:
            np.log(data[part], out=data[part])
            data[part] += 1
        data[part] *= weights[indices[part]]
    indptr = np.zeros(len(names) + 1, dtype=np.int32 if nnz < 2**31 else np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    _normalize_rows(data, indptr)
    matrix = sp.csr_matrix((len(names), len(vocabulary)), dtype=np.float32)
    # Set, not passed to the constructor: scipy copies a view of a larger buffer ("prunes" it).
    matrix.data, matrix.indices, matrix.indptr = data, indices.astype(indptr.dtype, copy=False), indptr
    return vocabulary, idf, matrix


def _normalize_rows(data: np.ndarray, indptr: np.ndarray, block: int = 8_192) -> None:
    """L2-normalise CSR rows in place, a block of rows at a time (scikit-learn's
    inplace_csr_row_normalize_l2 made a full-size temporary here)."""
    for first in range(0, len(indptr) - 1, block):
        last = min(len(indptr) - 1, first + block)
        values = data[indptr[first] : indptr[last]]
        counts = np.diff(indptr[first : last + 1])
        rows = np.repeat(np.arange(last - first), counts)
        norms = np.sqrt(np.bincount(rows, weights=values.astype(np.float64) ** 2, minlength=last - first))
        values /= np.where(norms > 0, norms, 1.0)[rows].astype(np.float32)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


@dataclass(frozen=True)
class SharedNgram:
    """One n-gram a mention shares with a name; `contribution` = mention weight x name weight."""

    ngram: str
    mention_weight: float
    name_weight: float
    contribution: float


def _best_per_query(query: np.ndarray, scores: np.ndarray, rows: np.ndarray, n: int, k: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score desc, row asc) of each query's (score, row) pairs: (scores (n, k), rows (n, k))."""
    order = np.lexsort((rows, -scores, query))
    query, scores, rows = query[order], scores[order], rows[order]
    starts = np.searchsorted(query, np.arange(n))
    rank = np.arange(len(query)) - starts[query]
    keep = rank < k
    out_scores = np.zeros((n, k), dtype=np.float32)
    out_rows = np.full((n, k), -1, dtype=np.int64)
    out_scores[query[keep], rank[keep]] = scores[keep]
    out_rows[query[keep], rank[keep]] = rows[keep]
    return out_scores, out_rows


_NPY_ALIGN = 64  # numpy pads an .npy header to a multiple of 64 bytes; the zip entry must start the same way
_ZIP64_EXTRA = 20  # zipfile adds this to a local header written with force_zip64
_PADDING_ID = 0x4C4B  # a private zip "extra field" id: readers skip extra fields they do not know
_MAP_MIN_BYTES = 1 << 16  # smaller arrays (format, shape, an empty matrix) are simply read


def save_npz_aligned(path: Path, matrix: sp.csr_matrix) -> None:
    """`scipy.sparse.save_npz(path, matrix, compressed=False)`, but each array's data starts on a
    64-byte boundary of the file (the zip local headers are padded), so that `load_npz_mapped`
    can map it in place. The file is an ordinary ``.npz`` that scipy and numpy read as before."""
    matrix = matrix.tocsr()
    arrays = {"indices": matrix.indices, "indptr": matrix.indptr, "format": np.array(b"csr"),
              "shape": np.array(matrix.shape), "data": matrix.data}  # save_npz's members, in its order
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array_ in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            header = archive.fp.tell() + 30 + len(info.filename) + _ZIP64_EXTRA  # the .npy starts here
            pad = -header % _NPY_ALIGN
            if pad:
                pad += _NPY_ALIGN if pad < 4 else 0  # an extra field needs 4 bytes of its own header
                info.extra = struct.pack("<HH", _PADDING_ID, pad - 4) + bytes(pad - 4)
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array_), allow_pickle=False)


# A vocabulary is read whole into a dict (its bound for a given idf is computed in `TfidfNameIndex.load`); a
# multilingual UMLS has a few million n-grams, some 100 MB of JSON.
VOCABULARY_MAX_BYTES = 1 << 30
_CSR_MEMBERS = ("format", "shape", "indptr", "indices", "data")
# Deflate cannot shrink data more than 1032-fold: a member that claims more was not written by numpy or
# scipy, and its claimed size would be allocated before the read finds out.
_DEFLATE_MAX_RATIO = 1032


def _member_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a CSR ``.npz``, every member's ``.npy`` header checked against its size first
    (`linker.index.manifest.npy_header`: no object arrays, no shape the member does not hold): large
    members of an uncompressed ``.npz`` whose data is aligned (`save_npz_aligned`) memory-mapped
    read-only, the others read (an ``.npz`` written by numpy or scipy themselves)."""
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        infos = archive.infolist()
        keys = [info.filename.removesuffix(".npy") for info in infos]
        if sorted(keys) != sorted(_CSR_MEMBERS):
            raise ValueError(f"members {', '.join(sorted(keys))[:120]}, expected {', '.join(sorted(_CSR_MEMBERS))}")
        for key, info in zip(keys, infos):
            where = f"{path} member {info.filename}"
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or (
                    info.compress_type == zipfile.ZIP_DEFLATED
                    and info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 1024):
                raise ValueError(f"member {info.filename}: compression {info.compress_type} of "
                                 f"{info.compress_size:,} into {info.file_size:,} bytes")
            with archive.open(info) as member:  # reads (inflates) only the header
                shape, fortran, dtype, header = npy_header(member, where, info.file_size)
            order = "F" if fortran else "C"
            size = info.file_size - header
            if info.compress_type == zipfile.ZIP_STORED:
                raw.seek(info.header_offset)
                local = raw.read(30)
                if local[:4] != b"PK\x03\x04":
                    raise ValueError(f"member {info.filename}: no zip local header")
                name_length, extra_length = struct.unpack("<HH", local[26:30])
                offset = info.header_offset + 30 + name_length + extra_length + header
                if size >= _MAP_MIN_BYTES and offset % _NPY_ALIGN == 0:
                    arrays[key] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
                    continue
            with archive.open(info) as member:
                member.read(header)
                data = member.read(size)
            arrays[key] = np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy()
    return arrays


def _read_postings(folder: Path, shape: tuple[int, int]) -> maxscore.Postings:
    """maxscore's stored postings (`POSTINGS`), memory-mapped read-only and checked (`maxscore.check_postings`:
    one pass over them, refusing in one line what would take the kernel outside its arrays)."""
    fix = "rebuild it with `linker index build`"
    params = read_folder_json(folder, POSTINGS_PARAMS, what='maxscore\'s block size {"block_size": names}', fix=fix)
    arrays = {}
    for field in maxscore.ARRAYS:
        name = f"{POSTINGS}/{field}.npy"
        path = folder_file(folder, name, max_bytes=LARGE_MAX_BYTES, what="an .npy array of maxscore's postings", fix=fix)
        with path.open("rb") as handle:  # the header against the file's size, before numpy maps it
            npy_header(handle, folder / name, os.fstat(handle.fileno()).st_size, fix=fix)
        arrays[field] = np.load(path, mmap_mode="r", allow_pickle=False)
    postings = maxscore.Postings(**arrays, block_size=params.get("block_size"))
    maxscore.check_postings(postings, shape, lambda field: folder / (
        POSTINGS_PARAMS if field == "block_size" else f"{POSTINGS}/{field}.npy"))
    return postings


def _is_permutation(values, n: int) -> bool:
    """Whether `values` (JSON values) are the integers 0..n-1, each once."""
    values = list(values)
    if len(values) != n or not set(map(type, values)) <= {int}:
        return False
    try:
        columns = np.fromiter(values, dtype=np.int64, count=n)
    except OverflowError:  # an integer beyond 64 bits
        return False
    if n and (columns.min() < 0 or columns.max() >= n):
        return False
    seen = np.zeros(n, dtype=bool)
    seen[columns] = True
    return bool(seen.all())


def load_npz_mapped(path: Path) -> sp.csr_matrix:
    """The CSR matrix of `save_npz_aligned`, its arrays memory-mapped read-only (shared between the
    processes of a machine); another scipy CSR ``.npz`` (unaligned or compressed) is read into memory.
    Its structure is checked (`_check_csr`), so that no search kernel indexes out of its arrays."""
    arrays = _member_arrays(path)
    fmt = arrays["format"].item() if arrays["format"].size == 1 else None
    if fmt not in (b"csr", "csr"):
        raise ValueError(f"format {fmt!r}, expected 'csr'")
    return _check_csr(arrays)


def _check_csr(arrays: dict[str, np.ndarray]) -> sp.csr_matrix:
    """A CSR matrix of L2-normalised tf-idf rows from its arrays, refusing what scipy's own constructor
    lets through: indices out of range, a decreasing indptr, non-finite values."""
    shape, indptr, indices, data = (arrays[k] for k in ("shape", "indptr", "indices", "data"))
    if shape.shape != (2,) or shape.dtype.kind not in "iu" or (shape < 0).any():
        raise ValueError(f"shape {shape.tolist()!r}, expected (names, n-grams)")
    rows, columns = (int(n) for n in shape)
    for name, array, kinds in (("indptr", indptr, "iu"), ("indices", indices, "iu"), ("data", data, "f")):
        if array.ndim != 1 or array.dtype.kind not in kinds:
            raise ValueError(f"{name}: a {array.ndim}-d {array.dtype} array")
    if len(indptr) != rows + 1 or len(indices) != len(data) or (rows >= 0 and (
            indptr[0] != 0 or indptr[-1] != len(indices))):
        raise ValueError(f"indptr of {len(indptr)} entries ending at {indptr[-1] if len(indptr) else None} for "
                         f"{rows} rows and {len(indices)} values")
    block = 1 << 24  # checked in blocks: a mapped array stays mapped
    for start in range(0, len(indices), block):
        part = np.asarray(indices[start : start + block])
        if len(part) and (part.min() < 0 or part.max() >= columns):
            raise ValueError(f"a column index outside 0..{columns - 1}")
        if not np.isfinite(np.asarray(data[start : start + block])).all():
            raise ValueError("a NaN or infinite value")
    for start in range(0, len(indptr), block):
        part = np.asarray(indptr[start : start + block + 1])
        if (np.diff(part) < 0).any():
            raise ValueError("a decreasing indptr")
    return sp.csr_matrix((data, indices, indptr), shape=(rows, columns))


def sorted_top_n(queries: sp.csr_matrix, names: sp.csr_matrix, top_n: int, threads: int,
                 min_score: float = 0.0) -> sp.csr_matrix:
    """`sp_matmul_topn(queries, names, top_n, sort=True, n_threads=threads)`, the same matrix (scores below
    `min_score` left out when it is above 0).

    On one thread, sparse_dot_topn's own API runs its sequential kernel; its OpenMP kernel, asked
    for one thread, returns the same output for less work: 2.0 vs 2.9 CPU-s for 1,864 queries over
    the 150,749-name default index (top 40, pinned to one core), 1.6 vs 4.3 ms for one query
    (tests/test_index_tfidf.py checks the equality). So one-thread searches (a Ray worker, a
    service's small requests) call that kernel directly; the API's own checks are repeated here
    (the cases they handle differently go through it).
    """
    kernel = getattr(sparse_dot_topn_core, "sp_matmul_topn_sorted_mt", None)
    plain = (threads > 1 or kernel is None or not getattr(sparse_dot_topn_core, "_has_openmp_support", False)
             or queries.nnz == 0 or names.nnz == 0 or queries.dtype != names.dtype
             or queries.dtype not in (np.float32, np.float64)
             or len({a.dtype for a in (queries.indptr, queries.indices, names.indptr, names.indices)}) != 1)
    if plain:
        return sp_matmul_topn(queries, names, top_n=top_n, sort=True, n_threads=threads, threshold=min_score or None)
    found = kernel(top_n=min(top_n, names.shape[1]), nrows=queries.shape[0], ncols=names.shape[1],
                   threshold=min_score or None,
                   A_data=queries.data, A_indptr=queries.indptr, A_indices=queries.indices,
                   B_data=names.data, B_indptr=names.indptr, B_indices=names.indices, n_threads=1)
    return sp.csr_matrix(found, shape=(queries.shape[0], names.shape[1]))


class TfidfNameIndex(NameIndexBase):
    """Names as L2-normalised tf-idf rows; `search` returns exact cosine top-k name rows."""

    kind = "tfidf"

    def __init__(self, config: TfidfConfig, vectorizer: TfidfVectorizer, matrix: sp.csr_matrix) -> None:
        self.config = config
        self.vectorizer = vectorizer
        self.matrix = matrix  # (names, features) CSR, rows L2-normalised
        self._shards: tuple[int, list[tuple[int, sp.csr_matrix]]] | None = None  # size, [(first row, CSR)]
        self._df: np.ndarray | None = None
        self._terms: list[str] | None = None
        self._maxscore: maxscore.MaxScoreSearcher | None = None

    @property
    def shards(self) -> list[tuple[int, sp.csr_matrix]]:
        """Right operands of the product, `config.shard_names` (default `SHARD_NAMES`) names each; built lazily so
        that a build does not hold them (and again when the config's shard size changes)."""
        size = self.config.shard_names or SHARD_NAMES
        if self._shards is None or self._shards[0] != size:
            self._shards = (size, [(start, self.matrix[start : start + size].T.tocsr())
                                   for start in range(0, self.size, size)])
        return self._shards[1]

    @property
    def document_frequency(self) -> np.ndarray:
        """Names holding each n-gram (column)."""
        if self._df is None:
            self._df = np.bincount(self.matrix.indices, minlength=self.matrix.shape[1])
        return self._df

    @property
    def size(self) -> int:
        return self.matrix.shape[0]

    @classmethod
    def build(cls, names: Sequence[str], config: TfidfConfig = TfidfConfig()) -> TfidfNameIndex:
        vectorizer = _vectorizer(config)
        vocabulary, idf, matrix = _fit_transform(names, vectorizer.build_analyzer(), config)
        vectorizer = _vectorizer(config, vocabulary)
        vectorizer.idf_ = idf
        log.debug("tf-idf: %d names, %d n-gram features, %d non-zeros", matrix.shape[0], matrix.shape[1], matrix.nnz)
        return cls(config, vectorizer, matrix)

    def save(self, folder: Path) -> None:
        (folder / "tfidf").mkdir(parents=True, exist_ok=True)
        vocabulary = {term: int(col) for term, col in self.vectorizer.vocabulary_.items()}
        (folder / VOCABULARY).write_text(json.dumps(vocabulary, ensure_ascii=False, sort_keys=True))
        np.save(folder / IDF, self.vectorizer.idf_.astype(np.float64), allow_pickle=False)
        save_npz_aligned(folder / MATRIX, self.matrix)
        if self.search_method == "maxscore":  # written a slice at a time: the build does not hold them all
            (folder / POSTINGS).mkdir(exist_ok=True)
            files = (folder / POSTINGS / "names.npy", folder / POSTINGS / "weights.npy")
            postings = maxscore.build_postings(self.matrix, self.vectorizer.idf_, files=files)
            for field in set(maxscore.ARRAYS) - {"names", "weights"}:
                np.save(folder / POSTINGS / f"{field}.npy", getattr(postings, field), allow_pickle=False)
            (folder / POSTINGS_PARAMS).write_text(json.dumps({"block_size": postings.block_size}))

    @classmethod
    def load(cls, folder: Path, config: TfidfConfig) -> TfidfNameIndex:
        """Read ``tfidf/`` of an index folder, every file through `linker.index.manifest`'s folder policy (inside
        the folder, regular, bounded) and checked against the others: idf values finite and positive, one
        vocabulary column per idf value, a well-formed CSR matrix with as many columns."""
        fix = "rebuild it with `linker index build`"
        idf = read_folder_array(folder, IDF, what="an .npy vector of idf values", shape=(None,), fix=fix)
        if (idf <= 0).any():
            raise InputFormatError(folder / IDF, "idf values > 0", f"{idf.min()}", fix=fix)
        # A vocabulary entry is an n-gram of at most ngram_max characters, each at most 6 bytes of JSON
        # ("\u00e9"), plus quotes, separators and a column number: the file cannot be larger for this idf.
        cap = min(VOCABULARY_MAX_BYTES, len(idf) * (6 * config.ngram_max + 26) + 64)
        vocabulary = read_folder_json(folder, VOCABULARY, what="a JSON vocabulary {n-gram: column}", max_bytes=cap,
                                      fix=fix)
        if not _is_permutation(vocabulary.values(), len(idf)):
            raise InputFormatError(folder / VOCABULARY, f"the columns 0..{len(idf) - 1}, once each (one per idf value)",
                                   f"{len(vocabulary)} entries, not those columns", fix=fix)
        path = folder_file(folder, MATRIX, max_bytes=LARGE_MAX_BYTES, what="a scipy .npz sparse matrix", fix=fix)
        with native_read(folder / MATRIX, "a scipy .npz CSR matrix of tf-idf rows", fix=fix):
            matrix = load_npz_mapped(path)
        if matrix.shape[1] != idf.shape[0]:
            raise InputFormatError(folder / IDF, f"{len(vocabulary)} idf values and matrix columns",
                                   f"{idf.shape[0]} idf values, {matrix.shape[1]} columns",
                                   fix="rebuild it with `linker index build`")
        vectorizer = _vectorizer(config, vocabulary)
        vectorizer.idf_ = idf
        index = cls(config, vectorizer, matrix.astype(np.float32, copy=False))  # float32 already: stays mapped
        if index.search_method == "maxscore" and os.path.lexists(folder / POSTINGS_PARAMS):
            postings = _read_postings(folder, index.matrix.shape)
            index._maxscore = maxscore.MaxScoreSearcher(index.matrix, idf, postings=postings)
        elif index.search_method == "maxscore":
            log.info("%s: no stored maxscore postings (an index built before they were stored): computing them now; "
                     "rebuild the index to start faster", folder)
        index.warm_up()
        return index

    def warm_up(self) -> None:
        """Build the search's structures now (and compile maxscore's kernel), so that the first query
        of a service is not the slow one."""
        if self.search_method == "maxscore":
            self.maxscore_searcher.search(self.vectors(["warm up"]), 1)
        else:
            self.shards

    def vectors(self, queries: Sequence[str]) -> sp.csr_matrix:
        """(queries, features) L2-normalised tf-idf rows; all-zero for a mention with no known n-gram."""
        return self.vectorizer.transform([normalize(q, self.config.normalization) for q in queries]).tocsr()

    @property
    def search_method(self) -> str:
        """The search `search` runs: `config.search`, with ``auto`` resolved by size (module docstring)."""
        method = self.config.search
        if method == "auto":
            method = "exact" if self.size <= self.config.exact_max_names else "maxscore"
        if method == "maxscore" and not maxscore.available():
            _warn_once("tf-idf search maxscore needs numba, which is not installed: searching exactly (same "
                        "results, slower)")
            method = "exact"
        return method

    @property
    def threads(self) -> int:
        """Search threads: `config.threads`, capped by the process's budget (a Ray actor's one CPU)."""
        return thread_budget(self.config.threads)

    @property
    def exact(self) -> bool:
        """Whether `search` returns the exact top-k (every method but ``approximate``)."""
        return self.search_method != "approximate"

    @property
    def maxscore_searcher(self) -> maxscore.MaxScoreSearcher:
        """Postings and bounds of the maxscore search; built lazily."""
        if self._maxscore is None:
            self._maxscore = maxscore.MaxScoreSearcher(self.matrix, self.vectorizer.idf_)
        return self._maxscore

    @property
    def ngram_index(self) -> TfidfNameIndex:
        return self

    def first_fetch(self, k: int) -> int | None:
        """Names `linker.retrieve` asks for first to find k concepts (None of its own: its default)."""
        return k * MAXSCORE_FETCH_PER_CONCEPT if self.search_method == "maxscore" else None

    @property
    def searches_concepts(self) -> bool:
        """Whether `search_concepts` runs: maxscore finds the top-k concepts itself, in one search
        (fetching names for `linker.retrieve` certifies a lower k-th score, and widening searches again)."""
        return self.search_method == "maxscore" and self.config.concept_search

    def search_concepts(self, queries: Sequence[str], codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best concepts per query (`codes`: each name's concept code), each as its best name:
        (scores, rows) as `search` returns them, sorted (score desc, concept code asc); maxscore only."""
        return self.search_vectors(self.vectors(queries), k, codes)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k names per query: (scores (q, k) float32, rows (q, k) int64), -1 / 0.0 where fewer match.

        Only names sharing at least one n-gram score above zero, so a query may get fewer than k.
        Among names of equal score the lower row comes first; `linker.retrieve` resolves ties.
        """
        return self.search_vectors(self.vectors(queries), k)

    def search_vectors(self, vectors: sp.csr_matrix, k: int,
                       codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`search` of tf-idf rows; with `codes`, `search_concepts` (maxscore only)."""
        n = vectors.shape[0]
        k = max(1, min(k, self.size))
        scores = np.zeros((n, k), dtype=np.float32)
        rows = np.full((n, k), -1, dtype=np.int64)
        method = self.search_method
        if codes is not None and method != "maxscore":
            raise ValueError(f"a concept search needs the maxscore search, this index searches {method}")
        for start in range(0, n, self.config.query_chunk):
            chunk = vectors[start : start + self.config.query_chunk]
            if method == "maxscore":
                found = self.maxscore_searcher.search(chunk, k, self.threads, codes)
            else:
                found = self._top(chunk, k) if method == "exact" else self._approximate(chunk, k)
            scores[start : start + chunk.shape[0]], rows[start : start + chunk.shape[0]] = found
        return scores, rows

    def _top(self, vectors: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k over every shard, merged."""
        # sp_matmul_topn splits query rows between threads: a handful of rows gives the second thread
        # nothing to do but its start-up (one mention over 150k names, shared 2-core machine: p50
        # 14 ms with one thread, 36 ms with two).
        threads = self.threads
        threads = threads if vectors.shape[0] >= MIN_ROWS_PER_THREAD * threads else 1
        queries, scores, rows = [], [], []
        for first, shard in self.shards:
            product = sorted_top_n(vectors, shard, min(k, shard.shape[1]), threads, self.config.min_score)
            queries.append(np.repeat(np.arange(vectors.shape[0]), np.diff(product.indptr)))
            scores.append(product.data)
            rows.append(product.indices.astype(np.int64) + first)
        return _best_per_query(np.concatenate(queries), np.concatenate(scores), np.concatenate(rows),
                               vectors.shape[0], k)

    def _approximate(self, vectors: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidates from each query's rarer n-grams, rescored exactly with all of them (module docstring)."""
        df = self.document_frequency[vectors.indices]
        query_of = np.repeat(np.arange(vectors.shape[0]), np.diff(vectors.indptr))
        by_rarity = np.lexsort((df, query_of))  # each query's n-grams, rarest first
        rank = np.empty(len(df), dtype=np.int64)
        rank[by_rarity] = np.arange(len(df)) - vectors.indptr[query_of[by_rarity]]
        # A query made only of common n-grams ("pain") keeps its rarest few, so that it still finds names.
        keep = (df <= self.config.candidate_df * self.size) | (rank < MIN_RARE_NGRAMS)
        selecting = sp.csr_matrix((np.where(keep, vectors.data, 0), vectors.indices.copy(), vectors.indptr.copy()),
                                  shape=vectors.shape)
        selecting.eliminate_zeros()  # in place: hence the copies, `vectors` is rescored below
        _, candidates = self._top(selecting, max(MIN_CANDIDATES, 4 * k))
        query, position = np.nonzero(candidates >= 0)
        rows = candidates[query, position]
        exact = np.asarray(self.matrix[rows].multiply(vectors[query]).sum(axis=1), dtype=np.float32).ravel()
        return _best_per_query(query, exact, rows, vectors.shape[0], k)

    def explain(self, mention: str, name: str) -> list[SharedNgram]:
        """The n-grams `mention` shares with the dictionary name `name`, largest contribution first.

        The contributions sum to the cosine score of the name (up to float rounding): a name's
        row is a function of its text, so the name's vector is recomputed from the stored
        vocabulary and idf rather than looked up.
        """
        if self._terms is None:
            self._terms = [""] * len(self.vectorizer.vocabulary_)
            for term, column in self.vectorizer.vocabulary_.items():
                self._terms[column] = term
        both = self.vectors([mention, name])
        query, target = both[0], both[1]
        shared, in_query, in_name = np.intersect1d(query.indices, target.indices, return_indices=True)
        weights = [SharedNgram(self._terms[column], float(query.data[i]), float(target.data[j]),
                               float(query.data[i] * target.data[j]))
                   for column, i, j in zip(shared.tolist(), in_query.tolist(), in_name.tolist())]
        return sorted(weights, key=lambda w: (-w.contribution, w.ngram))

    def score_rows(self, vectors: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
        """Exact cosine of query i with name rows[i, j] (rows -1 score 0): (q, m) float32.

        Used by the hybrid index to give a dense-only candidate its sparse score.
        """
        out = np.zeros(rows.shape, dtype=np.float32)
        for i in range(rows.shape[0]):
            valid = rows[i] >= 0
            if valid.any():
                out[i, valid] = (self.matrix[rows[i, valid]] @ vectors[i].T).toarray().ravel()
        return out
