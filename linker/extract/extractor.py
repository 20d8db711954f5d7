"""Loading and running the shipped tagger (`linker/models/linker-ae/`) or one being trained."""

from __future__ import annotations

import bisect
import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from linker.errors import ConfigError, InputFormatError
from linker.language import primary
from linker.registry import Registry
from linker.extract.assertion import assert_spans, negated_names
from linker.extract.data import AE, AR, BENEFIT, DRUG, INDICATION
from linker.extract.decision import CLASSES as DECISION_CLASSES
from linker.extract.decision import decide
from linker.extract.lexicon import (
    FILLERS,
    Lexicon,
    elliptic_events,
    modifier_words,
    split_phrases,
    without_footnote_marks,
)
from linker.extract.model import (
    LEADING,
    TRAILING,
    Evidence,
    ExtractedSpan,
    TaggerConfig,
    bottom,
    build_head,
    decode,
    device_of,
    head_size,
    lexicon_spans,
    overlap_test,
    softmax,
    split_logits,
    tokenize_arrays,
    top_hidden,
    windows,
)

log = logging.getLogger(__name__)

NAME = "linker-ae"
# Word pieces in one call from which a numpy tagger hands its forward passes to its torch twin. On one thread numpy
# costs more than torch, the more so the longer the windows: PHEE dev's 961 sentences (30,942 pieces) 1.1x (linker-ae
# 86.6 against 95.1 sentences/s; linker-ae-multi 38.5 against 43.6), TAC 2017 dev's 20 labels (681 windows of up to
# 126 pieces, 83,630) 1.2x (30 s against 25). Loading torch's twin (~4 s) is repaid from some 65,000 pieces of
# labels: `annotate` of a few texts, a label, the service's requests stay in numpy; a corpus goes to torch.
TORCH_MIN_PIECES = 65_536
MULTI = "linker-ae-multi"  # the multilingual tagger (es, fr, de, nl, ja and en) on multilingual-e5-small
BY_LANGUAGE = "auto"  # `load_extractor`'s default: each text's tagger by its language (`ByLanguage`)
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
# What loading a tagger imports: the base encoder through sentence-transformers, the trained tensors (the dense extra).
MODULES = ("torch", "transformers", "sentence_transformers", "safetensors")
# Ranges of a release's decoding fields: a window holds at least one word piece besides [CLS] and [SEP] and at most
# BERT's 512 positions; label names and counts far above the 4 heads that ship.
MAX_LENGTH = 512
MAX_LABELS = 64
MAX_FROZEN = 64


class Extractor:
    """A tagger: the base transformer with its trained top layers, the head, the tokenizer and the config.

    `bert` and `head` are torch modules (training, a GPU, bf16), or `bert` is a `linker.runtime.BertRuntime` and
    `head` a (weight, bias) pair of arrays: the same forward pass in numpy, which a shipped tagger runs on the CPU
    (`_load_tagger`) so that `annotate` needs no torch, whose import took ~3 s of its first answer. `decision`: the
    decision head's (weight, bias) arrays over the same hidden states (`linker.extract.decision`), or None."""

    def __init__(self, bert, tokenizer, head, config: TaggerConfig, *, name: str = "", revision: str = "",
                 threads: int | None = None, torch_loader: Callable[[], Extractor] | None = None,
                 decision: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.bert, self.tokenizer, self.head, self.config = bert, tokenizer, head, config
        self.decision = decision
        self.name, self.revision, self.threads = name, revision, threads
        self.runtime = "numpy" if isinstance(head, tuple) else "torch"
        self._torch_loader, self._torch = torch_loader, None  # the torch twin of a numpy tagger, for bulk calls
        self._lock = threading.Lock()  # torch modules are shared: one forward pass at a time

    def probabilities(self, text: str) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
        """(token offsets, tag probabilities (tokens, labels, 3), status probabilities (tokens, 3)) of one text,
        averaged over the windows that hold each token."""
        return self.probabilities_many([text])[0]

    def probabilities_many(self, texts: list[str]) -> list[tuple[list[tuple[int, int]], np.ndarray, np.ndarray]]:
        """`probabilities` of each text."""
        return [([(int(s), int(e)) for s, e in offsets.tolist()], probs, marks)
                for offsets, probs, marks in self._probabilities(texts)]

    def _probabilities(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`probabilities` of each text, its offsets an array (tokens, 2): ids, offsets and sums of probabilities
        take 84 bytes a token (lists of tuples would add ~150), so a 5 MB text (~1.15M tokens) holds ~100 MB."""
        return [out[:3] for out in self._per_token(texts)]

    def hidden_many(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(token offsets (tokens, 2), the last hidden states (tokens, hidden) float32) of each text, averaged over
        the windows that hold each token: what the heads read (the decision head learns from them)."""
        return self._per_token(texts, hidden=True)

    def _per_token(self, texts: list[str], *, hidden: bool = False) -> list[tuple]:
        """Per text, its offsets (tokens, 2) and each of `_forward`'s outputs averaged over the windows that hold each
        token: tag and status probabilities and, with a decision head, its logits (else None); with `hidden`, the
        last hidden states alone."""
        cfg = self.config
        cls, sep, pad = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id or 0
        tokenized = [tokenize_arrays(self.tokenizer, text) for text in texts]
        jobs = [(t, a, b) for t, (ids, _) in enumerate(tokenized)
                for a, b in (windows(len(ids), cfg.max_length, cfg.stride) if len(ids) else [])]
        sums: list[list[np.ndarray]] | None = None  # per output, per text: allocated at the first batch's shapes
        counts = [np.zeros(len(ids), np.float32) for ids, _ in tokenized]
        jobs.sort(key=lambda job: job[2] - job[1])  # similar lengths together: less padding
        forward = self._forward
        if self.runtime == "numpy" and sum(b - a for _, a, b in jobs) >= TORCH_MIN_PIECES:
            forward = self.torch_twin()._forward
        with self._lock:
            for first in range(0, len(jobs), BATCH):
                batch = jobs[first:first + BATCH]
                width = max(b - a for _, a, b in batch) + 2
                ids = np.full((len(batch), width), pad, dtype=np.int64)
                mask = np.zeros((len(batch), width), dtype=np.int64)
                for row, (t, a, b) in enumerate(batch):
                    ids[row, 0], ids[row, 1 + b - a] = cls, sep
                    ids[row, 1: 1 + b - a] = tokenized[t][0][a:b]
                    mask[row, : 2 + b - a] = 1
                outputs = forward(ids, mask, hidden=hidden)
                if sums is None:
                    sums = [[np.zeros((len(ids_), *out.shape[2:]), np.float32) for ids_, _ in tokenized]
                            for out in outputs]
                for row, (t, a, b) in enumerate(batch):
                    for total, out in zip(sums, outputs, strict=True):
                        total[t][a:b] += out[row, 1: 1 + b - a]
                    counts[t][a:b] += 1
        if sums is None:  # no text has a word piece: the outputs' shapes without a forward pass
            n_labels, width = len(cfg.labels), self._hidden_size()
            shapes = [(width,)] if hidden else [(n_labels, 3), (3,)] + ([(len(DECISION_CLASSES),)] if self.decision
                                                                         else [])
            sums = [[np.zeros((len(ids_), *shape), np.float32) for ids_, _ in tokenized] for shape in shapes]
        out = []
        for t, (_, offsets) in enumerate(tokenized):
            c = np.maximum(counts[t], 1)
            for total in sums:  # in place: no second copy of a long text's outputs
                total[t] /= c.reshape(-1, *([1] * (total[t].ndim - 1)))
            averaged = [total[t] for total in sums]
            if not hidden and len(averaged) == 2:
                averaged.append(None)
            out.append((offsets, *averaged))
        return out

    def _hidden_size(self) -> int:
        return self.head[0].shape[1] if self.runtime == "numpy" else self.head.in_features

    def torch_twin(self) -> Extractor:
        """This numpy tagger's torch twin, loaded on first need (the same tensors; the probabilities agree within
        1e-5), or itself."""
        if self._torch_loader is None:
            return self
        if self._torch is None:
            self._torch = self._torch_loader()
        return self._torch

    def _forward(self, ids: np.ndarray, mask: np.ndarray, *, hidden: bool = False) -> tuple[np.ndarray, ...]:
        """Tag and status probabilities, (batch, width, labels, 3) and (batch, width, 3) float32, of token `ids`
        (batch, width) int64 with `mask` 0/1, and the decision head's logits (batch, width, classes) where there is
        one; with `hidden`, the last hidden states (batch, width, hidden) alone."""
        n_labels = len(self.config.labels)
        if self.runtime == "numpy":
            from linker.precision import available_cpus
            from linker.runtime import _blas_threads

            weight, bias = self.head
            with _blas_threads(self.threads or available_cpus()):
                states = self.bert.hidden(ids, mask)
                if hidden:
                    return (states,)
                logits = states @ weight.T + bias
                decisions = () if self.decision is None else (states @ self.decision[0].T + self.decision[1],)
            return (*(softmax(part) for part in split_logits(logits, n_labels)), *decisions)
        import torch

        device = device_of(self.bert)
        with torch.inference_mode():
            self.bert.eval()
            ids, mask = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
            states = top_hidden(self.bert, bottom(self.bert, ids, mask, self.config.frozen_layers), mask,
                                self.config.frozen_layers)
            if hidden:
                return (states.float().cpu().numpy(),)
            tags, marks = split_logits(self.head(states), n_labels)
            decisions = ()
            if self.decision is not None:
                decisions = (states.float().cpu().numpy() @ self.decision[0].T + self.decision[1],)
            return tags.softmax(-1).float().cpu().numpy(), marks.softmax(-1).float().cpu().numpy(), *decisions

    def thresholds(self, threshold: float | None = None) -> dict:
        labels = self.config.labels
        return {label: self.config.cut(label) if threshold is None else threshold for label in labels}

    def extract(self, texts: list[str], *, threshold: float | None = None, labels: tuple[str, ...] | None = None,
                style: str = "auto", assertion: str = "rules", lexicon: Lexicon | None = None,
                langs: list[str | None] | None = None) -> list[list[ExtractedSpan]]:
        """The spans of each text (offsets into it), sorted by position. `style` (`STYLES`) picks the head whose
        spans are returned as AdverseEvent (`select_style`); `assertion` (`ASSERTIONS`) who marks a span
        negated or hypothetical; `lexicon`: the names of the dictionary the spans will be coded with, taken as
        evidence where the release says how (`TaggerConfig.lexicon`; `linker.extract.lexicon`), and, in every style
        but phrases, to split a phrase or term holding several names into one span per name (`split_phrases`) and
        to write two events that share a word once each ("ciliary and conjunctival hyperemia": `elliptic_events`); `langs`:
        each text's language for the assertion rules (None: English; a language without cue lists keeps the tagger's
        statuses, `linker.extract.assertion.cues_for`)."""
        if style not in STYLES:
            raise ConfigError(f"style: expected one of {', '.join(STYLES)}, found {style!r}")
        if assertion not in ASSERTIONS:
            raise ConfigError(f"assertion: expected one of {', '.join(ASSERTIONS)}, found {assertion!r}")
        if langs is not None and len(langs) != len(texts):
            raise ConfigError(f"langs: expected one language per text ({len(texts)}), found {len(langs)}")
        cuts = self.thresholds(threshold)
        result = []
        for text, lang, (offsets, probs, marks, decisions) in zip(texts, langs or [None] * len(texts),
                                                                  self._per_token(list(texts)), strict=True):
            spans = decode(text, offsets, probs, marks, self.config.labels, cuts,
                           **self.config.decoding()) if len(offsets) else []
            if lexicon is not None:
                found = lexicon.find(text)
                if self.config.lexicon:
                    spans = lexicon_spans(text, offsets, probs, marks, self.config.labels, spans, found,
                                          dict(self.config.lexicon))
                if style != "phrases":  # one code per event; `phrases` keeps PHEE's whole phrases
                    spans = split_phrases(text, spans, found)
            spans = dosed_as_drugs(text, without_treated(select_style(spans, style, text, lang)))
            if lexicon is not None:
                spans = without_footnote_marks(text, spans, lexicon)
                if style != "phrases":  # one code per event, written once for two
                    spans = elliptic_events(text, spans, lexicon)
            if assertion == "rules":
                spans = assert_spans(text, spans, (AE, BENEFIT), lang=lang)
                if lexicon is not None:  # a negated name the tagger saw nothing of is still returned, not coded
                    spans = negated_names(text, spans, found, Evidence(offsets, probs, self.config.labels), lang=lang)
            if decisions is not None and self.config.decision_cut is not None:  # after the statuses: a negated event
                spans = decide(spans, offsets, decisions, self.config.decision_cut)  # stays one, not coded
            result.append([s for s in spans if labels is None or s.label in labels])
        return result


def select_style(spans: list[ExtractedSpan], style: str, text: str = "", lang: str | None = None
                 ) -> list[ExtractedSpan]:
    """AdverseEvent spans from the head of `style`; every other label as decoded. `auto` keeps of a phrase that a
    term overlaps its coordinated parts that none does (`uncovered_parts`; needs the `text`)."""
    if style == "terms":
        return [replace(s, label=AE) if s.label == AR else s for s in spans if s.label != AE]
    if style == "phrases":
        return [s for s in spans if s.label != AR]
    # auto: the terms, and the phrases where no term was found (narrative text the label-trained terms head misses)
    term_at = overlap_test((s.start, s.end) for s in spans if s.label == AR)
    phrases = [part for s in spans if s.label == AE
               for part in ([s] if not term_at(s.start, s.end) else uncovered_parts(text, s, term_at, lang))]
    kept = [replace(s, label=AE) if s.label == AR else s for s in spans if s.label != AE] + phrases
    return sorted(kept, key=lambda s: (s.start, s.end, s.label))


# The words that coordinate two events, by language (`linker.language.primary`); a comma or a semicolon parts a
# list of them too ("nausea, vomiting and diarrhea"). Japanese spans are parted by `lexicon.split_phrases`.
COORDINATORS = {"en": ("and/or", "and", "or"), "es": ("y", "e", "o", "u", "ni"), "fr": ("et", "ou"),
                "de": ("und", "oder", "sowie"), "nl": ("en", "of")}
_COORDINATED = {lang: re.compile(rf"\s*[,;]?\s+(?:{'|'.join(words)})\s+|\s*[,;]\s*", re.IGNORECASE)
                for lang, words in COORDINATORS.items()}


def coordinated_parts(text: str, start: int, end: int, lang: str | None = None) -> list[tuple[int, int]]:
    """The (start, end) of each part of text[start:end] between its coordinators (`COORDINATORS` of `lang`, commas,
    semicolons); the whole where the language has none listed."""
    splitter = _COORDINATED.get(primary(lang))
    if splitter is None:
        return [(start, end)]
    bounds, at = [], start
    for m in splitter.finditer(text, start, end):
        bounds.append((at, m.start()))
        at = m.end()
    return bounds + [(at, end)]


def uncovered_parts(text: str, phrase: ExtractedSpan, term_at: Callable[[int, int], bool], lang: str | None
                    ) -> list[ExtractedSpan]:
    """The coordinated parts of `phrase` ("dizziness and a strange tingling in both hands") that no term overlaps
    (`term_at`) and that hold a word other than a grade or a filler, each an AdverseEvent span of its own, the
    phrase kept as their ``group``; in English, trimmed of joining words as `decode` trims a span ("dizziness").

    A term that the tagger or the dictionary found in one part of a phrase says nothing of the others: before, the
    phrase went whole, and with it every other event it held ("hearing loss and an unsteady gait" gave Unsteady
    gait alone). On PHEE dev (linker-ae, the default index's names), of the parts of the coordinated gold Effect
    phrases (parted the same way) a predicted event overlapped 74.0% before, 84.7% after, the predictions that
    overlap a gold Effect 89.1% before, 88.9% after; TAC 2017 dev's exact F1 moved by 0.01 (`eval/extract`)."""
    lang = primary(lang)
    if not text or lang not in _COORDINATED:
        return []
    grades = FILLERS | modifier_words()
    out = []
    for start, end in coordinated_parts(text, phrase.start, phrase.end, lang):
        if lang == "en":
            if (trailing := TRAILING.search(text, start, end)) and trailing.start() > start:
                end = trailing.start()
            if (leading := LEADING.match(text, start, end)) and leading.end() < end:
                start = leading.end()
        if (start < end and not term_at(start, end)
                and any(word.lower() not in grades for word in re.findall(r"\w+", text[start:end]))):
            out.append(replace(phrase, start=start, end=end, text=text[start:end], pieces=None,
                               group=phrase.group or (phrase.start, phrase.end)))
    return out


# A dose: a number and a unit of mass, volume or activity ("0.75 mg", "5 mg/kg", "(10 IU"), not a concentration
# ("250 mg/dL", "8 g per dL": a lab value, which follows an event's name: "hemoglobin 8 g/dL"). What a label writes
# one after is a drug ("TRULICITY 0.75 mg"): on PHEE train and dev, 78 gold spans are followed by one, all drugs.
_DOSE = re.compile(r"\s*\(?\s*\d+(?:[.,]\d+)?\s*(?:mg|mcg|µg|μg|g|mL|IU|units?)(?:/(?:kg|m2|m²|day|dose))?\b"
                   r"(?!\s*(?:/|per\b))", re.IGNORECASE)


def dosed_as_drugs(text: str, spans: list[ExtractedSpan]) -> list[ExtractedSpan]:
    """The spans with every AdverseEvent span directly followed by a dose relabelled Drug (or dropped where a
    Drug span holds the same words): the tagger read 13 such brand names as events on TAC 2017 dev ("Trulicity
    1.5 mg"), none an event."""
    drugs = {(s.start, s.end) for s in spans if s.label == DRUG}
    out = []
    for span in spans:
        if span.label == AE and span.pieces is None and _DOSE.match(text, span.end):
            if (span.start, span.end) in drugs:
                continue
            span = replace(span, label=DRUG, status="positive")
        out.append(span)
    return out


NOT_EVENTS = (INDICATION, BENEFIT)  # what the drug is given for, and what it relieved: no adverse event of it


def without_treated(spans: list[ExtractedSpan]) -> list[ExtractedSpan]:
    """The spans less the AdverseEvent spans that an Indication span (the disorder the drug is given for: "given
    ibuprofen for nausea") or a TherapeuticEffect span (what it relieved: "ibuprofen cleared my rash") overlaps with
    at least their confidence: the tagger read them as what is treated, not as what the drug caused. A release
    without these heads returns `spans` as they are."""
    rivals = {label: sorted((s.start, s.end, s.confidence) for s in spans if s.label == label) for label in NOT_EVENTS}
    rivals = {label: found for label, found in rivals.items() if found}
    if not rivals:
        return spans
    # one head's spans never overlap: sorted by start, they are sorted by end too, and those overlapping a span
    # are one run of them
    bounds = {label: ([a for a, _, _ in found], [b for _, b, _ in found]) for label, found in rivals.items()}

    def treated(span: ExtractedSpan) -> bool:
        for label, found in rivals.items():
            starts, ends = bounds[label]
            overlapping = found[bisect.bisect_right(ends, span.start):bisect.bisect_left(starts, span.end)]
            if any(confidence >= span.confidence for _, _, confidence in overlapping):
                return True
        return False

    return [s for s in spans if s.label != AE or not treated(s)]


_CACHE: dict[str, Extractor] = {}
_CACHE_LOCK = threading.Lock()


def release_path(name_or_folder: str | Path) -> Path:
    from linker.models import release_folder

    return release_folder(str(name_or_folder)) if str(name_or_folder) in (NAME, MULTI) else Path(name_or_folder)


def release_paths(model: str | Path) -> list[Path]:
    """The release folders a `--model` value names: both shipped taggers for "auto" (`ByLanguage`), else one."""
    return [release_path(name) for name in ((NAME, MULTI) if str(model) == BY_LANGUAGE else (model,))]


def load_extractor(name_or_folder: str | Path = BY_LANGUAGE, *, threads: int | None = None) -> Extractor | ByLanguage:
    """The taggers by language (``"auto"``, the default: `ByLanguage`), or the extractor of a release folder (a
    shipped one by name, `linker-ae` or `linker-ae-multi`), loaded by the entry of `EXTRACTORS` its manifest's
    ``kind`` names: for a tagger, every file checked against its manifest's sha256
    before anything loads, the base encoder loaded offline, the trained tensors put over it."""
    if str(name_or_folder) == BY_LANGUAGE:
        return ByLanguage(threads)
    key = str(release_path(name_or_folder).resolve())
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(release_path(name_or_folder), threads)
        return _CACHE[key]


def tagger_for(lang: str | None) -> str:
    """The shipped tagger of a text's language: linker-ae for English, linker-ae-multi for any other (its base,
    multilingual-e5-small, reads some hundred languages; linker measures es, fr, de, nl and ja); "en-US" is English."""
    from linker.language import primary

    return NAME if primary(lang) == "en" else MULTI


def text_languages(texts: Sequence[str], langs: Sequence[str | None] | None = None,
                   lang: str | None = None) -> list[str]:
    """Each text's language: its own in `langs`, else `lang`, else detected (`linker.language.detect`)."""
    from linker.language import detect

    return [(langs[t] if langs is not None else None) or lang or detect(text) for t, text in enumerate(texts)]


class ByLanguage:
    """The shipped taggers, each text tagged by the one of its language (`tagger_for`), each loaded the first time
    a text needs it: an English-only run never loads the multilingual tagger. What `load_extractor` returns for
    ``"auto"``, and what `linker annotate` and the service use unless told a tagger."""

    name = BY_LANGUAGE

    def __init__(self, threads: int | None = None) -> None:
        from linker.models import read_release

        self.threads = threads
        # both releases' revisions, read from their manifests without loading either: a report names what ran
        self.revision = "; ".join(read_release(folder, verify=False).revision for folder in release_paths(BY_LANGUAGE))

    def extract(self, texts: list[str], *, langs: Sequence[str | None] | None = None, **options) -> list[list]:
        """`Extractor.extract` of each text by its language's tagger (`text_languages`: given, or detected)."""
        langs = text_languages(texts, langs)
        groups: dict[str, list[int]] = {}
        for t, lang in enumerate(langs):
            groups.setdefault(tagger_for(lang), []).append(t)
        out: list[list] = [[] for _ in texts]
        for name, members in groups.items():
            found = load_extractor(name, threads=self.threads).extract(
                [texts[t] for t in members], langs=[langs[t] for t in members], **options)
            for t, spans in zip(members, found, strict=True):
                out[t] = spans
        return out


def _probability(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0.0 <= value <= 1.0


def tagger_config(folder: Path, manifest: dict, *, digest: bool = True) -> TaggerConfig:
    """The decoding fields of a tagger release's manifest (`linker.models.DECODING_FIELDS`) as a TaggerConfig.

    Each field is checked, one line naming it, what was expected and what was found (a NaN threshold would
    silently find nothing; a stride of 0 or a max_length of 2 would fail inside the first text), then, with
    `digest`, the fields and the weights' sha256 against the manifest's ``decoding_sha256``, so that a field edited
    after the release was written is refused even when its value is in range."""
    from linker.models import DECODING_DIGEST, MANIFEST, MISSING, decoding_digest, shown

    path = folder / MANIFEST
    fix = "reinstall linker or `git checkout -- linker/models` to restore it, or retrain it with `linker train extractor`"

    def refuse(field: str, expected: str, value: object):
        raise InputFormatError(f"{path}: field {field!r}", expected, shown(value), fix=fix)

    def integer(field: str, low: int, high: int) -> int:
        value = manifest.get(field, MISSING)
        if type(value) is not int or not low <= value <= high:
            refuse(field, f"an integer from {low} to {high}", value)
        return value

    labels = manifest.get("labels", MISSING)
    if (not isinstance(labels, list) or not 1 <= len(labels) <= MAX_LABELS or len(set(map(str, labels))) != len(labels)
            or not all(isinstance(label, str) and 0 < len(label) <= 64 for label in labels)):
        refuse("labels", f"a list of 1 to {MAX_LABELS} distinct label names", labels)
    max_length = integer("max_length", 3, MAX_LENGTH)
    stride = integer("stride", 1, max_length - 2)
    frozen = integer("frozen_layers", 0, MAX_FROZEN)

    def per_label(field: str, valid, expected: str, *, required: bool) -> tuple:
        value = manifest.get(field, MISSING)
        if value is MISSING and not required:
            return ()
        if not isinstance(value, dict):
            refuse(field, f"an object of {expected} per label", value)
        for label, item in value.items():
            if label not in labels:
                refuse(field, "keys among the manifest's labels", label)
            if not valid(item):
                refuse(f"{field}.{label}", expected, item)
        return tuple(sorted(value.items()))

    thresholds = per_label("threshold", _probability, "a finite number from 0 to 1", required=True)
    extend = per_label("extend", _probability, "a finite number from 0 to 1", required=False)
    split = per_label("split", lambda item: type(item) is bool, "true or false", required=False)
    lexicon = per_label("lexicon", _probability, "a finite number from 0 to 1", required=False)
    decision_cut = manifest.get("decision_cut")
    if decision_cut is not None and not _probability(decision_cut):
        refuse("decision_cut", "a finite number from 0 to 1", decision_cut)
    recorded = manifest.get(DECODING_DIGEST, MISSING)
    if digest and recorded != decoding_digest(manifest):
        found = f"{recorded[:16]}…: the decoding fields or the weights changed after the release was written" \
            if isinstance(recorded, str) else shown(recorded)
        raise InputFormatError(f"{path}: field {DECODING_DIGEST!r}", "the sha256 of the decoding fields and the "
                               "weights' sha256", found, fix=fix)
    return TaggerConfig(labels=tuple(labels), max_length=max_length, stride=stride, frozen_layers=frozen,
                        threshold=0.5, thresholds=tuple((k, float(v)) for k, v in thresholds), extend=tuple(
                            (k, float(v)) for k, v in extend), split=split,
                        lexicon=tuple((k, float(v)) for k, v in lexicon),
                        decision_cut=None if decision_cut is None else float(decision_cut))


DECISION_TENSORS = ("decision.weight", "decision.bias")


def _decision_head(folder: Path, tensors: dict, config: TaggerConfig, hidden: int
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """The decision head's (weight, bias) as float32 arrays, popped from a release's `tensors`: both tensors with a
    ``decision_cut`` in the manifest, or neither (a release without the head)."""
    from linker.models import WEIGHTS

    found = [tensors.pop(name, None) for name in DECISION_TENSORS]
    if config.decision_cut is None and all(t is None for t in found):
        return None
    arrays = [None if t is None else np.asarray(t.float().numpy() if hasattr(t, "float") else t, np.float32)
              for t in found]
    wanted = ((len(DECISION_CLASSES), hidden), (len(DECISION_CLASSES),))
    if config.decision_cut is None or any(a is None or a.shape != shape for a, shape in zip(arrays, wanted)):
        raise InputFormatError(folder / WEIGHTS, f"decision tensors of shapes {wanted} with a manifest "
                               "'decision_cut', or neither", str([None if a is None else a.shape for a in arrays]))
    return arrays[0], arrays[1]


# Extractor loaders by a release's manifest ``kind``: each takes the folder, its checked `linker.models.Release`,
# torch's threads and `digest` (check the decoding fields' sha256), and returns an `Extractor`.
EXTRACTORS: Registry[Callable[..., Extractor]] = Registry("extractor kind")


def _load(folder: Path, threads: int | None, *, digest: bool = True) -> Extractor:
    """The extractor of `folder`, by its kind (`EXTRACTORS`); `digest=False` for `--tune-only` alone, which chooses
    the decoding again (a release written before ``decoding_sha256`` existed gets one that way)."""
    from linker.extras import check

    check(MODULES, extra="dense", what="the adverse-event tagger")  # one line naming the extra, not a traceback
    from linker.models import read_release

    started = time.perf_counter()
    release = read_release(folder)  # sha256 of every file, before anything loads
    kind = release.manifest.get("kind")
    if not isinstance(kind, str) or kind not in EXTRACTORS:
        raise ConfigError(f"{folder}: a release of kind {kind!r}, not an extractor; expected one of "
                          f"{', '.join(EXTRACTORS.names())}")
    extractor = EXTRACTORS.get(kind)(folder, release, threads, digest=digest)
    log.info("loaded %s %s in %.1f s", kind, release.revision, time.perf_counter() - started)
    return extractor


def _check_fits_base(folder: Path, base: str, config: TaggerConfig, layers: int, positions: int) -> None:
    """Refuse a manifest whose frozen layers or window the base cannot hold (a layer to train, its positions)."""
    from linker.models import MANIFEST, shown

    for field, value, high in (("frozen_layers", config.frozen_layers, layers - 1),
                               ("max_length", config.max_length, positions)):
        if value > high:
            raise InputFormatError(f"{folder / MANIFEST}: field {field!r}", f"at most {high} for base {base!r}",
                                   shown(value))


class RuntimeTokenizer:
    """A `tokenizer.json` read by the `tokenizers` library, called as a transformers fast tokenizer is by
    `linker.extract.model.token_windows` (ids and character offsets, no special tokens, no truncation): the same
    library and file underneath, without transformers' import."""

    def __init__(self, path: Path) -> None:
        from linker.runtime import read_tokenizer

        self.tokenizer = read_tokenizer(path)
        specials = self.tokenizer.encode("", add_special_tokens=True).ids  # [CLS] [SEP], or <s> </s>
        if len(specials) != 2:
            raise InputFormatError(path, "a tokenizer that puts one token before a text and one after",
                                   f"{len(specials)} special tokens")
        self.cls_token_id, self.sep_token_id = specials
        self.pad_token_id = next((i for t in ("[PAD]", "<pad>") if (i := self.tokenizer.token_to_id(t)) is not None), 0)

    def __call__(self, text: str, *, add_special_tokens: bool = False, **_) -> dict:
        encoded = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": encoded.ids, "offset_mapping": encoded.offsets}


def _runtime_tagger(folder: Path, release, spec, config: TaggerConfig, threads: int | None,
                    torch_loader: Callable[[], Extractor]) -> Extractor | None:
    """The tagger of `folder` run by `linker.runtime` (numpy), or None where its base is no plain BERT folder
    (`linker.runtime.plain_bert`): the base's weights memory-mapped, the release's trained tensors over them."""
    from linker.models import WEIGHTS as RELEASE_WEIGHTS
    from linker.runtime import TOKENIZER, WEIGHTS, BertRuntime, plain_bert, read_safetensors, release_tensors

    settings, why = plain_bert(spec.path, spec.pooling)
    if settings is None:
        log.debug("tagger %s: not run by the numpy runtime (%s)", folder, why)
        return None
    shape = settings["shape"]
    _check_fits_base(folder, release.base, config, shape.layers, shape.max_positions)
    base = read_safetensors(Path(spec.path) / WEIGHTS)
    trained = release_tensors(folder, base, new=("head.", "decision."))
    decision = _decision_head(folder, trained, config, shape.hidden)
    head = trained.pop("head.weight", None), trained.pop("head.bias", None)
    if head[0] is None or head[1] is None or head[0].shape != (head_size(config), shape.hidden):
        found = str(None if head[0] is None else head[0].shape)
        raise InputFormatError(folder / RELEASE_WEIGHTS, f"head tensors of shape ({head_size(config)}, "
                               f"{shape.hidden}) for {len(config.labels)} labels (its manifest)", found)
    bert = BertRuntime({**base, **trained}, shape, settings["pooling"])
    return Extractor(bert, RuntimeTokenizer(Path(spec.path) / TOKENIZER), head, config, name=release.name,
                     revision=release.revision, threads=threads, torch_loader=torch_loader, decision=decision)


@EXTRACTORS.register(KIND)
def _load_tagger(folder: Path, release, threads: int | None, *, digest: bool = True, runtime: str = "auto"
                 ) -> Extractor:
    """The token tagger (`linker.extract.model`) over its base encoder: in numpy (`_runtime_tagger`) where its
    base allows and `runtime` is ``auto``, else in torch (``torch``)."""
    from linker.encoders import resolve_encoder
    from linker.models import WEIGHTS, load_tensors

    manifest = release.manifest
    config = tagger_config(folder, manifest, digest=digest)
    spec = resolve_encoder(release.base)
    if manifest.get("base_revision") and spec.revision != manifest["base_revision"]:
        raise ConfigError(f"{folder}: trained on {release.base} {manifest['base_revision']}, but this machine has "
                          f"{spec.revision}; install that version, or retrain with `linker train extractor`")
    if runtime == "auto":
        twin = functools.partial(_load_tagger, folder, release, threads, digest=digest, runtime="torch")
        if (tagger := _runtime_tagger(folder, release, spec, config, threads, twin)) is not None:
            return tagger
    import torch

    from linker.encoders import load_encoder, transformer_module

    encoder = load_encoder(spec, threads=threads, device="cpu")
    bert = transformer_module(encoder.model)
    tokenizer = encoder.model.tokenizer
    _check_fits_base(folder, release.base, config, bert.config.num_hidden_layers, bert.config.max_position_embeddings)
    tensors = load_tensors(release)
    decision = _decision_head(folder, tensors, config, bert.config.hidden_size)
    head = build_head(bert.config.hidden_size, config)
    head_state = {k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")}
    body = {k: v for k, v in tensors.items() if not k.startswith("head.")}
    state = bert.state_dict()
    wanted = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    if {k: tuple(v.shape) for k, v in head_state.items()} != wanted:
        raise InputFormatError(folder / WEIGHTS, f"head tensors {wanted} for {len(config.labels)} labels (its manifest)",
                               str({k: tuple(v.shape) for k, v in head_state.items()})[:120])

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
    return Extractor(bert, tokenizer, head, config, name=release.name, revision=release.revision, decision=decision)


__all__ = ["ASSERTIONS", "BY_LANGUAGE", "COORDINATORS", "EXTRACTORS", "MODULES", "MULTI", "NAME", "STYLES",
           "ByLanguage", "Extractor", "coordinated_parts", "load_extractor", "release_path", "release_paths",
           "select_style", "tagger_for", "text_languages", "uncovered_parts"]
