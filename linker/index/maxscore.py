"""Exact top-k cosine search over tf-idf postings with certified early termination (MaxScore).

The sparse product (`sparse_dot_topn`) visits every posting of every n-gram of a query: over a
million names a mention's common n-grams ("ion", " ch") hold hundreds of thousands of names, and
most of that work adds small amounts to names that never reach the top k. This search reads a
query's n-grams from the rarest to the most common into a score accumulator, and keeps a bound on
what the n-grams not read yet can add to a name's score:

    any name:  rest(j) = min(sum_t q_t * max_weight_t, ||q_rest||)    (Cauchy-Schwarz: unit names)
    one name:  sum_t q_t * idf_t * name_scale                         (its weights are idf x tf / norm)

and theta, the k-th best exact score of names scored so far (a lower bound of the final one).

1. Every name of a list is a candidate while rest(j) >= theta. Before a list at least as long as
   the names seen so far, theta is raised by scoring exactly the names of the k best partial scores.
2. Once rest(j) < theta, no unseen name can reach the top k. A seen name whose partial score plus
   its own bound is below theta is dropped; the next list is then read for the others only, until
   scoring the others from their rows costs less than reading it.
3. The names left are scored from their rows and merged into the top k (score desc, row asc).

Given each name's concept code, the same search returns the top-k *concepts* instead (each as its
best name; what `linker.retrieve` computes from names by fetching more and widening): theta is
then the k-th best concept's score, which prunes names just as soundly, and the top k keeps one
name per concept. A concept usually has several names that share n-grams, so fetching k names
per concept (or widening) would certify a lower k-th score and read more lists.

The names are searched in blocks of `BLOCK_NAMES` (an accumulator that stays in cache), each
block starting from the theta of the blocks before. Within the search, names are numbered by
length (number of n-grams), so that a block holds names of similar length, and `max_weight_t` is
the block's own: short names carry large weights, long names small ones, and a short query that
matched a short name well stops reading a block of long names after its rarest lists, or before
(on the 1M-name benchmark dictionary this halves the postings read).
Scores come from the rows, summed in column order as the full product sums them, so they are
bit-identical to its scores and equal names tie exactly (ties are ordered by table row, not by
the length order); the bounds keep a margin `EPS` for the rounding of partial sums. The top k is
therefore the exact one (tests/test_index_tfidf.py checks it against the full product;
eval/bench/bench_link.md measures speed and agreement).

The postings, in that order and by block, and the bounds (`Postings`) are computed once from the
rows (`build_postings`: one pass that writes each name into its n-grams' lists, so that memory holds
the rows and the postings and nothing else), at build time: tf-idf stores them beside the rows and
maps them at load (`linker.index.tfidf`), where they are checked (`check_postings`) so that a damaged
or hostile folder cannot hand the kernel an index outside its arrays.

The kernel is compiled with numba (`nogil`: `search` runs blocks of queries in threads, each thread
taking the next block when done). Without numba, `available()` is False and tfidf.py searches with
the full product instead.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from linker.errors import InputFormatError
from linker.index.manifest import _flat_blocks
from linker.precision import in_threads

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install usable
    numba = None

EPS = 1e-5  # float32 sums of <= a few hundred terms in [0, 1] differ by far less than this
# Names per block: the search runs block by block with a score accumulator of this many floats
# (512 KiB, within a core's cache), and each block starts from the k-th score of those before.
BLOCK_NAMES = 131_072
# Queries a thread takes at a time (`search` with threads > 1): small enough to balance the threads,
# large enough that taking one costs nothing next to searching it.
QUERY_BLOCK = 16


def available() -> bool:
    return numba is not None


def _kernel(q_first, q_last, q_indptr, q_indices, q_data, k, codes, original, block_ptr, block_size, p_indices, p_data, max_weight, idf, r_indptr,
            r_indices, r_data, name_scale, row_cost, acc, touched, query_dense, touched_scale, out_scores, out_rows,
            work):  # pragma: no cover - compiled
    """The top k of queries q_first..q_last-1 into out_scores/out_rows (preset to 0 / -1): names
    sorted (score desc, row asc), or with `codes` (each name's concept code) the k best concepts,
    each as its best name (score desc, row asc), sorted (score desc, concept code asc); work[i] =
    (postings read, names seen, names scored from their rows)."""
    n_blocks = block_ptr.shape[1] - 1
    by_concept = len(codes) > 0
    for i in range(q_first, q_last):
        start, end = q_indptr[i], q_indptr[i + 1]
        n_terms = end - start
        if n_terms == 0:
            continue
        terms = q_indices[start:end]
        weights = q_data[start:end]
        lengths = np.empty(n_terms, np.int64)
        for j in range(n_terms):
            lengths[j] = block_ptr[terms[j], n_blocks] - block_ptr[terms[j], 0]
            query_dense[terms[j]] = weights[j]
        order = np.argsort(lengths, kind="mergesort")  # rarest first
        # rest[j]: what terms order[j:] can add to any name; rest_idf[j] * name_scale[name]: to that name
        rest = np.zeros(n_terms + 1, np.float64)  # per block (its own largest weights)
        rest_idf = np.zeros(n_terms + 1, np.float64)
        norms = np.zeros(n_terms + 1, np.float64)
        squares = 0.0
        for j in range(n_terms - 1, -1, -1):
            t = order[j]
            squares += weights[t] * weights[t]
            norms[j] = np.sqrt(squares)
            rest_idf[j] = rest_idf[j + 1] + weights[t] * idf[terms[t]]
        best_s = out_scores[i]
        best_r = out_rows[i]
        filled = 0
        theta = 0.0  # the k-th best exact score among names scored so far (0: fewer than k scored)
        for block in range(n_blocks):
            first = block * block_size  # names of this block are first + local id
            by_max = 0.0
            for j in range(n_terms - 1, -1, -1):
                t = order[j]
                by_max += weights[t] * max_weight[terms[t], block]
                rest[j] = min(by_max, norms[j])
            n_seen = 0
            j = 0
            # Phase 1: every name of a list is a candidate, until no unseen name can reach theta.
            while j < n_terms:
                t = order[j]
                lo, hi = block_ptr[terms[t], block], block_ptr[terms[t], block + 1]
                # Before a list at least as long as the names seen so far (so that this costs at
                # most what reading the list does): raise theta from the names of best partial score.
                if n_seen >= k and hi - lo >= n_seen:
                    theta = max(theta, _kth_exact(acc, touched, n_seen, k, first, codes, original, r_indptr, r_indices, r_data,
                                                  query_dense))
                if theta > 0 and rest[j] < theta - EPS:
                    break
                w = weights[t]
                for p in range(lo, hi):
                    name = p_indices[p] - first
                    touched[n_seen] = name
                    # (n_seen < block_size always, unless weights that round to 0 make a name "new" again:
                    # capped, so that no stored postings write past `touched`)
                    n_seen += (acc[name] == 0) & (n_seen < block_size)
                    acc[name] += w * p_data[p]
                work[i, 0] += hi - lo
                j += 1
            work[i, 1] += n_seen
            # Phase 2: only seen names can make the top k. Drop those that cannot reach theta any more
            # (partial score plus their own bound), then score the rest from their rows or, while that
            # costs more than the next list, read that list for them only.
            alive = n_seen
            # Each seen name's bound scale, read once into an array that follows `touched`: the filter below runs
            # once per list read, and reading name_scale[first + name] there (random, beside acc) was a fifth of
            # the search's time at 5M names (eval/scale/report.md).
            for c in range(n_seen):
                touched_scale[c] = name_scale[first + touched[c]]
            while True:
                # (cheap next to the list that follows, or when every list is read: then it leaves
                # about k names to score from their rows)
                if alive > k and (j == n_terms or block_ptr[terms[order[j]], block + 1]
                                  - block_ptr[terms[order[j]], block] >= 4 * alive):
                    theta = max(theta, _kth_exact(acc, touched, alive, k, first, codes, original, r_indptr, r_indices, r_data,
                                                  query_dense))
                kept = 0
                for c in range(alive):
                    name = touched[c]
                    if acc[name] + min(rest[j], rest_idf[j] * touched_scale[c]) >= theta - EPS:
                        touched[kept] = name
                        touched_scale[kept] = touched_scale[c]
                        kept += 1
                    else:
                        acc[name] = 0.0  # dropped: the scratch is left zeroed, and reading skips it
                alive = kept
                if j == n_terms:
                    break
                t = order[j]
                lo, hi = block_ptr[terms[t], block], block_ptr[terms[t], block + 1]
                if alive * row_cost <= hi - lo:
                    break
                w = weights[t]
                for p in range(lo, hi):
                    name = p_indices[p] - first
                    if acc[name] != 0:
                        acc[name] += w * p_data[p]
                work[i, 0] += hi - lo
                j += 1
            # The k best concepts so far, each with its best name (score desc, row asc), sorted
            # (score desc, concept asc); theta follows the k-th. Scores come from the rows, summed
            # in column order as the full product sums them: equal names tie exactly, whatever order
            # their partial scores were accumulated in.
            for c in range(alive):
                name = touched[c]
                acc[name] = 0.0
                row = original[first + name]
                score = _exact(row, r_indptr, r_indices, r_data, query_dense)
                work[i, 2] += 1
                concept = codes[row] if by_concept else row
                held = -1  # this concept's place in the top k, if it has one
                if by_concept:
                    for q in range(filled):
                        if codes[best_r[q]] == concept:
                            held = q
                            break
                if held >= 0:
                    if score < best_s[held] or (score == best_s[held] and row > best_r[held]):
                        continue  # not the concept's best name
                    for q in range(held, filled - 1):  # remove its worse name; inserted again below
                        best_s[q] = best_s[q + 1]
                        best_r[q] = best_r[q + 1]
                    filled -= 1
                if filled == k and _before(best_s[k - 1], codes[best_r[k - 1]] if by_concept else best_r[k - 1],
                                           score, concept):
                    continue
                pos = filled if filled < k else k - 1
                while pos > 0 and _before(score, concept, best_s[pos - 1],
                                          codes[best_r[pos - 1]] if by_concept else best_r[pos - 1]):
                    if pos < k:
                        best_s[pos] = best_s[pos - 1]
                        best_r[pos] = best_r[pos - 1]
                    pos -= 1
                best_s[pos] = score
                best_r[pos] = row
                if filled < k:
                    filled += 1
            if filled == k:
                theta = max(theta, np.float64(best_s[k - 1]))
        for j in range(n_terms):
            query_dense[terms[j]] = 0.0


def _before(score_a, concept_a, score_b, concept_b):  # pragma: no cover - compiled
    """Whether a ranks before b: higher score, then lower concept code (or row)."""
    return score_a > score_b or (score_a == score_b and concept_a < concept_b)


def _exact(name, r_indptr, r_indices, r_data, query_dense):  # pragma: no cover - compiled
    score = np.float32(0.0)
    for p in range(r_indptr[name], r_indptr[name + 1]):
        score += query_dense[r_indices[p]] * r_data[p]
    return score


def _kth_exact(acc, touched, n_touched, k, first, codes, original, r_indptr, r_indices, r_data, query_dense):  # pragma: no cover
    """A lower bound of the query's k-th best score: the k-th best exact score of the names with
    the k best partial scores (partial <= exact: weights are non-negative). With `codes`, of the
    k-th best concept: names are scored by partial score, best first, until k concepts are found
    (synonyms share n-grams, so the best partial scores often hold fewer), among the 16k best; else 0."""
    by_concept = len(codes) > 0
    m = min(16 * k, n_touched) if by_concept else k
    partial = np.empty(n_touched, np.float32)
    for c in range(n_touched):
        partial[c] = acc[touched[c]]
    cut = np.partition(partial, n_touched - m)[n_touched - m]  # m-th largest partial score
    names = np.empty(m, np.int64)
    found = 0
    for c in range(n_touched):
        if acc[touched[c]] >= cut and found < m:
            names[found] = touched[c]
            partial[found] = acc[touched[c]]
            found += 1
    order = np.argsort(-partial[:found])
    best = np.empty(k, np.float32)  # the best score of each concept found so far
    concepts = np.empty(k, np.int64)
    n_concepts = 0
    for c in range(found):
        row = original[first + names[order[c]]]
        score = _exact(row, r_indptr, r_indices, r_data, query_dense)
        concept = codes[row] if by_concept else row
        held = -1
        for q in range(n_concepts):
            if concepts[q] == concept:
                held = q
                break
        if held >= 0:
            best[held] = max(best[held], score)
        else:
            best[n_concepts] = score
            concepts[n_concepts] = concept
            n_concepts += 1
            if n_concepts == k:
                return np.float64(np.min(best))
    return 0.0


def _fill(r_indptr, r_indices, r_data, order, idf, block_size, first_term, last_term, offset, block_ptr, names,
          weights, max_weight, name_scale):  # pragma: no cover - compiled
    """`build_postings`' pass: the names in `order` (shortest first), each written into the lists of its n-grams
    first_term..last_term-1 (so each list comes out ascending), at their positions minus `offset`; its bound and
    those lists' block maxima updated on the way. block_ptr[:, 0] holds where each n-gram's list begins; the other
    columns of those n-grams are written here."""
    cursor = block_ptr[:, 0].copy()  # (n-grams,) where each list's next posting goes
    for rank in range(len(order)):
        block = rank // block_size
        if rank % block_size == 0 and block > 0:
            block_ptr[first_term:last_term, block] = cursor[first_term:last_term]
        row = order[rank]
        scale = np.float32(0.0)
        for p in range(r_indptr[row], r_indptr[row + 1]):
            t = r_indices[p]
            w = r_data[p]
            scale = max(scale, w / idf[t])
            if first_term <= t < last_term:
                names[cursor[t] - offset] = rank
                weights[cursor[t] - offset] = w
                cursor[t] += 1
                max_weight[t, block] = max(max_weight[t, block], w)
        name_scale[rank] = scale
    block_ptr[first_term:last_term, block_ptr.shape[1] - 1] = cursor[first_term:last_term]


if numba is not None:
    _before = numba.njit(nogil=True, cache=True)(_before)
    _exact = numba.njit(nogil=True, cache=True)(_exact)
    _kth_exact = numba.njit(nogil=True, cache=True)(_kth_exact)
    _kernel = numba.njit(nogil=True, cache=True)(_kernel)
    _fill = numba.njit(nogil=True, cache=True)(_fill)


class Postings(NamedTuple):
    """What the search reads besides the rows, with names numbered shortest first (module docstring)."""

    order: np.ndarray  # (names,) int64: the table row of each name in that order
    names: np.ndarray  # (postings,) int32: each n-gram's names in that order, ascending, n-gram after n-gram
    weights: np.ndarray  # (postings,) float32: their weights (the rows' values)
    block_ptr: np.ndarray  # (n-grams, blocks + 1) int64: where n-gram t's postings of names >= b * block_size begin
    max_weight: np.ndarray  # (n-grams, blocks) float32: n-gram t's largest weight in block b
    name_scale: np.ndarray  # (names,) float32: a name's weight for n-gram t is at most idf_t * name_scale
    block_size: int  # names per block

    @property
    def indptr(self) -> np.ndarray:
        """(n-grams + 1,) where each n-gram's postings begin, and the last ends."""
        return np.append(self.block_ptr[:, 0], self.block_ptr[-1, -1] if len(self.block_ptr) else 0)


# Saved as .npy files by tf-idf (`linker.index.tfidf`); the block size is a number of its own.
ARRAYS = ("order", "names", "weights", "block_ptr", "max_weight", "name_scale")


# Postings written per pass when `build_postings` writes them to files: 256 MiB of names and weights, so that a
# build holds the rows and this much (at 5M names, 259M postings, all of them held took the build from 3.9 to
# 5.9 GB); each pass reads every row again (eval/scale/report.md has the build's time).
SLICE_POSTINGS = 1 << 25


def build_postings(matrix: sp.csr_matrix, idf: np.ndarray, block_size: int = BLOCK_NAMES,
                   files: tuple[Path, Path] | None = None) -> Postings:
    """The postings and bounds of `matrix`'s L2-normalised rows (`idf`: its columns' idf), by `_fill`: no copy of the
    rows by length and no transpose (at 5M names each was as large as the rows).

    With `files` (two .npy paths), the names and weights are written there, `SLICE_POSTINGS` at a time (a pass over
    the rows for each slice of n-grams), and the Postings returned hold empty arrays in their place."""
    n, features = matrix.shape
    block_size = max(1, min(block_size, n))
    blocks = -(-n // block_size)
    # The search numbers names shortest first, so that a block holds names of similar length and its largest
    # weights bound it tightly: a short query cannot score high against a block of long names.
    order = np.argsort(np.diff(matrix.indptr), kind="stable").astype(np.int64)
    counts = np.zeros(features, dtype=np.int64)  # postings per n-gram
    for start in range(0, matrix.nnz, 1 << 24):  # in slices: bincount copies its input to int64 (2 GB at 5M names)
        counts += np.bincount(matrix.indices[start : start + (1 << 24)], minlength=features)
    block_ptr = np.zeros((features, blocks + 1), dtype=np.int64)
    np.cumsum(counts[:-1], out=block_ptr[1:, 0])
    ends = np.append(block_ptr[1:, 0], matrix.nnz)  # where each n-gram's list ends
    slice_size = matrix.nnz if files is None else min(SLICE_POSTINGS, matrix.nnz)
    names = np.empty(slice_size, dtype=np.int32 if n < 2**31 else np.int64)
    weights = np.empty(slice_size, dtype=np.float32)
    max_weight = np.zeros((features, blocks), dtype=np.float32)
    name_scale = np.zeros(n, dtype=np.float32)
    handles = [] if files is None else [_npy_file(path, array.dtype, matrix.nnz) for path, array in
                                        zip(files, (names, weights))]
    try:
        first = 0
        while n and first < features:
            # n-grams first..last-1: as many as fit a slice, and at least one (a longer list is a slice of its own)
            offset = block_ptr[first, 0]
            last = max(first + 1, int(np.searchsorted(ends, offset + slice_size, side="right")))
            length = ends[last - 1] - offset
            if length > len(names):
                names, weights = np.empty(length, names.dtype), np.empty(length, weights.dtype)
            _fill(matrix.indptr, matrix.indices, matrix.data, order, idf.astype(np.float32), block_size, first, last,
                  offset, block_ptr, names, weights, max_weight, name_scale)
            for handle, array in zip(handles, (names, weights)):
                array[:length].tofile(handle)
            first = last
    finally:
        for handle in handles:
            handle.close()
    if files is not None:
        names, weights = names[:0], weights[:0]
    return Postings(order, names, weights, block_ptr, max_weight, name_scale, block_size)


def _npy_file(path: Path, dtype: np.dtype, length: int):
    """`path` opened for writing a (length,) .npy array of `dtype`, its header written: the data follows."""
    handle = open(path, "wb")
    np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (length,)})
    return handle


def _first_error(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


def check_postings(postings: Postings, shape: tuple[int, int], path: Callable[[str], Path],
                   block: int = 1 << 22) -> None:
    """Refuse (InputFormatError naming the file, `path(field)`) postings that would take the kernel outside its
    arrays or its scratch, for rows of `shape` (names, n-grams): shapes and dtypes that do not fit, block
    pointers that decrease or do not end at the postings' length, an `order` that is not a permutation of the
    rows, a posting whose name lies outside its block, a weight outside (0, 1] (L2-normalised rows; NaN and
    infinity fail it), non-finite or negative bounds. The postings are read once, `block` at a time through
    a map of their own whose pages are dropped after each block (`linker.index.manifest._flat_blocks`)."""
    n, features = shape
    size = postings.block_size
    blocks = -(-n // size) if type(size) is int and size >= 1 else -1  # (JSON: not a bool, not a float)

    def refuse(field: str, expected: str, found: str):
        raise InputFormatError(path(field), expected, found, fix="rebuild the index with `linker index build`")

    if blocks < 0 or (n and size > n):
        refuse("block_size", f"a block size in 1..{max(n, 1)}", repr(size))
    wanted = {"order": ((n,), "iu"), "names": ((len(postings.weights),), "iu"), "weights": ((None,), "f"),
              "block_ptr": ((features, blocks + 1), "iu"), "max_weight": ((features, blocks), "f"),
              "name_scale": ((n,), "f")}
    for field, (shape_, kinds) in wanted.items():
        array = getattr(postings, field)
        if array.ndim != len(shape_) or any(w is not None and g != w for g, w in zip(array.shape, shape_)):
            refuse(field, f"an array of shape {shape_} for {n:,} names and {features:,} n-grams",
                   f"shape {array.shape}")
        # (numba reads native byte order only, and computes with no float16)
        if array.dtype.kind not in kinds or not array.dtype.isnative or array.dtype == np.float16:
            refuse(field, f"an array of dtype kind {'/'.join(kinds)} (no float16) in this machine's byte order",
                   f"dtype {array.dtype.str}")
    ptr = np.asarray(postings.block_ptr)
    ends = np.append(ptr[:, 0], len(postings.names))  # each list's start, and the last one's end
    if features and (ptr[0, 0] != 0 or (np.diff(ptr, axis=1) < 0).any() or (ptr[1:, 0] != ptr[:-1, -1]).any()
                     or ptr[-1, -1] != len(postings.names)) or (not features and len(postings.names)):
        refuse("block_ptr", f"pointers that never decrease, each n-gram's list following the one before and the "
               f"last ending at the {len(postings.names):,} postings", f"{ends[:3].tolist()}... ending at {ends[-1]}")
    order = np.asarray(postings.order)
    if n and (order.min() < 0 or order.max() >= n or (np.bincount(order, minlength=n) != 1).any()):
        refuse("order", f"each row 0..{n - 1} once", "a row out of range or repeated")
    for field in ("max_weight", "name_scale"):
        values = np.asarray(getattr(postings, field))
        bad = _first_error(~(values >= 0) | ~np.isfinite(values))
        if bad is not None:
            refuse(field, "finite bounds >= 0", f"{values.flat[bad]} at flat position {bad}")
    # Each posting's block, from the lengths of the (n-gram, block) segments that tile the postings in order.
    starts = ptr[:, :-1].ravel()
    lengths = np.diff(ptr, axis=1).ravel()
    segment_block = np.tile(np.arange(blocks, dtype=np.int32), features)
    first = 0
    for names, weights in zip(_flat_blocks(postings.names, block), _flat_blocks(postings.weights, block)):
        last = first + len(names)
        lo, hi = np.searchsorted(starts, [first, last - 1], side="right") - 1
        taken = lengths[lo : hi + 1].copy()
        taken[0] -= first - starts[lo]  # the first segment may begin before this block of postings
        taken[-1] = last - starts[hi] if hi > lo else len(names)
        expected = np.repeat(segment_block[lo : hi + 1], taken)
        bad = _first_error((names < 0) | (names >= n) | (names // size != expected))
        if bad is not None:
            refuse("names", f"name numbers in 0..{n - 1}, each inside its block of {size:,}",
                   f"{names[bad]} at position {first + bad} (block {expected[bad]})")
        bad = _first_error(~((weights > 0) & (weights <= 1)))
        if bad is not None:
            refuse("weights", "weights in (0, 1] (L2-normalised rows)", f"{weights[bad]} at position {first + bad}")
        first = last


class MaxScoreSearcher:
    """Postings (n-gram -> names), each n-gram's largest name weight, and per-thread scratch."""

    def __init__(self, matrix: sp.csr_matrix, idf: np.ndarray, block_size: int = BLOCK_NAMES,
                 postings: Postings | None = None) -> None:
        """`postings`: those of `build_postings(matrix, idf, block_size)` (stored ones, checked by
        `check_postings`); None computes them."""
        self.rows = matrix  # (names, features) CSR, L2-normalised rows: the exact scores
        self.idf = idf.astype(np.float32)
        self.postings = build_postings(matrix, self.idf, block_size) if postings is None else postings
        self.original, self.block_ptr = self.postings.order, self.postings.block_ptr
        self.max_weight, self.name_scale = self.postings.max_weight, self.postings.name_scale
        self.block_size = self.postings.block_size
        self.row_cost = matrix.nnz / matrix.shape[0] if matrix.shape[0] else 1.0
        self._scratch: queue.SimpleQueue = queue.SimpleQueue()  # (acc, touched, query_dense, touched_scale), reused

    def _take_scratch(self):
        try:
            return self._scratch.get_nowait()
        except queue.Empty:
            # touched: one slot more than a block's names (the kernel writes a slot before it knows
            # whether the name is new); touched_scale: their name_scale
            return (np.zeros(self.block_size, np.float32), np.empty(self.block_size + 1, np.int32),
                    np.zeros(self.rows.shape[1], np.float32), np.empty(self.block_size + 1, np.float32))

    def _search_queries(self, vectors: sp.csr_matrix, k: int, codes: np.ndarray, first: int, last: int, scores, rows,
                        work) -> None:
        """Queries first..last-1 of `vectors` into rows first..last-1 of scores/rows/work."""
        scratch = self._take_scratch()
        try:
            _kernel(first, last, vectors.indptr, vectors.indices, vectors.data, k, codes, self.original, self.block_ptr,
                    self.block_size, self.postings.names, self.postings.weights, self.max_weight, self.idf,
                    self.rows.indptr, self.rows.indices, self.rows.data, self.name_scale, self.row_cost, *scratch,
                    scores, rows, work)
        finally:
            self._scratch.put(scratch)  # the kernel leaves it zeroed

    def search(self, vectors: sp.csr_matrix, k: int, threads: int = 1,
               codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k names (scores (q, k) float32, rows (q, k) int64; -1 / 0.0 where fewer names match),
        sorted (score desc, row asc). With `codes` (each name's concept code, int64): the k best
        concepts, each as its best name (the lowest row among its best-scoring names), sorted
        (score desc, concept code asc), i.e. `linker.retrieve.top_concepts` without its widening."""
        scores, rows, _visited = self.search_counted(vectors, k, threads, codes)
        return scores, rows

    def search_counted(self, vectors: sp.csr_matrix, k: int, threads: int = 1, codes: np.ndarray | None = None):
        """`search` and the work per query: (postings read, names seen, names scored from their rows)."""
        codes = np.empty(0, np.int64) if codes is None else np.asarray(codes, np.int64)
        vectors = vectors.astype(np.float32)
        vectors.sort_indices()
        n = vectors.shape[0]
        k = max(1, min(k, self.rows.shape[0]))
        scores = np.zeros((n, k), np.float32)
        rows = np.full((n, k), -1, np.int64)
        work = np.zeros((n, 3), np.int64)
        threads = min(threads, -(-n // QUERY_BLOCK))  # no thread without a block to search
        if threads <= 1:
            self._search_queries(vectors, k, codes, 0, n, scores, rows, work)
            return scores, rows, work
        # Threads take the next QUERY_BLOCK queries until none are left (`in_threads`): queries differ by orders of
        # magnitude in cost, so equal halves would leave one thread waiting for the other. The kernel releases the
        # GIL; every thread writes its own rows of the shared outputs.
        in_threads(lambda first: self._search_queries(vectors, k, codes, first, min(first + QUERY_BLOCK, n), scores,
                                                      rows, work), range(0, n, QUERY_BLOCK), threads)
        return scores, rows, work
