"""The adverse-event tagger: BIO token classification over word pieces on top of a BERT encoder.

One head per label (`LABELS`), each a 3-way B/I/O classifier, so that a document annotated for some labels only
(TAC: adverse reactions, no drugs) trains the heads it has; a fourth 3-way head gives the status of an event
token (`STATUSES`: positive, negated, hypothetical). The lower ``frozen_layers`` transformer layers and the
embeddings stay as the base has them; the layers above and the heads are trained, and only they are shipped.

Long texts are tokenized `TOKENIZE_CHARS` characters at a time, cut at white space (where no word piece starts
or ends differently), into one sequence of pieces with offsets into the original string; that sequence is cut into
windows of at most ``max_length`` word pieces (special tokens included) that overlap by ``max_length - stride``
pieces, so the model's context runs on across the tokenizer's cuts. Each token's logits are averaged over the
windows that hold it, and a span's characters are its first token's start and its last token's end in the original
text, so offsets map back exactly whatever the window sizes.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from linker.extract.data import AE, AR, EVENT_LABELS, LABELS, STATUSES
from linker.language import CJK

O, B, I = 0, 1, 2
# A word character a span widens over (`_whole_words`); not a CJK one: Japanese has no spaces, and a span widened to
# its "whole word" would be the whole sentence.
_WORD = re.compile(f"[^\\W{CJK}]")
_JOIN = re.compile(r"[-/‐‑–]?")  # what may separate two pieces of one span: nothing, a hyphen, a slash
# No span runs over a line break: a drug label's list or table holds one event a line ("Nausea\nHeadache"), and TAC
# 2017's annotators crossed one in 5 of 14,854 training mentions. (White space between CJK characters, a table's
# cells in Japanese, "消化器 悪心", was tried as a break too: the Japanese development labels lost 1.5 points of PT
# F1, the organ classes then standing alone as events.)
_BREAK = re.compile("\n")
# Words that join an event's name to what is around it, and neither end nor begin one: no mention of the 2,525 of
# TAC 2017 dev ends or begins with one, 7 of PHEE's 8,722 begin with one; yet the tagger ended 14 TAC spans there
# ("Hepatomegaly with", "Bone Effects of") and began 13 PHEE dev phrases so ("of opioid adverse effects"). English:
# the tagger's spans in other languages keep theirs. Articles are not among them: PHEE's phrases begin with one.
# Nor does a possessive begin one ("her ventricular tachycardia": 1 of PHEE's 3,911 Effect phrases, 3 of the
# tagger's on dev).
# Nor does a mention end on a number standing alone, in any language: none of PHEE train's 2,890 adverse events, 66
# therapeutic effects and 3,599 drug names does, one of its 1,011 indications ("diabetes mellitus (type 2)": a number a
# bracket closes stays), 4 of TAC 2017 training's 13,795 mentions ("eGFR below 80 mL/min/1.73 m  2", a superscript);
# the tagger ended 8 PHEE dev phrases on a citation's number ("severe hepatitis 5", "(SIADH) 1").
JOINING_WORDS = frozenset("with of in and or to for at on by from including".split())
POSSESSIVES = frozenset("her his their its my your our".split())
TRAILING = re.compile(rf"(?:\s+(?:{'|'.join(sorted(JOINING_WORDS))}|\d+(?![\d)\]])))+\W*$", re.IGNORECASE)
LEADING = re.compile(rf"\W*(?:(?:{'|'.join(sorted(JOINING_WORDS | POSSESSIVES))})\s+)+", re.IGNORECASE)


def token_range(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """The word pieces [a, b) whose characters overlap [start, end) (`offsets` (tokens, 2), in text order)."""
    return (int(np.searchsorted(offsets[:, 1], start, side="right")),
            int(np.searchsorted(offsets[:, 0], end, side="left")))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float32."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


@dataclass(frozen=True)
class TaggerConfig:
    labels: tuple[str, ...] = LABELS
    max_length: int = 128
    stride: int = 96  # window step in word pieces (windows overlap by max_length - 2 - stride)
    frozen_layers: int = 4
    threshold: float = 0.5  # a token is in a span when 1 - P(O) reaches this
    thresholds: tuple[tuple[str, float], ...] = ()  # per label, overriding `threshold` (chosen on dev)
    extend: tuple[tuple[str, float], ...] = ()  # per label: hysteresis of `decode` (1.0 = none; chosen on dev)
    split: tuple[tuple[str, bool], ...] = ()  # per label: a B piece starts a new span inside a run (chosen on dev)
    # per label: a dictionary name found in the text (`linker.extract.lexicon`) becomes a span of that label when
    # the tagger's in-span probability over it reaches this (chosen on dev); a label absent here takes none
    lexicon: tuple[tuple[str, float], ...] = ()
    # a positive adverse-event span becomes another class where its decision head gives it a lower probability of
    # being an adverse event than this (chosen on dev); None: a release without that head (`linker.extract.decision`)
    decision_cut: float | None = None

    def cut(self, label: str) -> float:
        return dict(self.thresholds).get(label, self.threshold)

    def decoding(self) -> dict:
        """`decode`'s keyword arguments for this config: per-label extend and split."""
        return {"extend": {label: dict(self.extend).get(label, 1.0) for label in self.labels},
                "split": {label: dict(self.split).get(label, True) for label in self.labels}}


@dataclass(frozen=True)
class ExtractedSpan:
    """One extracted span: character offsets into the text it was found in, its label and status."""

    start: int
    end: int
    text: str
    label: str
    status: str  # positive | negated | hypothetical
    confidence: float  # mean over its word pieces of the probability of being inside a span
    group: tuple[int, int] | None = None  # the whole phrase this span was split from ("nausea and hair loss")
    # A discontinuous event's pieces ("ciliary and conjunctival hyperemia": "ciliary", "hyperemia"), start and end
    # the outer ones, text the pieces joined by a space; None for a contiguous span (`lexicon.elliptic_events`)
    pieces: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict:
        out = {"start": self.start, "end": self.end, "text": self.text, "label": self.label, "status": self.status,
               "confidence": round(self.confidence, 4)}
        if self.group is not None:
            out["group"] = list(self.group)
        if self.pieces is not None:
            out["pieces"] = [list(piece) for piece in self.pieces]
        return out


def head_size(config: TaggerConfig) -> int:
    return 3 * len(config.labels) + len(STATUSES)


def build_head(hidden: int, config: TaggerConfig):
    import torch

    return torch.nn.Linear(hidden, head_size(config))


def additive_mask(mask, dtype):
    """(batch, tokens) 1/0 -> the additive (batch, 1, 1, tokens) mask the BERT layers take."""
    import torch

    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def device_of(module):
    """Where a module's tensors are: a tagger in training may be on a GPU (a module without any: the CPU)."""
    param = next(module.parameters(), None)
    return param.device if param is not None else "cpu"


def bottom(bert, ids, mask, frozen_layers: int):
    """Embeddings and the frozen layers (no gradients)."""
    import torch

    with torch.no_grad():
        hidden = bert.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        extended = additive_mask(mask, hidden.dtype)
        for layer in bert.encoder.layer[:frozen_layers]:
            hidden = layer(hidden, attention_mask=extended)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return hidden


def top(bert, head, hidden, mask, frozen_layers: int):
    """The trained layers and the head: logits (batch, tokens, head size)."""
    return head(top_hidden(bert, hidden, mask, frozen_layers))


def top_hidden(bert, hidden, mask, frozen_layers: int):
    """The trained layers: the last hidden states (batch, tokens, hidden) the heads read."""
    extended = additive_mask(mask, hidden.dtype)
    for layer in bert.encoder.layer[frozen_layers:]:
        hidden = layer(hidden, attention_mask=extended)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return hidden


# The most characters the tokenizer sees at once. A fast tokenizer's encoding holds a dozen vectors per piece (ids,
# offsets, masks, word ids, the piece strings) before they become Python lists: a 50 MB text passed 3 GB in one call.
# 100,000 characters are some 25,000 pieces: a few MB a call, and the calls cost no more than one whole-text call.
TOKENIZE_CHARS = 100_000
_THROUGH_LAST_SPACE = re.compile(r"(?s).*\s")  # greedy: matches up to and including the range's last white space
_SPACES = re.compile(r"\s+")
_THROUGH_LAST_NON_WORD = re.compile(r"(?s).*\W")


def _cut(text: str, start: int, window: int) -> int:
    """Where the character window from `start` ends: after its last white space (no piece crosses it, and the next
    word starts a word in both tokenizations), else after its last non-word character, else at `window` (a run of
    `window / 2` word characters: one [UNK] either way). Never before `start + window // 2`, so calls stay few."""
    end = start + window
    if end >= len(text):
        return len(text)
    for pattern in (_THROUGH_LAST_SPACE, _THROUGH_LAST_NON_WORD):
        match = pattern.match(text, start + window // 2, end)
        if match:
            return match.end()
    return end


def token_windows(tokenizer, text: str, window: int | None = None):
    """(ids (pieces,) int32, offsets (pieces, 2) int64 into `text`) of each character window of `text` in order
    (`_cut`; `window` characters at most, default `TOKENIZE_CHARS`), no special tokens, no truncation; pieces that
    cover no character dropped."""
    window = window or TOKENIZE_CHARS
    start = 0
    while start < len(text):
        end = _cut(text, start, window)
        encoded = tokenizer(text[start:end], add_special_tokens=False, truncation=False, return_offsets_mapping=True,
                            verbose=False)
        ids = np.asarray(encoded["input_ids"], dtype=np.int32)
        offsets = _without_leading_space(text[start:end], np.asarray(encoded["offset_mapping"], dtype=np.int64))
        keep = offsets[:, 1] > offsets[:, 0]
        yield ids[keep], offsets[keep] + start
        start = end


def _without_leading_space(text: str, offsets: np.ndarray) -> np.ndarray:
    """`offsets` (pieces, 2) with each piece's leading white space left out. A SentencePiece tokenizer (e5-small's)
    counts the space before a word in its first piece ("▁nausea" is " nausea"): a span would start on the space and
    never match a gold span exactly. WordPiece offsets (minilm's) hold no space and are returned as they are."""
    offsets = offsets.reshape(-1, 2).copy()
    space = np.zeros(len(text) + 1, dtype=bool)
    for match in _SPACES.finditer(text):
        space[match.start():match.end()] = True
    while True:
        starts = offsets[:, 0]
        step = space[np.minimum(starts, len(text))] & (starts < offsets[:, 1])
        if not step.any():
            return offsets
        offsets[step, 0] += 1


def tokenize_arrays(tokenizer, text: str, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Word-piece ids (pieces,) and (start, end) character offsets (pieces, 2) of the whole text (`token_windows`):
    20 bytes a piece where Python lists take some 150."""
    parts = list(token_windows(tokenizer, text, window))
    if not parts:
        return np.zeros(0, np.int32), np.zeros((0, 2), np.int64)
    return np.concatenate([ids for ids, _ in parts]), np.concatenate([offsets for _, offsets in parts])


def tokenize(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Word-piece ids and (start, end) character offsets of the whole text as lists (`tokenize_arrays`)."""
    ids, offsets = tokenize_arrays(tokenizer, text)
    return ids.tolist(), [(int(s), int(e)) for s, e in offsets.tolist()]


def windows(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) token ranges of at most max_length - 2 pieces, stepping by `stride`, covering every token."""
    size = max_length - 2
    if size < 1 or stride < 1:
        raise ValueError(f"max_length must be > 2 and stride >= 1, found {max_length}, {stride}")
    stride = min(stride, size)
    if n_tokens <= size:
        return [(0, n_tokens)]
    out, start = [], 0
    while True:
        end = min(start + size, n_tokens)
        out.append((start, end))
        if end == n_tokens:
            return out
        start += stride


def token_tags(offsets: list[tuple[int, int]], spans, labels: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(tags (tokens, labels) in O/B/I, status (tokens,) index or -100) of character spans (start, end, label,
    status). A token is in a span when their characters overlap; the first such token is B."""
    tags = np.zeros((len(offsets), len(labels)), dtype=np.int64)
    status = np.full(len(offsets), -100, dtype=np.int64)
    starts = np.array([s for s, _ in offsets], dtype=np.int64)
    ends = np.array([e for _, e in offsets], dtype=np.int64)
    for start, end, label, mark in sorted(spans, key=lambda s: (s[0], -s[1])):
        if label not in labels:
            continue
        column = labels.index(label)
        inside = np.nonzero((starts < end) & (ends > start))[0]
        if len(inside) == 0 or (tags[inside, column] != O).any():  # overlapping a span already tagged: first wins
            continue
        tags[inside[0], column] = B
        tags[inside[1:], column] = I
        if label in EVENT_LABELS:
            status[inside] = STATUSES.index(mark)
    return tags, status


def _per_label(value, label: str, default):
    return value.get(label, default) if isinstance(value, dict) else value


def decode(text: str, offsets: list[tuple[int, int]], probs: np.ndarray, status_probs: np.ndarray,
           labels: tuple[str, ...], threshold: float | dict, *, extend: float | dict = 1.0,
           split: bool | dict = True) -> list[ExtractedSpan]:
    """Spans from averaged per-token probabilities (tokens, labels, 3) and status probabilities (tokens, 3).

    Each of `threshold`, `extend`, `split` is one value for all labels or a dict per label. A span is a run of word
    pieces whose in-span probability (1 - P(O)) reaches ``threshold * extend`` holding at least one that reaches
    `threshold` (hysteresis: extend < 1 keeps long phrases whole); with `split`, a piece more likely B than I
    starts a new span inside a run. Spans of one label that only a hyphen or slash separates ("non-convulsive"
    cut at "-") are joined; spans are widened to whole words. No span runs over a line break (`_BREAK`)."""
    out = []
    new_line = np.zeros(len(offsets), bool)
    breaks = np.fromiter((m.start() for m in _BREAK.finditer(text)), dtype=np.int64)
    if len(breaks) and len(offsets) > 1:
        bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        # a break between piece j - 1's end and piece j's start: more breaks before the start than before the end
        new_line[1:] = np.searchsorted(breaks, bounds[1:, 0]) > np.searchsorted(breaks, bounds[:-1, 1])
    for column, label in enumerate(labels):
        cut = _per_label(threshold, label, 0.5)
        found: list[ExtractedSpan] = []
        p = probs[:, column, :]
        score = 1.0 - p[:, O]
        inside = score >= cut * _per_label(extend, label, 1.0)
        strong = score >= cut
        begins = ((p[:, B] >= p[:, I]) if _per_label(split, label, True) else np.zeros(len(score), bool)) | new_line
        i, n = 0, len(offsets)
        while i < n:
            if not inside[i]:
                i += 1
                continue
            j = i + 1
            while j < n and inside[j] and not begins[j]:
                j += 1
            if not strong[i:j].any():
                i = j
                continue
            start, end = int(offsets[i][0]), int(offsets[j - 1][1])  # offsets may be a numpy array
            start, end = _whole_words(text, start, end)
            if trailing := TRAILING.search(text, start, end):
                end = trailing.start()
            if (leading := LEADING.match(text, start, end)) and leading.end() < end:
                start = leading.end()
            marks = status_probs[i:j].mean(axis=0)
            confidence = float((1.0 - p[i:j, O]).mean())
            status = STATUSES[int(marks.argmax())] if label in EVENT_LABELS else "positive"
            if found and found[-1].end <= start and _JOIN.fullmatch(text[found[-1].end:start]):
                last = found.pop()
                start, confidence = last.start, (last.confidence + confidence) / 2
                status = last.status
            found.append(ExtractedSpan(start, end, text[start:end], label, status, confidence))
            i = j
        out.extend(found)
    # word widening can make two pieces of one word two equal spans: keep one
    seen, unique = set(), []
    for span in sorted(out, key=lambda s: (s.start, s.end, s.label)):
        if (span.start, span.end, span.label) not in seen:
            seen.add((span.start, span.end, span.label))
            unique.append(span)
    return unique


def overlap_test(ranges) -> Callable[[int, int], bool]:
    """Whether [start, end) overlaps any of `ranges` ((start, end) pairs), in log time: with the ranges sorted by
    start, the largest end among those starting before `end` says it (linear-log, not ranges x queries: 10^9 for the
    spans of a 5 MB text)."""
    ranges = sorted(ranges)
    starts = [start for start, _ in ranges]
    reach = list(itertools.accumulate((end for _, end in ranges), max))

    def overlaps(start: int, end: int) -> bool:
        i = bisect.bisect_left(starts, end)
        return bool(i) and reach[i - 1] > start

    return overlaps


def lexicon_spans(text: str, offsets, probs: np.ndarray, status_probs: np.ndarray, labels: tuple[str, ...],
                  spans: list[ExtractedSpan], found: list[tuple[int, int]], cuts: dict[str, float]
                  ) -> list[ExtractedSpan]:
    """`spans` with the dictionary names `found` in `text` added as spans of each label of `cuts`, where the
    tagger's evidence reaches that label's cut and no span of the label overlaps them already.

    The evidence of a name is the mean over its word pieces of the higher in-span probability (1 - P(O)) of the
    label's own head and of the adverse-event phrase head: a name inside a phrase the phrase head finds counts, so
    does a term the terms head half-found; a drug's or an indication's head lends none."""
    if not found or not cuts or not len(offsets):
        return spans
    out = list(spans)
    for label, cut in cuts.items():
        evidence = Evidence(offsets, probs, labels, label)
        taken = overlap_test((s.start, s.end) for s in spans if s.label == label)
        for start, end in found:
            if taken(start, end):
                continue
            pieces = evidence.pieces(start, end)
            if not len(pieces) or (score := evidence.mean(pieces)) < cut:
                continue
            status = STATUSES[int(status_probs[pieces].mean(axis=0).argmax())] if label in EVENT_LABELS else "positive"
            out.append(ExtractedSpan(start, end, text[start:end], label, status, score))
    return sorted(out, key=lambda s: (s.start, s.end, s.label))


class Evidence:
    """The tagger's evidence that characters [start, end) are an event of `label`: the mean over their word pieces
    of the higher in-span probability (1 - P(O)) of the label's head and the adverse-event phrase head."""

    def __init__(self, offsets, probs: np.ndarray, labels: tuple[str, ...], label: str = AR) -> None:
        self.offsets = np.asarray(offsets).reshape(-1, 2)
        heads = [labels.index(head) for head in dict.fromkeys((label, AE)) if head in labels]
        self.inside = (1.0 - probs[:, heads, O]).max(axis=1) if len(self.offsets) else np.zeros(0)

    def pieces(self, start: int, end: int) -> np.ndarray:
        return np.arange(*token_range(self.offsets, start, end))

    def mean(self, pieces: np.ndarray) -> float:
        return float(self.inside[pieces].mean()) if len(pieces) else 0.0

    def __call__(self, start: int, end: int) -> float:
        return self.mean(self.pieces(start, end))


def _whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) to whole words: a span never starts or ends inside a run of word characters."""
    while start > 0 and _WORD.match(text[start - 1]) and _WORD.match(text[start]):
        start -= 1
    while end < len(text) and _WORD.match(text[end]) and _WORD.match(text[end - 1]):
        end += 1
    return start, end


def split_logits(logits, n_labels: int):
    """(…, head size) -> ((…, labels, 3), (…, 3))."""
    tag = logits[..., : 3 * n_labels]
    return tag.reshape(*tag.shape[:-1], n_labels, 3), logits[..., 3 * n_labels:]


__all__ = ["AR", "LEADING", "TOKENIZE_CHARS", "TRAILING", "Evidence", "ExtractedSpan", "TaggerConfig", "bottom",
           "build_head", "decode", "head_size", "lexicon_spans", "overlap_test", "split_logits", "token_tags",
           "token_windows", "tokenize", "tokenize_arrays", "top", "windows"]
