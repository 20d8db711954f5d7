"""Adverse event, or not? The decision head: whether an adverse-event span the tagger found is an event of the drug,
or what the drug was given for (indication), what it relieved (beneficial), or the subject's own disorder, present
before it (medical history).

Learnt from the annotations of real case reports, not from cue lists: PHEE's Effect arguments of adverse events
(adverse) and of potential therapeutic events (beneficial), its Treat-Disorder arguments (indication) and its
Sub-Disorder arguments that no adverse event overlaps ("a patient with sarcoidosis", "a history of NMS": history).
Each word piece's logits over `CLASSES` are one linear map of the tagger's last hidden state, as the tag and status
heads are; a span's class probabilities are the softmax of its pieces' mean logits, so the head costs nothing beside
the tagger's forward pass. It is trained on the frozen tagger (the tagger's spans do not change), on the gold spans
of PHEE train and the TAC training split, its cut chosen on those of PHEE dev and the TAC development split: the
logits are linear, so their mean over a span is the map of the span's mean hidden state, and training is a logistic
regression over those means. TAC 2017's adverse reactions are adverse examples: trained on PHEE alone, the head took
2 points of recall off the tagger's exact F1 on the TAC development split (84.63 against 85.16), reading drug-label
events as disorders treated; with them, none.

Its form chosen on PHEE dev's gold spans, trained on PHEE's (mean F1 of the four classes, 3 seeds, scratch
study): this linear head 62.0 (61.2 to 62.7), a two-layer MLP over each piece 60.5, over the span's mean 60.4, with
a context pooled by attention from the span 60.5, the tagger's top two layers trained again with a marker on the
span 58.9 to 61.2 (one seed, 2 minutes an epoch on 2 CPU cores against seconds): the linear head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from linker.extract.data import AE, AR, BENEFIT, HISTORY, INDICATION, Doc
from linker.extract.model import ExtractedSpan, softmax, token_range

CLASSES = ("adverse", "indication", "beneficial", "history")
AS_LABEL = {"indication": INDICATION, "beneficial": BENEFIT, "history": HISTORY}  # what a span becomes
EPOCHS = 6  # the dev scores no longer rose after 2 to 4 epochs in the study above
SEEDS = (0, 1, 2)  # trained with each; the first ships (not the best), the others give the spread
# A span stays an adverse event unless its probability of being one falls below the cut (chosen on PHEE dev)
CUTS = tuple(round(0.05 * i, 2) for i in range(2, 19))
LR, WEIGHT_DECAY, BATCH = 1e-3, 0.01, 32


def decision_examples(docs: Sequence[Doc]) -> list[tuple[int, int, int, int]]:
    """(document index, start, end, class index) of every gold span the head learns from: PHEE's positive
    adverse-event Effects, Treat-Disorders, positive beneficial Effects, and Sub-Disorders no adverse-event Effect
    overlaps (a disorder that is also an event of the drug is the event); TAC 2017's positive AdverseReaction
    mentions (adverse: a drug label's wording, which PHEE's case reports do not hold)."""
    out = []
    for i, doc in enumerate(docs):
        for start, end, label, status in doc.spans:
            if label == INDICATION:
                out.append((i, start, end, CLASSES.index("indication")))
            elif status == "positive" and label in (AE, AR, BENEFIT):
                out.append((i, start, end, CLASSES.index("beneficial" if label == BENEFIT else "adverse")))
        out.extend((i, s, e, CLASSES.index("history")) for s, e in history_spans(doc))
    return sorted(out)


def history_spans(doc: Doc) -> list[tuple[int, int]]:
    """The subject's own disorders, present before the drug: PHEE's Sub-Disorders that no adverse-event Effect (of
    any status) overlaps; a disorder that is also an event of the drug is the event."""
    events = [(s, e) for s, e, label, _ in doc.spans if label == AE]
    return [(s, e) for s, e in doc.subject_disorders if not any(a < e and s < b for a, b in events)]


def span_probabilities(logits: np.ndarray, offsets: np.ndarray, start: int, end: int) -> np.ndarray | None:
    """The class probabilities of the span [start, end): the softmax of its pieces' mean logits; None without a
    piece."""
    a, b = token_range(offsets, start, end)
    if b <= a:
        return None
    return softmax(logits[a:b].mean(axis=0))


def decide(spans: list[ExtractedSpan], offsets: np.ndarray, logits: np.ndarray, cut: float) -> list[ExtractedSpan]:
    """`spans` with each positive AdverseEvent span whose probability of being an adverse event is below `cut`
    relabelled as the likeliest other class's label (`AS_LABEL`); its status and confidence stay. A negated or
    hypothetical event keeps its label: it is returned, not coded, whatever it would have been."""
    out = []
    for span in spans:
        if span.label == AE and span.status == "positive":
            probs = span_probabilities(logits, offsets, span.start, span.end)
            if probs is not None and probs[0] < cut:
                span = replace(span, label=AS_LABEL[CLASSES[1 + int(np.argmax(probs[1:]))]])
        out.append(span)
    return out


def _span_means(states: list[tuple[np.ndarray, np.ndarray]], examples) -> tuple[np.ndarray, np.ndarray]:
    """(examples, hidden) mean hidden state of each example's pieces and (examples,) class indices; an example
    without a piece (cut off a long text) is left out."""
    rows, classes = [], []
    for i, start, end, klass in examples:
        offsets, hidden = states[i]
        a, b = token_range(offsets, start, end)
        if b > a:
            rows.append(hidden[a:b].mean(axis=0))
            classes.append(klass)
    width = states[0][1].shape[1] if states else 0
    return np.asarray(rows, np.float32).reshape(-1, width), np.asarray(classes, np.int64)


def class_f1(probs: np.ndarray, gold: np.ndarray, cut: float) -> dict[str, float]:
    """Per class F1 (%) of the decisions `probs` (examples, classes) give at `cut`, against `gold`."""
    predicted = np.where(probs[:, 0] < cut, 1 + probs[:, 1:].argmax(axis=1), 0)
    out = {}
    for k, name in enumerate(CLASSES):
        tp = int(((predicted == k) & (gold == k)).sum())
        wrong = int(((predicted == k) != (gold == k)).sum())
        out[name] = round(200 * tp / max(2 * tp + wrong, 1), 2)
    return out


def _fit(x: np.ndarray, y: np.ndarray, seed: int, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """A multinomial logistic regression (weight (classes, hidden), bias): AdamW, the classes weighed by the square
    root of their inverse frequency (PHEE train holds 62 beneficial spans against 2,704 adverse ones)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(x.shape[1], len(CLASSES))
    with torch.no_grad():  # seeded here, not by torch's global stream
        linear.weight.copy_((torch.rand(linear.weight.shape, generator=generator) - 0.5) * 0.1)
        linear.bias.zero_()
    counts = np.bincount(y, minlength=len(CLASSES)).astype(np.float64)
    weight = torch.tensor(np.sqrt(counts.sum() / (len(CLASSES) * np.maximum(counts, 1))), dtype=torch.float32)
    loss_of = torch.nn.CrossEntropyLoss(weight=weight)
    optimizer = torch.optim.AdamW(linear.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        order = torch.randperm(len(xs), generator=generator)
        for first in range(0, len(xs), BATCH):
            batch = order[first:first + BATCH]
            loss = loss_of(linear(xs[batch]), ys[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return linear.weight.detach().numpy().copy(), linear.bias.detach().numpy().copy()


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def train_decision_head(hidden_of: Callable[[list[str]], list[tuple[np.ndarray, np.ndarray]]], train: Sequence[Doc],
                        dev: Sequence[Doc], *, seeds: Sequence[int] = SEEDS, epochs: int = EPOCHS) -> dict:
    """The decision head learnt on `train`'s gold spans over the hidden states `hidden_of` gives (a tagger's
    `Extractor.hidden_many`), once per seed; the cut chosen on `dev`'s gold spans by the seeds' mean of the classes'
    mean F1. Returns the first seed's ``weight`` and ``bias``, the ``cut`` and the record of the choice (``dev``: the
    first seed's per-class F1 at the cut; ``seeds``: each seed's mean F1 at it; ``examples``: the counts)."""
    x_train, y_train = _span_means(hidden_of([d.text for d in train]), decision_examples(train))
    x_dev, y_dev = _span_means(hidden_of([d.text for d in dev]), decision_examples(dev))
    if not len(y_train) or not len(y_dev):
        raise ValueError("no decision examples: the training and dev documents hold no PHEE event arguments")
    runs = []
    for seed in seeds:
        weight, bias = _fit(x_train, y_train, seed, epochs)
        probs = _softmax(x_dev @ weight.T + bias)
        runs.append((weight, bias, {cut: class_f1(probs, y_dev, cut) for cut in CUTS}))

    def mean_f1(scores: dict[str, float]) -> float:
        return float(np.mean(list(scores.values())))

    cut = max(CUTS, key=lambda c: (np.mean([mean_f1(run[2][c]) for run in runs]), -abs(c - 0.5)))
    weight, bias, scores = runs[0]
    return {"weight": weight, "bias": bias, "cut": cut, "dev": scores[cut],
            "seeds": {str(seed): round(mean_f1(run[2][cut]), 2) for seed, run in zip(seeds, runs, strict=True)},
            "examples": {"train": {c: int((y_train == k).sum()) for k, c in enumerate(CLASSES)},
                         "dev": {c: int((y_dev == k).sum()) for k, c in enumerate(CLASSES)}},
            "epochs": epochs}


__all__ = ["AS_LABEL", "CLASSES", "CUTS", "class_f1", "decide", "decision_examples", "span_probabilities",
           "token_range", "train_decision_head"]
