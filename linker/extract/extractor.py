"""Loading and running the shipped tagger (`linker/models/linker-ae/`) or one being trained."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from linker.errors import ConfigError
from linker.extract.assertion import assert_spans
from linker.extract.data import AE, AR, BENEFIT
from linker.extract.model import (
    ExtractedSpan,
    TaggerConfig,
    bottom,
    build_head,
    decode,
    split_logits,
    tokenize,
    top,
    windows,
)

log = logging.getLogger(__name__)

NAME = "linker-ae"
KIND = "tagger"
# Which head gives the AdverseEvent spans: "terms" (TAC 2017's convention: "nausea", "rash", each its own span, the
# severity left out; learnt from drug labels only, it finds next to nothing in narrative text), "phrases" (PHEE's:
# the whole effect, "severe rash and nausea"; learnt from case reports), or "auto" (the default: the terms, and the
# phrases where no term overlaps them). On the dev data: TAC exact F1 72.0 / 16.8 / 68.9, PHEE EM_F1 0.0 / 53.0 /
# 52.8 for terms / phrases / auto.
STYLES = ("auto", "terms", "phrases")
# Who says a span is negated or hypothetical: "rules" (the default: the status head, then the NegEx-style cues of
# `linker.extract.assertion` for the spans it calls positive) or "model" (the status head alone).
ASSERTIONS = ("rules", "model")
BATCH = 32  # windows per forward pass


class Extractor:
    """A tagger: the base transformer with its trained top layers, the head, the tokenizer and the config."""

    def __init__(self, bert, tokenizer, head, config: TaggerConfig, *, name: str = "", revision: str = "") -> None:
        self.bert, self.tokenizer, self.head, self.config = bert, tokenizer, head, config
        self.name, self.revision = name, revision
        self._lock = threading.Lock()  # torch modules are shared: one forward pass at a time

    def probabilities(self, text: str) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
        """(token offsets, tag probabilities (tokens, labels, 3), status probabilities (tokens, 3)) of one text,
        averaged over the windows that hold each token."""
        return self.probabilities_many([text])[0]

    def probabilities_many(self, texts: list[str]):
        import torch

        cfg, n_labels = self.config, len(self.config.labels)
        cls, sep, pad = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id or 0
        tokenized = [tokenize(self.tokenizer, text) for text in texts]
        jobs = [(t, a, b) for t, (ids, _) in enumerate(tokenized)
                for a, b in (windows(len(ids), cfg.max_length, cfg.stride) if ids else [])]
        sums = [np.zeros((len(ids), n_labels, 3), np.float32) for ids, _ in tokenized]
        status = [np.zeros((len(ids), 3), np.float32) for ids, _ in tokenized]
        counts = [np.zeros(len(ids), np.float32) for ids, _ in tokenized]
        jobs.sort(key=lambda job: job[2] - job[1])  # similar lengths together: less padding
        with self._lock, torch.inference_mode():
            self.bert.eval()
            for first in range(0, len(jobs), BATCH):
                batch = jobs[first:first + BATCH]
                width = max(b - a for _, a, b in batch) + 2
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, (t, a, b) in enumerate(batch):
                    piece = [cls, *tokenized[t][0][a:b], sep]
                    ids[row, : len(piece)] = torch.tensor(piece)
                    mask[row, : len(piece)] = 1
                hidden = bottom(self.bert, ids, mask, cfg.frozen_layers)
                tags, marks = split_logits(top(self.bert, self.head, hidden, mask, cfg.frozen_layers), n_labels)
                tags, marks = tags.softmax(-1).float().numpy(), marks.softmax(-1).float().numpy()
                for row, (t, a, b) in enumerate(batch):
                    sums[t][a:b] += tags[row, 1: 1 + b - a]
                    status[t][a:b] += marks[row, 1: 1 + b - a]
                    counts[t][a:b] += 1
        out = []
        for (_, offsets), s, m, c in zip(tokenized, sums, status, counts, strict=True):
            c = np.maximum(c, 1)[:, None]
            out.append((offsets, s / c[:, :, None] if len(s) else s, m / c))
        return out

    def thresholds(self, threshold: float | None = None) -> dict:
        labels = self.config.labels
        return {label: self.config.cut(label) if threshold is None else threshold for label in labels}

    def extract(self, texts: list[str], *, threshold: float | None = None, labels: tuple[str, ...] | None = None,
                style: str = "auto", assertion: str = "rules") -> list[list[ExtractedSpan]]:
        """The spans of each text (offsets into it), sorted by position. `style` (`STYLES`) picks the head whose
        spans are returned as AdverseEvent (`select_style`); `assertion` (`ASSERTIONS`) who marks a span
        negated or hypothetical."""
        if style not in STYLES:
            raise ConfigError(f"style: expected one of {', '.join(STYLES)}, found {style!r}")
        if assertion not in ASSERTIONS:
            raise ConfigError(f"assertion: expected one of {', '.join(ASSERTIONS)}, found {assertion!r}")
        cuts = self.thresholds(threshold)
        result = []
        for text, (offsets, probs, marks) in zip(texts, self.probabilities_many(list(texts)), strict=True):
            spans = decode(text, offsets, probs, marks, self.config.labels, cuts,
                           **self.config.decoding()) if offsets else []
            spans = select_style(spans, style)
            if assertion == "rules":
                spans = assert_spans(text, spans, (AE, BENEFIT))
            result.append([s for s in spans if labels is None or s.label in labels])
        return result


def select_style(spans: list[ExtractedSpan], style: str) -> list[ExtractedSpan]:
    """AdverseEvent spans from the head of `style`; every other label as decoded."""
    from dataclasses import replace

    if style == "terms":
        return [replace(s, label=AE) if s.label == AR else s for s in spans if s.label != AE]
    if style == "phrases":
        return [s for s in spans if s.label != AR]
    # auto: the terms, and the phrases where no term was found (narrative text the label-trained terms head misses)
    terms = [s for s in spans if s.label == AR]
    phrases = [s for s in spans if s.label == AE and not any(s.start < t.end and t.start < s.end for t in terms)]
    kept = [replace(s, label=AE) if s.label == AR else s for s in spans if s.label != AE] + phrases
    return sorted(kept, key=lambda s: (s.start, s.end, s.label))


_CACHE: dict[str, Extractor] = {}
_CACHE_LOCK = threading.Lock()


def release_path(name_or_folder: str | Path) -> Path:
    from linker.models import release_folder

    return release_folder(NAME) if str(name_or_folder) == NAME else Path(name_or_folder)


def load_extractor(name_or_folder: str | Path = NAME, *, threads: int | None = None) -> Extractor:
    """The tagger of a release folder (`linker-ae`, the shipped one, by default): every file checked against its
    manifest's sha256 before anything loads, the base encoder loaded offline, the trained tensors put over it."""
    key = str(release_path(name_or_folder).resolve())
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(release_path(name_or_folder), threads)
        return _CACHE[key]


def _load(folder: Path, threads: int | None) -> Extractor:
    import torch

    from linker.encoders import load_encoder, resolve_encoder, transformer_module
    from linker.models import load_tensors, read_release

    started = time.perf_counter()
    release = read_release(folder)  # sha256 of every file, before anything loads
    manifest = release.manifest
    if manifest.get("kind") != KIND:
        raise ConfigError(f"{folder}: a release of kind {manifest.get('kind')!r}, not a tagger ({KIND!r})")
    spec = resolve_encoder(release.base)
    if manifest.get("base_revision") and spec.revision != manifest["base_revision"]:
        raise ConfigError(f"{folder}: trained on {release.base} {manifest['base_revision']}, but this machine has "
                          f"{spec.revision}; install that version, or retrain with `linker train extractor`")
    encoder = load_encoder(spec, threads=threads, device="cpu")
    bert = transformer_module(encoder.model)
    tokenizer = encoder.model.tokenizer
    thresholds = manifest["threshold"]
    config = TaggerConfig(labels=tuple(manifest["labels"]), max_length=int(manifest["max_length"]),
                          stride=int(manifest["stride"]), frozen_layers=int(manifest["frozen_layers"]),
                          threshold=0.5, thresholds=tuple(sorted((str(k), float(v)) for k, v in thresholds.items())),
                          extend=tuple(sorted((str(k), float(v)) for k, v in manifest.get("extend", {}).items())),
                          split=tuple(sorted((str(k), bool(v)) for k, v in manifest.get("split", {}).items())))
    tensors = load_tensors(release)
    head = build_head(bert.config.hidden_size, config)
    head_state = {k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")}
    body = {k: v for k, v in tensors.items() if not k.startswith("head.")}
    state = bert.state_dict()
    from linker.errors import InputFormatError
    from linker.models import WEIGHTS

    for k, v in body.items():
        if k not in state or tuple(state[k].shape) != tuple(v.shape):
            raise InputFormatError(folder / WEIGHTS, f"tensor {k} {tuple(v.shape)} of base {release.base!r}",
                                   "no such tensor" if k not in state else str(tuple(state[k].shape)))
    with torch.no_grad():
        for k, v in body.items():
            state[k].copy_(v)
        head.load_state_dict(head_state)
    bert.eval()
    head.eval()
    log.info("loaded tagger %s in %.1f s", release.revision, time.perf_counter() - started)
    return Extractor(bert, tokenizer, head, config, name=release.name, revision=release.revision)


__all__ = ["ASSERTIONS", "NAME", "STYLES", "Extractor", "load_extractor", "release_path", "select_style"]
