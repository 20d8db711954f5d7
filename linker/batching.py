"""How texts are cut into encoder batches, and what one encode call did.

Shared by the torch encoders (`linker.encoders.Encoder`) and the numpy runtime (`linker.runtime`), which cut
their batches the same way and report the same `EncodeStats`; here, below both, so that neither imports the other
for it.
"""

from __future__ import annotations

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
