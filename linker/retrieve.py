"""Name hits -> concept candidates: the top-k distinct concepts, best score per concept.

The trap (as scispaCy's candidate generator documents it): an index returns *names*, and a
concept usually has several (synonyms, LLTs, translations, case variants), so the k best names
often cover fewer than k concepts. A fixed over-fetch (k * 8) only makes that rarer. Here the
search widens instead: it fetches ``k * OVERFETCH`` names, collapses them to concepts, and asks
again with four times as many for the queries that still lack k concepts, or whose k-th concept
ties with the last name fetched (a tie at the cut would otherwise make the result depend on the
index's arbitrary order among equal scores). It stops when the index has no more matching names.
For exact indexes (tf-idf, flat dense) the result is therefore exactly the top-k concepts by best
name score, in the stable order (score desc, concept_id asc; with a prior, `ConceptIndex`, the most annotated of
tied concepts first; `linker.link.Linker` then applies the prior per matched name); among equal-scoring names of one
concept the lowest table row (sources write the preferred name first) is the matched name.

A language restriction is a mask over name rows applied before collapsing, with the same
widening, so "top-k Spanish concepts" is exact too.

An index that can search concepts itself (`searches_concepts`: tf-idf with maxscore search) is
asked for the top-k concepts directly when there is no mask: the same result in one search.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from linker.errors import ConfigError

if TYPE_CHECKING:
    from linker.index import NameIndex

log = logging.getLogger(__name__)

# First fetch: 8 names per wanted concept, the over-fetch scispaCy and BioSyn-style linkers use;
# on the ICD-10-CM and MEDIC dictionaries (3-6 names per concept) it rarely needs widening.
OVERFETCH = 8
MIN_FETCH = 32
WIDEN = 4
SCORE_BUDGET = 4_000_000  # (query, name) hits per search call: ~50 MB of scores and rows


def arrow_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column of integers or booleans as numpy, read from its Arrow buffers (read-only). pyarrow's own `to_numpy`
    imports pandas (pyarrow 26), a second of a `linker link` start-up on a busy machine; a column with nulls still
    goes through it."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count or not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        return values.to_numpy(zero_copy_only=False)
    boolean = pa.types.is_boolean(values.type)
    if boolean:  # bits in Arrow, bytes in numpy
        values = pc.cast(values, pa.uint8())
    dtype = np.dtype(f"<{'i' if pa.types.is_signed_integer(values.type) else 'u'}{values.type.bit_width // 8}")
    if not len(values):
        return np.zeros(0, dtype=bool if boolean else dtype)
    out = np.frombuffer(values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize)
    return out.view(bool) if boolean else out


@dataclass(frozen=True)
class ConceptHits:
    """One query's concepts, best first: concept codes (index into `ConceptIndex.ids`), best name rows, scores."""

    concepts: np.ndarray  # (n,) int64
    rows: np.ndarray  # (n,) int64
    scores: np.ndarray  # (n,) float32


class ConceptIndex:
    """Concept codes of name rows, numbered so that code order is the tie order: concept_id order, or with a
    `prior` (concept_id -> how often annotators chose it, `linker index build --prior`) the most chosen first, then
    concept_id. Every tie between equal scores is broken by code, so the prior decides the ties and nothing else."""

    def __init__(self, concept_ids: pa.ChunkedArray | pa.Array, prior: dict[str, int] | None = None) -> None:
        ids = pc.unique(concept_ids).sort()
        if prior:
            ids = pa.array(sorted(ids.to_pylist(), key=lambda cid: (-prior.get(cid, 0), cid)), type=ids.type)
        self.ids: list[str] = ids.to_pylist()
        self.codes = arrow_numpy(pc.index_in(concept_ids, value_set=ids)).astype(np.int64)
        self._code_of: dict[str, int] | None = None

    def code_of(self, concept_id: str) -> int:
        """The tie order of `concept_id` (its code)."""
        if self._code_of is None:  # built on first use: evaluation asks, linking does not
            self._code_of = {cid: code for code, cid in enumerate(self.ids)}
        return self._code_of[concept_id]

    def __len__(self) -> int:
        return len(self.ids)


def collapse(scores: np.ndarray, rows: np.ndarray, codes: np.ndarray, allowed: np.ndarray | None) -> ConceptHits:
    """Best name per concept among (scores, rows), sorted by (score desc, concept code asc)."""
    keep = rows >= 0
    if allowed is not None:
        keep &= allowed[np.where(rows >= 0, rows, 0)]
    rows, scores = rows[keep], scores[keep]
    concepts = codes[rows]
    order = np.lexsort((rows, concepts, -scores))
    _, first = np.unique(concepts[order], return_index=True)
    picks = order[np.sort(first)]  # positions in (score desc, code, row) order: already stable
    return ConceptHits(concepts[picks], rows[picks], scores[picks].astype(np.float32))


def top_concepts(
    index: NameIndex,
    concept_index: ConceptIndex,
    queries: Sequence[str],
    k: int,
    *,
    allowed: np.ndarray | None = None,
) -> list[ConceptHits]:
    """The top-k distinct concepts for each query (see the module docstring for the widening)."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, found {k}")
    if allowed is None and index.searches_concepts:
        # The index finds the top-k concepts itself (tf-idf maxscore): the same result, one search.
        scores, rows = index.search_concepts(list(queries), concept_index.codes, k)
        return [ConceptHits(concept_index.codes[r[r >= 0]], r[r >= 0], s[r >= 0]) for s, r in zip(scores, rows)]
    size = index.size
    results: list[ConceptHits | None] = [None] * len(queries)
    pending = list(range(len(queries)))
    # An index may ask for a first fetch of its own (tf-idf maxscore: its cost grows with k).
    first = index.first_fetch(k)
    fetch = min(size, max(MIN_FETCH, k * OVERFETCH) if first is None else max(k, first))
    # A dense index encodes its queries (an encoder pass, the costly part): encoded once here,
    # every widening round searches with the same vectors instead of encoding its queries again.
    vectors = index.encode_queries(list(queries)) if pending else None
    while pending:
        # At most SCORE_BUDGET (query, name) hits per search call, so that widening many queries
        # towards the whole index (a rare language in a large index) keeps memory bounded.
        group = max(1, SCORE_BUDGET // fetch)
        still: list[int] = []
        for start in range(0, len(pending), group):
            still += _search_group(index, concept_index, queries, pending[start : start + group], fetch, k,
                                   allowed, results, vectors)
        if still:
            log.debug("widening %d of %d queries from %d to %d names", len(still), len(pending), fetch,
                      min(size, fetch * WIDEN))
        pending = still
        fetch = min(size, fetch * WIDEN)
    return results  # type: ignore[return-value]


def _search_group(index: NameIndex, concept_index: ConceptIndex, queries: Sequence[str], pending: list[int], fetch: int,
                  k: int, allowed: np.ndarray | None, results: list, vectors: np.ndarray | None = None) -> list[int]:
    """Search `pending` queries with `fetch` names each (with their `vectors` when encoded already);
    fill `results`, return those that need more."""
    size = index.size
    if vectors is not None:
        scores, rows = index.search_vectors(vectors[pending], fetch)
    else:
        scores, rows = index.search([queries[i] for i in pending], fetch)
    still: list[int] = []
    for j, qi in enumerate(pending):
        hits = collapse(scores[j], rows[j], concept_index.codes, allowed)
        found = int((rows[j] >= 0).sum())
        exhausted = found < fetch or fetch >= size
        if not exhausted:
            short = len(hits.scores) < k
            tie_at_cut = not short and scores[j][found - 1] >= hits.scores[k - 1]
            if short or tie_at_cut:
                still.append(qi)
                continue
        results[qi] = ConceptHits(hits.concepts[:k], hits.rows[:k], hits.scores[:k])
    return still
