"""Hybrid index: BioSyn-style ``sparse_weight * tf-idf cosine + dense_weight * dense cosine``.

Candidates are the union of the tf-idf top-k and the dense top-k names; every candidate is then
scored *exactly* with both parts (a name found only by one side gets its other score computed:
the sparse one as the dot product of the query's and the name's tf-idf rows, the dense one from
the stored float embeddings), and the union is ranked by the weighted sum. So a name ranked
high by both sides is never penalised for being absent from one list, which a fusion of two
truncated lists (missing score = 0) would do.

The weight: BioSyn (Sung et al., ACL 2020) learns ``sparse_weight`` as one trainable scalar,
starting from ``--initial_sparse_weight 0`` in its train.py; its learned value is calibrated to
BioSyn's unnormalised [CLS] inner products and does not transfer. Here both parts are cosines on
the same scale, so the default is 1.0 (equal weight, dense_weight 1.0). `linker index tune`
(`linker.eval.tune`) picks both weights on a dev split by a small grid and records them, with the dev
scores, in the manifest; `linker index build --sparse-weight learned|tuned|FLOAT` takes the weight
BioSyn learned for the encoder, a tuned one, or a number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from linker.errors import ConfigError
from linker.index import NameIndexBase
from linker.index.dense import QUERY_MODULES, DenseConfig, DenseNameIndex, build_dense, exact_scores, listed_params
from linker.index.manifest import typed_parameters
from linker.index.tfidf import TfidfConfig, TfidfNameIndex, config_from_manifest

log = logging.getLogger(__name__)

DEFAULT_SPARSE_WEIGHT = 1.0  # equal weight of two cosines; see the module docstring


@dataclass(frozen=True)
class HybridConfig:
    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    dense: DenseConfig = field(default_factory=DenseConfig)
    sparse_weight: float = DEFAULT_SPARSE_WEIGHT
    dense_weight: float = 1.0

    def __post_init__(self) -> None:
        for name, weight in (("sparse_weight", self.sparse_weight), ("dense_weight", self.dense_weight)):
            if not np.isfinite(weight) or weight < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, found {weight}")
        if self.sparse_weight == self.dense_weight == 0:
            raise ConfigError("sparse_weight and dense_weight are both 0: nothing would score the names")

    @classmethod
    def from_dict(cls, params: dict) -> HybridConfig:
        typed_parameters(cls, params)  # the weights are JSON numbers (TypeError, refused by `load_index`)
        return cls(tfidf=config_from_manifest(params["tfidf"]), dense=DenseConfig.from_dict(params["dense"]),
                   sparse_weight=float(params["sparse_weight"]),
                   dense_weight=float(params.get("dense_weight", 1.0)))  # indexes built before it existed: 1


class HybridNameIndex(NameIndexBase):
    """A tf-idf and a dense index over the same names, searched together (see the module docstring)."""

    kind = "hybrid"

    def __init__(self, sparse: TfidfNameIndex, dense: DenseNameIndex, sparse_weight: float,
                 dense_weight: float = 1.0) -> None:
        if sparse.size != dense.size:
            raise ConfigError(f"hybrid parts index different names: tf-idf {sparse.size}, dense {dense.size}")
        self.sparse = sparse
        self.dense = dense
        self.sparse_weight = sparse_weight
        self.dense_weight = dense_weight
        self._memo: dict[str, np.ndarray] | None = None

    @contextmanager
    def memoised_queries(self) -> Iterator[None]:
        """Within the block each distinct query is encoded once (`linker.eval.tune` searches one dev
        set under many weights); the vectors are dropped at its end."""
        self._memo = {}
        try:
            yield
        finally:
            self._memo = None

    def _dense_vectors(self, queries: Sequence[str]) -> np.ndarray:
        if self._memo is None:
            return self.dense.encode_queries(queries)
        missing = [q for q in dict.fromkeys(queries) if q not in self._memo]
        if missing:
            self._memo.update(zip(missing, self.dense.encode_queries(missing)))
        return np.stack([self._memo[q] for q in queries])

    @property
    def size(self) -> int:
        return self.sparse.size

    @property
    def query_precision(self) -> str:
        return self.dense.query_precision

    @property
    def ngram_index(self) -> TfidfNameIndex:
        return self.sparse  # its tf-idf half explains a match; the dense half has no n-grams

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (q, k) float32, rows (q, k) int64, -1 = none) by (combined score desc, row asc).

        A part with weight 0 adds no candidates: the other part's own search, scaled by its weight, is
        the answer (so the grid ends of `linker.eval.tune` rank exactly as a tf-idf or a dense index).
        """
        n = len(queries)
        k = max(1, min(k, self.size))
        if self.sparse_weight == 0 or self.dense_weight == 0:
            dense_only = self.sparse_weight == 0
            alone, weight = (self.dense, self.dense_weight) if dense_only else (self.sparse, self.sparse_weight)
            vectors = self._dense_vectors(queries) if dense_only else self.sparse.vectors(queries)
            scores, rows = alone.search_vectors(vectors, k)
            return np.where(rows >= 0, weight * scores, 0.0).astype(np.float32), rows
        sparse_vectors = self.sparse.vectors(queries)  # (q, features)
        dense_vectors = self._dense_vectors(queries)  # (q, dim)
        _, sparse_rows = self.sparse.search_vectors(sparse_vectors, k)
        _, dense_rows = self.dense.search_vectors(dense_vectors, k)
        union = np.full((n, 2 * k), -1, dtype=np.int64)  # (q, 2k): each query's candidate rows
        for i in range(n):
            rows = np.unique(np.concatenate([sparse_rows[i], dense_rows[i]]))
            rows = rows[rows >= 0]
            union[i, : len(rows)] = rows
        sparse_scores = self.sparse.score_rows(sparse_vectors, union)  # (q, 2k)
        dense_scores = np.where(union >= 0, exact_scores(dense_vectors, self.dense.embeddings, union), 0.0)
        weighted = self.sparse_weight * sparse_scores + self.dense_weight * dense_scores
        combined = np.where(union >= 0, weighted, -np.inf)
        tie_rows = np.where(union >= 0, union, np.iinfo(np.int64).max)
        order = np.lexsort((tie_rows, -combined.astype(np.float64)), axis=1)[:, :k]
        rows = np.take_along_axis(union, order, axis=1)
        scores = np.take_along_axis(combined, order, axis=1).astype(np.float32)
        return np.where(rows >= 0, scores, 0.0).astype(np.float32), rows


def hybrid_kind():
    """The ``hybrid`` entry of linker.index.KINDS."""
    from linker.index import IndexKind

    def build(names: Sequence[str], config: HybridConfig, folder: Path) -> dict:
        sparse = TfidfNameIndex.build(names, config.tfidf)
        sparse.save(folder)
        return {"features": sparse.matrix.shape[1], **build_dense(names, config.dense, folder)}

    def load(folder: Path, config: HybridConfig, manifest: dict, precision: str | None = None) -> HybridNameIndex:
        sparse = TfidfNameIndex.load(folder, config.tfidf)  # first: it refuses a damaged folder before the encoder loads
        dense = DenseNameIndex.load(folder, listed_params(folder, manifest), precision=precision)
        return HybridNameIndex(sparse, dense, config.sparse_weight, config.dense_weight)

    return IndexKind("hybrid", HybridConfig, build, load, HybridConfig.from_dict, preload=QUERY_MODULES)
