"""How texts are cut into encoder batches, and what one encode call did.

Shared by the torch encoders (`linker.encoders.Encoder`) and the numpy runtime (`linker.runtime`), which cut
their batches the same way and report the same `EncodeStats`; here, below both, so that neither imports the other
for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class EncodeStats:
    """What one `Encoder.encode` call did: recorded in index manifests and benchmark reports."""

    texts: int
    batches: int
    tokens: int  # real tokens of the distinct texts encoded (see Encoder.encode), padding excluded
    padded_tokens: int  # tokens the model ran, padding included
    max_length: int  # the model's token limit
    longest: int  # longest text in tokens before truncation
    truncated: int  # texts longer than max_length (cut to it)
    tokenize_seconds: float
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


# Tokens per batch (padding included). Terminology names are short (about 8-12 tokens), so a
# fixed count of 64 names makes small matrix products, while a count that suits short names would
# make a batch of 300-token outliers huge; a token budget keeps every batch's products the same
# size. 8192 tokens = 512 names of 16 tokens (activations of a 384-d, 6-12 layer encoder stay in
# tens of MB). MAX_BATCH bounds a batch of very short texts.
TOKEN_BUDGET = 8192
MAX_BATCH = 512
# A batch also ends where the next text is longer than its first by this factor (+2 tokens), so a
# small or spread-out set of texts does not pad a 4-token name to 40 (padding costs as much as text).
MAX_PADDING = 1.25
# ...except while the whole batch stays this small: each forward pass has a fixed cost (~100 module
# calls), and a service encodes a few mentions per call. Measured on 8 MEDIC mentions (7-18 tokens,
# minilm bf16, 1 thread): 3 padding-split batches took 206 ms, one batch of 8 x 18 tokens 99 ms.
SMALL_BATCH_TOKENS = 256


def token_batches(lengths: np.ndarray, token_budget: int, max_batch: int,
                  small_batch_tokens: int = SMALL_BATCH_TOKENS) -> list[tuple[int, int]]:
    """(start, end) slices of length-sorted texts: each batch's count x its longest length stays
    within the budget (a single text longer than the budget forms its own batch), and its longest
    text is at most MAX_PADDING x its shortest + 2 tokens unless the batch stays within
    `small_batch_tokens` padded tokens."""
    batches, start = [], 0
    n = len(lengths)
    while start < n:
        end = start + 1
        longest = MAX_PADDING * int(lengths[start]) + 2
        while (end < n and end - start < max_batch
               and (lengths[end] <= longest or (end - start + 1) * int(lengths[end]) <= small_batch_tokens)
               and (end - start + 1) * int(lengths[end]) <= token_budget):
            end += 1
        batches.append((start, end))
        start = end
    return batches


# ----------------------------------------------------------------------------- one encode call's plan and record
#
# The torch encoder and the numpy runtime run different forward passes over the same plan: the distinct texts
# (`distinct_ids`), cut to the model's limit and cut into length-sorted batches (`length_batches`), and the same
# record of the call (`encode_stats`).


def distinct_ids(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inverse: each text's distinct number, firsts: each distinct one's first text, copies: texts per distinct one).

    Texts the tokenizer reads as the same ids ("Cystic fibrosis" and "cystic fibrosis" for an
    uncased model, or plain duplicates) are encoded once and share one vector. Encoded apart,
    in different batches, they differ by float rounding, and a tie between them (a mention
    with their ids scores ~1 against each) was decided by that rounding, differently in each
    precision and compiled or eager build (28 NCBI-disease test mentions flipped between two
    builds: scripts/ncbi_dense_ties.py). Bit-identical, they tie exactly and search breaks
    the tie by row, the same in every build. (Within one call: an index build encodes chunks
    of names sorted by length, so texts that differ only in case land in the same chunk.)"""
    keys: dict[tuple, int] = {}
    inverse = np.fromiter((keys.setdefault(tuple(x), len(keys)) for x in ids), dtype=np.int64, count=len(ids))
    firsts = np.unique(inverse, return_index=True)[1]  # keys are numbered in order of first appearance
    return inverse, firsts, np.bincount(inverse)


def length_batches(lengths: np.ndarray, limit: int, token_budget: int, batch_size: int | None
                   ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """(clipped: each text's length cut to `limit`, order: the texts by clipped length, stable, batches: `token_batches`
    over that order, at most `batch_size` texts each, MAX_BATCH when None)."""
    clipped = np.minimum(lengths, limit)
    order = np.argsort(clipped, kind="stable")
    return clipped, order, token_batches(clipped[order], token_budget, batch_size or MAX_BATCH)


def encode_stats(lengths: np.ndarray, clipped: np.ndarray, batches: int, padded: int, limit: int,
                 tokenize_seconds: float, started: float, log: logging.Logger) -> EncodeStats:
    """The record of an encode call of texts of token `lengths` (every text, before truncation; `clipped`: the
    distinct ones' as encoded) begun at `started` (time.perf_counter); a warning on `log` (the encoder's own) when
    texts were truncated."""
    truncated = int(np.sum(lengths > limit))
    if truncated:
        log.warning("%d of %d texts are longer than the encoder's %d tokens and were truncated (longest %d)",
                    truncated, len(lengths), limit, int(lengths.max()))
    return EncodeStats(
        texts=len(lengths), batches=batches, tokens=int(clipped.sum()), padded_tokens=padded,
        max_length=limit, longest=int(lengths.max()), truncated=truncated,
        tokenize_seconds=round(tokenize_seconds, 3), seconds=round(time.perf_counter() - started, 3),
    )
