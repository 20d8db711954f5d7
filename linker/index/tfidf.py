"""Character n-gram tf-idf over dictionary names, with exact sparse cosine top-k.

The Medical Crossing baseline (and BioSyn's sparse encoder) vectorises names with character
uni- and bigrams (``analyzer="char"``, ``ngram_range=(1, 2)``); that is the default here.
``char_wb`` n-grams (padded inside word boundaries) and longer ranges are options.

Persistence never pickles: the vocabulary is JSON, the idf vector ``.npy``, the name matrix a
scipy ``.npz`` of plain arrays (``scipy.sparse.load_npz`` reads it with ``allow_pickle=False``).
On load the vectoriser is rebuilt from vocabulary + idf, so queries are transformed exactly as
at build time.

Search is `sparse_dot_topn.sp_matmul_topn` (a multi-threaded sparse product that keeps only the
top n per row), over chunks of queries so that memory stays bounded: a full scipy product
followed by a sort materialises every non-zero query-name score (measured by the lead on 200k
names: ~95 queries/s at 2.6 GiB, against ~600 queries/s at 0.3 GiB with sp_matmul_topn).
A mention that shares no n-gram with the vocabulary has an all-zero vector and gets no
candidates (rows -1), never arbitrary ones.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer
from sparse_dot_topn import sp_matmul_topn

from linker.errors import ConfigError, InputFormatError, UnknownNameError
from linker.progress import track
from linker.fileio import native_read
from linker.text import MODES, normalize

log = logging.getLogger(__name__)

ANALYZERS = ("char", "char_wb")
VOCABULARY = "tfidf/vocabulary.json"
IDF = "tfidf/idf.npy"
MATRIX = "tfidf/names.npz"
MIN_ROWS_PER_THREAD = 8  # queries per extra sparse-product thread (see `search_vectors`)


@dataclass(frozen=True)
class TfidfConfig:
    """Build parameters of a tf-idf index; recorded in the manifest and used again on load."""

    analyzer: str = "char"  # Medical Crossing / BioSyn: plain character n-grams
    ngram_min: int = 1
    ngram_max: int = 2  # uni+bigrams as in the Medical Crossing baseline and BioSyn
    normalization: str = "default"  # linker.text.normalize mode applied to names and mentions
    sublinear_tf: bool = False  # scikit-learn's default, as the baseline used it
    query_chunk: int = 1024  # queries per sparse product: bounds memory at chunk * top_n scores
    threads: int = 2  # sp_matmul_topn threads; 2 = the project's CPU budget per process

    def __post_init__(self) -> None:
        if self.analyzer not in ANALYZERS:
            raise UnknownNameError("tf-idf analyzer", self.analyzer, ANALYZERS)
        if self.normalization not in MODES:
            raise UnknownNameError("normalisation mode", self.normalization, MODES)
        if not 1 <= self.ngram_min <= self.ngram_max <= 10:
            raise ConfigError(
                f"n-gram range must satisfy 1 <= min <= max <= 10, found {self.ngram_min},{self.ngram_max}"
            )
        if self.query_chunk < 1 or self.threads < 1:
            raise ConfigError(f"query_chunk and threads must be >= 1, found {self.query_chunk}, {self.threads}")


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


class TfidfNameIndex:
    """Names as L2-normalised tf-idf rows; `search` returns exact cosine top-k name rows."""

    kind = "tfidf"

    def __init__(self, config: TfidfConfig, vectorizer: TfidfVectorizer, matrix: sp.csr_matrix) -> None:
        self.config = config
        self.vectorizer = vectorizer
        self.matrix = matrix  # (names, features) CSR, rows L2-normalised
        self._matrix_t: sp.csr_matrix | None = None  # (features, names), made on first search

    @property
    def matrix_t(self) -> sp.csr_matrix:
        """The right operand of the product; built lazily so that an index build does not hold it."""
        if self._matrix_t is None:
            self._matrix_t = self.matrix.T.tocsr()
        return self._matrix_t

    @property
    def size(self) -> int:
        return self.matrix.shape[0]

    @classmethod
    def build(cls, names: Sequence[str], config: TfidfConfig = TfidfConfig()) -> TfidfNameIndex:
        vectorizer = _vectorizer(config)
        # fit_transform reads its input once, counting n-grams (most of the build's time), so a
        # generator shows that pass's progress.
        normalized = (normalize(n, config.normalization) for n in track(names, desc="tf-idf n-grams", unit="name"))
        matrix = vectorizer.fit_transform(normalized).tocsr()
        log.debug("tf-idf: %d names, %d n-gram features, %d non-zeros", matrix.shape[0], matrix.shape[1], matrix.nnz)
        return cls(config, vectorizer, matrix)

    def save(self, folder: Path) -> None:
        (folder / "tfidf").mkdir(parents=True, exist_ok=True)
        vocabulary = {term: int(col) for term, col in self.vectorizer.vocabulary_.items()}
        (folder / VOCABULARY).write_text(json.dumps(vocabulary, ensure_ascii=False, sort_keys=True))
        np.save(folder / IDF, self.vectorizer.idf_.astype(np.float64), allow_pickle=False)
        sp.save_npz(folder / MATRIX, self.matrix, compressed=False)

    @classmethod
    def load(cls, folder: Path, config: TfidfConfig) -> TfidfNameIndex:
        fix = "rebuild it with `linker index build`"
        with native_read(folder / VOCABULARY, "a JSON vocabulary {n-gram: column}", fix=fix):
            vocabulary = json.loads((folder / VOCABULARY).read_text(encoding="utf-8"))
            if not isinstance(vocabulary, dict):
                raise ValueError(f"a JSON {type(vocabulary).__name__}")
        with native_read(folder / IDF, "an .npy array of idf values", fix=fix):
            idf = np.load(folder / IDF, allow_pickle=False)
        with native_read(folder / MATRIX, "a scipy .npz sparse matrix", fix=fix):
            matrix = sp.load_npz(folder / MATRIX).tocsr()  # load_npz uses allow_pickle=False
        if len(vocabulary) != idf.shape[0] or matrix.shape[1] != idf.shape[0]:
            raise InputFormatError(folder / IDF, f"{len(vocabulary)} idf values and matrix columns",
                                   f"{idf.shape[0]} idf values, {matrix.shape[1]} columns",
                                   fix="rebuild it with `linker index build`")
        vectorizer = _vectorizer(config, vocabulary)
        vectorizer.idf_ = idf
        index = cls(config, vectorizer, matrix.astype(np.float32))
        index.matrix_t  # transpose now, so that the first query of a service is not the slow one
        return index

    def vectors(self, queries: Sequence[str]) -> sp.csr_matrix:
        """(queries, features) L2-normalised tf-idf rows; all-zero for a mention with no known n-gram."""
        return self.vectorizer.transform([normalize(q, self.config.normalization) for q in queries]).tocsr()

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k names per query: (scores (q, k) float32, rows (q, k) int64), -1 / 0.0 where fewer match.

        Only names sharing at least one n-gram score above zero, so a query may get fewer than k.
        Among names of equal score the order is arbitrary here; `linker.retrieve` resolves ties.
        """
        return self.search_vectors(self.vectors(queries), k)

    def search_vectors(self, vectors: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = vectors.shape[0]
        k = max(1, min(k, self.size))
        scores = np.zeros((n, k), dtype=np.float32)
        rows = np.full((n, k), -1, dtype=np.int64)
        for start in range(0, n, self.config.query_chunk):
            chunk = vectors[start : start + self.config.query_chunk]
            # sp_matmul_topn splits query rows between threads: a handful of rows gives the second thread
            # nothing to do but its start-up (one mention over 150k names, shared 2-core machine: p50
            # 14 ms with one thread, 36 ms with two).
            threads = self.config.threads if chunk.shape[0] >= MIN_ROWS_PER_THREAD * self.config.threads else 1
            product = sp_matmul_topn(chunk, self.matrix_t, top_n=k, sort=True, n_threads=threads)
            counts = np.diff(product.indptr)
            local = np.repeat(np.arange(chunk.shape[0]), counts)  # query of each kept score
            rank = np.arange(product.nnz) - np.repeat(product.indptr[:-1], counts)  # its place in the row
            scores[start + local, rank] = product.data
            rows[start + local, rank] = product.indices
        return scores, rows

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
