"""The two training objectives, in plain torch.

- `marginal_nll`: BioSyn's synonym marginalisation (Sung et al. 2020, eq. 5): the negative log of
  the summed softmax probability of every candidate whose concept is the gold one.
- `multi_similarity_loss` with `mine_hard_pairs`: SapBERT's objective (Liu et al. 2021, eq. 1-2),
  the multi-similarity loss of Wang et al. (2019) over pairs chosen by an online triplet-margin
  miner. SapBERT builds both from pytorch-metric-learning; they are re-implemented here (a few
  lines each) to avoid that dependency, with the same semantics: cosine similarity for the loss,
  Euclidean distance between L2-normalised embeddings for the miner, loss averaged over all
  embeddings of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def marginal_nll(logits: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean of -log sum_{c positive} softmax(logits)_c over the rows that have a positive.

    logits: (batch, k) scores; positive: (batch, k) bool. Rows without any positive candidate
    carry no signal (BioSyn drops them too) and are left out of the mean; the second value is
    how many rows were used. With no usable row the loss is a zero that still has a graph.
    """
    usable = positive.any(dim=1)  # (batch,)
    n = int(usable.sum())
    if n == 0:
        return logits.sum() * 0.0, 0
    log_probs = torch.log_softmax(logits[usable], dim=1)  # (n, k)
    masked = log_probs.masked_fill(~positive[usable], float("-inf"))
    return -torch.logsumexp(masked, dim=1).mean(), n


@dataclass(frozen=True)
class MultiSimilarityParams:
    """Hyper-parameters of the MS loss and its miner.

    alpha=2, beta=50, base (lambda)=0.5 are the values of the SapBERT paper (Liu et al., NAACL 2021,
    sec. 2.2, following Wang et al. 2019); cambridgeltl/sapbert's src/metric_learning.py now
    hard-codes alpha=1, beta=60, base=0.5 (comment "1,2,3; 40,50,60": it tried that grid).
    The miner is SapBERT's `TripletMarginMiner(margin=0.2, type_of_triplets="all")`
    (train/pretrain.sh: --miner_margin 0.2 --type_of_triplets all).
    """

    alpha: float = 2.0
    beta: float = 50.0
    base: float = 0.5
    miner_margin: float = 0.2


def mine_hard_pairs(embeddings: torch.Tensor, labels: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive and negative pair masks (n, n) of the triplets a triplet-margin miner keeps.

    A triplet (a, p, n) is kept ("all" type) when d(a, n) < d(a, p) + margin, with d the Euclidean
    distance of L2-normalised embeddings. A pair belongs to the masks when some kept triplet uses it:
    (a, n) iff d(a, n) < max_p d(a, p) + margin; (a, p) iff d(a, p) > min_n d(a, n) - margin.
    Computed from pair distances in O(n^2) instead of enumerating n^3 triplets.
    """
    with torch.no_grad():
        x = F.normalize(embeddings, dim=1)
        dist = torch.cdist(x, x)  # (n, n)
        same = labels[:, None] == labels[None, :]
        eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        pos = same & ~eye
        neg = ~same
        inf = torch.tensor(float("inf"), device=dist.device)
        far_pos = torch.where(pos, dist, -inf).max(dim=1).values  # (n,) hardest positive
        near_neg = torch.where(neg, dist, inf).min(dim=1).values  # (n,) hardest negative
        keep_neg = neg & (dist < far_pos[:, None] + margin)
        keep_pos = pos & (dist > near_neg[:, None] - margin)
        # a triplet needs both a positive and a negative for its anchor
        has_both = pos.any(dim=1) & neg.any(dim=1)
        return keep_pos & has_both[:, None], keep_neg & has_both[:, None]


def multi_similarity_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    params: MultiSimilarityParams = MultiSimilarityParams(),
    *,
    mine: bool = True,
) -> tuple[torch.Tensor, int]:
    """MS loss over (n, dim) embeddings with integer labels; returns (loss, mined pair count).

    Per anchor i: 1/alpha * log(1 + sum_{p} exp(-alpha (S_ip - base)))
                + 1/beta  * log(1 + sum_{n} exp( beta (S_in - base))),
    S the cosine similarity, averaged over all n anchors (anchors without pairs add 0).
    """
    if mine:
        pos, neg = mine_hard_pairs(embeddings, labels, params.miner_margin)
    else:
        same = labels[:, None] == labels[None, :]
        pos = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        neg = ~same
    x = F.normalize(embeddings, dim=1)
    sim = x @ x.T  # (n, n) cosine
    zero = torch.zeros(len(labels), 1, dtype=sim.dtype, device=sim.device)  # the "1 +" inside the log
    pos_terms = (-params.alpha * (sim - params.base)).masked_fill(~pos, float("-inf"))
    neg_terms = (params.beta * (sim - params.base)).masked_fill(~neg, float("-inf"))
    pos_loss = torch.logsumexp(torch.cat([zero, pos_terms], dim=1), dim=1) / params.alpha  # (n,)
    neg_loss = torch.logsumexp(torch.cat([zero, neg_terms], dim=1), dim=1) / params.beta  # (n,)
    return (pos_loss + neg_loss).mean(), int(pos.sum() + neg.sum())
