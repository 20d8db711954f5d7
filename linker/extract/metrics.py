"""Span scores of the extractor.

- PHEE (`phee_scores`), after the PHEE paper's argument metrics: **EM_F1**, a predicted Effect string counts when
  it equals a gold Effect string of the same sentence after SQuAD normalisation (lower case, punctuation and
  articles dropped, white space collapsed), each gold string matched once; **Token_F1**, the SQuAD token overlap
  of the sentence's predicted and gold Effect strings (bags of normalised tokens), summed over the corpus
  (micro). The paper scores the arguments of each gold event trigger; here the tagger finds every Effect
  span of the sentence without being given a trigger, so the figures are comparable in kind, not in setting.
- TAC 2017 (`mention_scores`): AdverseReaction mentions, **exact** (the predicted span has the gold mention's
  offsets; a discontinuous mention, several pieces, counts when its pieces are the gold mention's) and **relaxed**
  (any character overlap; precision over predicted spans that overlap a gold mention, recall over gold mentions
  that a predicted span overlaps).
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def prf(tp_p: float, n_pred: int, tp_r: float, n_gold: int) -> dict:
    p = tp_p / n_pred if n_pred else 0.0
    r = tp_r / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(100 * p, 2), "recall": round(100 * r, 2), "f1": round(100 * f, 2),
            "predicted": n_pred, "gold": n_gold}


def phee_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """EM_F1 and Token_F1 of Effect strings, one list of strings per sentence (gold, predicted)."""
    em_tp = n_pred = n_gold = 0
    tok_common = tok_pred = tok_gold = 0
    for gold_strings, pred_strings in zip(gold, predicted, strict=True):
        g = Counter(normalize_answer(s) for s in gold_strings)
        p = Counter(normalize_answer(s) for s in pred_strings)
        em_tp += sum((g & p).values())
        n_pred, n_gold = n_pred + len(pred_strings), n_gold + len(gold_strings)
        gt = Counter(t for s in gold_strings for t in normalize_answer(s).split())
        pt = Counter(t for s in pred_strings for t in normalize_answer(s).split())
        tok_common += sum((gt & pt).values())
        tok_pred, tok_gold = tok_pred + sum(pt.values()), tok_gold + sum(gt.values())
    em = prf(em_tp, n_pred, em_tp, n_gold)
    tok = prf(tok_common, tok_pred, tok_common, tok_gold)
    return {"EM_F1": em["f1"], "EM_precision": em["precision"], "EM_recall": em["recall"],
            "Token_F1": tok["f1"], "Token_precision": tok["precision"], "Token_recall": tok["recall"],
            "gold_spans": n_gold, "predicted_spans": n_pred}


def mention_scores(gold: list[list[tuple[tuple[int, int], ...]]], predicted: list[list]) -> dict:
    """Exact and relaxed P/R/F1: per document, gold mentions as tuples of (start, end) pieces, predictions as
    (start, end) spans or, discontinuous, as tuples of pieces."""
    exact_tp = relaxed_p = relaxed_r = n_pred = n_gold = 0
    for gold_mentions, spans in zip(gold, predicted, strict=True):
        spans = [tuple(s) if isinstance(s[0], tuple) else (tuple(s),) for s in spans]  # each as its pieces
        n_pred, n_gold = n_pred + len(spans), n_gold + len(gold_mentions)
        exact_tp += sum((Counter(map(tuple, gold_mentions)) & Counter(spans)).values())
        pieces = [piece for m in gold_mentions for piece in m]
        relaxed_p += sum(1 for m in spans if any(s < ge and e > gs for gs, ge in pieces for s, e in m))
        relaxed_r += sum(1 for m in gold_mentions if any(s < ge and e > gs for gs, ge in m for p in spans
                                                         for s, e in p))
    return {"exact": prf(exact_tp, n_pred, exact_tp, n_gold), "relaxed": prf(relaxed_p, n_pred, relaxed_r, n_gold)}


__all__ = ["mention_scores", "normalize_answer", "phee_scores", "prf"]
