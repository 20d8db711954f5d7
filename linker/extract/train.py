"""Train the adverse-event tagger (`linker train extractor`) and write it as a release folder.

Data: PHEE train (brat) and the TAC 2017 training labels less a seeded development share of the files
(`linker.extract.data.tac_split`). Choices (the epoch kept, the span threshold) are made on PHEE dev and the TAC
dev files only, by the mean of PHEE dev Effect EM_F1 and TAC dev exact mention F1; PHEE test is never read here.

CPU economy: the embeddings and the lower ``frozen_layers`` layers never change, so their output is computed once
per training window (stored in fp16) and every step runs only the trained layers and the head.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linker.extract.data import (
    AE,
    AR,
    BENEFIT,
    DRUG,
    INDICATION,
    LABELS,
    Doc,
    read_phee,
    read_tac_files,
    tac_names,
    tac_split,
)
from linker.extract.lexicon import Lexicon
from linker.extract.extractor import KIND, MULTI, NAME, Extractor
from linker.extract.metrics import mention_scores, phee_scores
from linker.extract.model import (
    ExtractedSpan,
    TaggerConfig,
    bottom,
    build_head,
    decode,
    device_of,
    lexicon_spans,
    split_logits,
    token_tags,
    tokenize,
    top,
)
from linker.extract.model import windows as cut_windows

log = logging.getLogger(__name__)
VERSION = "2"  # 2: every layer trained, dictionary names as evidence (`linker.extract.lexicon`)
# Each tagger release's version, by name: the multilingual tagger (e5-small) counts its own.
VERSIONS = {NAME: VERSION, MULTI: "1"}
TAGGER_NAMES = {"minilm": NAME, "e5-small": MULTI}  # `linker train extractor --base`: the release each base makes
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


@dataclass(frozen=True)
class ExtractorTrainConfig:
    epochs: int = 3
    lr: float = 1e-4  # trained transformer layers
    head_lr: float = 1e-3
    batch_size: int = 16
    max_length: int = 128
    stride: int = 96
    frozen_layers: int = 4
    tac_negative_share: float = 0.25  # TAC windows without a reaction kept (seeded)
    phee_limit: int | None = None  # PHEE training sentences (seeded sample); None = all
    tac_train_limit: int | None = None  # TAC training labels used (the first N of the split); None = all
    dev_limit: int | None = None  # smoke runs only: the first N PHEE dev sentences and TAC dev sections
    tac_dev_share: float = 0.2
    tac_seed: int = 13
    max_seconds: float | None = None  # training steps stop once past it (the epoch's dev choice still runs)
    seed: int = 0
    threads: int | None = None
    device: str = "cpu"  # where the trained layers run: "cpu" or "cuda" (the frozen layers' cache lives there too)
    base: str = "minilm"
    name: str = NAME  # the release's name: linker-ae (minilm) or linker-ae-multi (e5-small)


@dataclass
class _Window:
    ids: list[int]
    tags: np.ndarray
    status: np.ndarray
    label_mask: np.ndarray
    hidden: object = None


def _windows_of(docs: list[Doc], tokenizer, config: ExtractorTrainConfig, labels: tuple[str, ...],
                rng: random.Random) -> list[_Window]:
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = []
    for doc in docs:
        ids, offsets = tokenize(tokenizer, doc.text)
        if not ids:
            continue
        tags, status = token_tags(offsets, doc.spans, labels)
        mask = np.array([label in doc.types for label in labels], dtype=bool)
        for a, b in cut_windows(len(ids), config.max_length, config.stride):
            t = np.zeros((b - a + 2, len(labels)), np.int64)
            t[1:-1] = tags[a:b]
            s = np.full(b - a + 2, -100, np.int64)
            s[1:-1] = status[a:b]
            if doc.source == "tac" and not t.any() and rng.random() >= config.tac_negative_share:
                continue
            out.append(_Window([cls, *ids[a:b], sep], t, s, mask))
    return out


def _batches(items: list, size: int, rng: random.Random, key) -> list[list]:
    """Shuffled batches of similar lengths (sorted within chunks of 50 batches)."""
    items = items[:]
    rng.shuffle(items)
    batches = []
    for first in range(0, len(items), size * 50):
        chunk = sorted(items[first:first + size * 50], key=key)
        batches.extend(chunk[i:i + size] for i in range(0, len(chunk), size))
    rng.shuffle(batches)
    return batches


def _pad(windows: list[_Window], pad_id: int):
    import torch

    width = max(len(w.ids) for w in windows)
    n = len(windows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    tags = torch.full((n, width, windows[0].tags.shape[1]), -100, dtype=torch.long)
    status = torch.full((n, width), -100, dtype=torch.long)
    for row, w in enumerate(windows):
        k = len(w.ids)
        ids[row, :k] = torch.tensor(w.ids)
        mask[row, :k] = 1
        tags[row, 1:k - 1] = torch.from_numpy(w.tags[1:-1])
        status[row, :k] = torch.from_numpy(w.status)
        tags[row, :, ~torch.from_numpy(w.label_mask)] = -100  # labels this document is not annotated for
    return ids, mask, tags, status


EXTENDS = (1.0, 0.6, 0.35, 0.2, 0.1)
SPLITS = (True, False)
LEXICON_CUTS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)  # the tagger's evidence a dictionary name needs (`lexicon_spans`)


def evaluate_dev(extractor: Extractor, phee_dev: list[Doc], tac_dev: list[Doc], thresholds=THRESHOLDS,
                 extends=EXTENDS, splits=SPLITS, lexicon: Lexicon | None = None) -> dict:
    """Dev scores of every decoding (threshold, extend, split): PHEE Effect EM/Token F1 of the phrase heads
    (AdverseEvent, TherapeuticEffect), TAC AdverseReaction exact/relaxed F1 of the term head; the best decoding of
    each, by the mean of PHEE EM_F1 and Token_F1 and by TAC exact F1, and the epoch's choice score (the mean of PHEE
    EM_F1 and TAC exact F1 at those decodings). The Drug and Indication heads get their own decoding, by the exact
    F1 of their spans on PHEE dev (``heads_dev``): sharing the phrase heads' threshold cost the Indication head half
    its recall once training ran long enough to make the phrase heads confident (PHEE dev, 12 epochs: 0.98).

    With `lexicon` (the TAC training split's names, `tac_names`), the term head's lexicon cut is chosen too, by TAC
    exact F1 at its best decoding, against none at all; ``lexicon_dev`` holds every cut's scores and the plain
    lookup's (the names alone, no tagger)."""
    labels = extractor.config.labels
    phee_probs = extractor.probabilities_many([d.text for d in phee_dev])
    tac_probs = extractor.probabilities_many([d.text for d in tac_dev])
    phee_gold, tac_gold = effect_strings(phee_dev), [[g[0] for g in d.groups] for d in tac_dev]
    heads = tuple(label for label in (DRUG, INDICATION) if label in labels)  # chosen on their own PHEE dev spans
    heads_gold = {label: [[((s, e),) for s, e, span_label, _ in d.spans if span_label == label] for d in phee_dev]
                  for label in heads}
    phee_labels = tuple(dict.fromkeys((AE, DRUG, BENEFIT, *heads)))  # `decode` reads each head on its own
    phee_at, tac_at, heads_at = {}, {}, {label: {} for label in heads}
    for rule in ((c, e, sp) for c in thresholds for e in extends for sp in splits):
        cut, extend, split = rule
        phee_pred = [decode(d.text, *p, phee_labels, cut, extend=extend, split=split) if p[0] else []
                     for d, p in zip(phee_dev, _columns(phee_probs, labels, phee_labels))]
        tac_pred = [decode(d.text, *p, (AR,), cut, extend=extend, split=split) if p[0] else []
                    for d, p in zip(tac_dev, _columns(tac_probs, labels, (AR,)))]
        phee_at[rule] = phee_scores(phee_gold, [[s.text for s in spans if s.label in (AE, BENEFIT)]
                                                for spans in phee_pred])
        tac_at[rule] = mention_scores(tac_gold, [[(s.start, s.end) for s in spans] for spans in tac_pred])
        for label in heads:
            heads_at[label][rule] = mention_scores(heads_gold[label], [[(s.start, s.end) for s in spans
                                                                        if s.label == label] for spans in phee_pred])
    # The phrase heads' decoding by the mean of exact match and token overlap, the two measures PHEE reports: by exact
    # match alone a release trained 12 epochs chose 0.98, for 0.3 point of EM_F1 over 0.9, and lost a point of
    # Token_F1 and the short negated mentions ("No rash since starting lamotrigine" gave no span).
    phee_rule = max(phee_at, key=lambda r: (phee_at[r]["EM_F1"] + phee_at[r]["Token_F1"], r))
    tac_rule = max(tac_at, key=lambda r: (tac_at[r]["exact"]["f1"], r))
    per_label = {AE: phee_rule, BENEFIT: phee_rule, AR: tac_rule,
                 **{label: max(heads_at[label], key=lambda r, at=heads_at[label]: (at[r]["exact"]["f1"], r))
                    for label in heads}}
    per_label = {label: rule for label, rule in per_label.items() if label in labels}  # a release of fewer heads
    out = {"thresholds": {k: v[0] for k, v in per_label.items()}, "extend": {k: v[1] for k, v in per_label.items()},
           "split": {k: v[2] for k, v in per_label.items()},
           "phee_dev": phee_at[phee_rule], "tac_dev": tac_at[tac_rule], "lexicon": {},
           "heads_dev": {label: heads_at[label][per_label[label]]["exact"] for label in heads}}
    if lexicon is not None:
        out.update(_lexicon_choice(tac_dev, tac_probs, tac_gold, labels, tac_rule, tac_at[tac_rule], lexicon))
    out["choice"] = round((phee_at[phee_rule]["EM_F1"] + out["tac_dev"]["exact"]["f1"]) / 2, 2)
    return out


def _lexicon_choice(tac_dev: list[Doc], tac_probs, tac_gold, labels: tuple[str, ...], rule: tuple, without: dict,
                    lexicon: Lexicon) -> dict:
    """The term head's lexicon cut (`LEXICON_CUTS`) with the best TAC dev exact F1, if it beats none."""
    cut, extend, split = rule
    found = [lexicon.find(d.text) for d in tac_dev]
    decoded = [decode(d.text, *p, (AR,), cut, extend=extend, split=split) if p[0] else []
               for d, p in zip(tac_dev, _columns(tac_probs, labels, (AR,)))]
    at = {}
    for lexicon_cut in LEXICON_CUTS:
        pred = [lexicon_spans(d.text, offsets, probs, marks, labels, spans, names, {AR: lexicon_cut})
                for d, (offsets, probs, marks), spans, names in zip(tac_dev, tac_probs, decoded, found)]
        at[lexicon_cut] = mention_scores(tac_gold, [[(s.start, s.end) for s in spans if s.label == AR]
                                                    for spans in pred])
    plain = mention_scores(tac_gold, found)
    best = max(at, key=lambda c: (at[c]["exact"]["f1"], c))
    table = {"none": without, **{str(c): v for c, v in at.items()}, "lookup alone": plain}
    if at[best]["exact"]["f1"] <= without["exact"]["f1"]:
        return {"lexicon_dev": table}
    return {"lexicon": {AR: best}, "tac_dev": at[best], "lexicon_dev": table}


def _columns(probabilities, labels: tuple[str, ...], keep: tuple[str, ...]):
    """The probabilities of the `keep` heads only (offsets, tag probabilities, status probabilities)."""
    index = [labels.index(label) for label in keep]
    return [(offsets, probs[:, index, :] if len(offsets) else probs, marks) for offsets, probs, marks in probabilities]


def effect_strings(docs: list[Doc]) -> list[list[str]]:
    """The gold Effect strings of each PHEE sentence (adverse and therapeutic)."""
    return [[" ".join(d.text[s:e] for s, e in pieces) for pieces, label, _ in d.groups if label in (AE, BENEFIT)]
            for d in docs]


def effect_scores(docs: list[Doc], spans: list[list[ExtractedSpan]]) -> dict:
    """PHEE's Effect EM_F1 / Token_F1 (`phee_scores`) of each sentence's AdverseEvent and TherapeuticEffect `spans`
    against the gold Effect strings of `docs`."""
    return phee_scores(effect_strings(docs), [[s.text for s in doc if s.label in (AE, BENEFIT)] for doc in spans])


def _trained_tensors(bert, head, frozen_layers: int) -> dict:
    prefixes = tuple(f"encoder.layer.{i}." for i in range(frozen_layers, bert.config.num_hidden_layers))
    tensors = {k: v.detach().to("cpu", copy=True) for k, v in bert.state_dict().items() if k.startswith(prefixes)}
    tensors.update({f"head.{k}": v.detach().to("cpu", copy=True) for k, v in head.state_dict().items()})
    return tensors


def train_extractor(phee_train: Path, phee_dev: Path, tac_folder: Path, out: Path,
                    config: ExtractorTrainConfig = ExtractorTrainConfig(), *, command: str = "",
                    report=lambda message: log.info("%s", message)) -> dict:
    """Train, choose the epoch and threshold on the dev sets, and write the release folder `out`.

    The stages: `_base` (the encoder), `_training_data` (windows and dev sets), `_start_run` (the frozen layers'
    output, once, and the trained part), then per epoch `_train_epoch` and `_choose_epoch` (dev scores, the best
    epoch's tensors kept), and `_write_release`.
    """
    import torch

    started, cpu0 = time.perf_counter(), _cpu_seconds()
    rng = random.Random(config.seed)  # one stream: the TAC negatives kept, then every epoch's batches
    torch.manual_seed(config.seed)
    encoder, tagger = _base(config)
    data = _training_data(phee_train, phee_dev, tac_folder, config, encoder.model.tokenizer, rng)
    report(f"training windows: {len(data.windows):,} ({data.phee_sentences:,} PHEE sentences, {len(data.tac_used)} "
           f"TAC labels); dev: {len(data.dev_phee):,} PHEE sentences, {len(data.tac_dev_files)} TAC labels")
    run = _start_run(encoder, tagger, data, config, started, report)
    report(f"frozen layers computed in {time.perf_counter() - started:.0f}s")
    state = TrainingState(Path(out) / STATE, _fingerprint(config, data))
    done = state.restore(run, rng)
    if done:
        report(f"resumed from {state.folder} after epoch {done} of {config.epochs}")
    stopped = False
    for epoch in range(done + 1, config.epochs + 1):
        stopped, loss = _train_epoch(run, data.windows, epoch, rng)
        _choose_epoch(run, data, epoch, loss)
        if stopped:
            break
        state.save(run, rng, epoch)
    summary = _write_release(run, data, out, encoder.spec.revision, command=command, stopped=stopped,
                             cpu=_cpu_seconds() - cpu0)
    summary["decision"] = learn_decision(Path(out), phee_train, phee_dev, tac_folder, threads=config.threads,
                                         report=report)
    state.remove()
    return summary


STATE = "training-state"  # inside --out while a run trains: what a stopped run resumes from (`TrainingState`)


def _fingerprint(config: ExtractorTrainConfig, data: _Data) -> dict:
    """What a resumed run must share with the stopped one: the settings that change what is trained (not the
    threads, the device, nor the time budget) and the data read."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("threads", "device", "max_seconds")}
    return {**settings, "windows": len(data.windows), "tac_train_labels": [f.stem for f in data.tac_used],
            "tac_dev_labels": [f.stem for f in data.tac_dev_files], "phee_sentences": data.phee_sentences,
            "version": VERSION}


class TrainingState:
    """A run's state after its last finished epoch, in ``--out/training-state/``: ``state.safetensors`` (the trained
    tensors, the best epoch's, the optimizer's moments, torch's random state) and ``state.json`` (the epoch, the
    history, the optimizer's and schedule's settings, Python's random state, the fingerprint, and the tensors'
    sha256). Written whole or not at all (a new folder renamed over the old), checked on resume: a state of another
    run (fingerprint) is refused, a damaged one (sha256) is logged and training starts over. Removed once the
    release is written."""

    def __init__(self, folder: Path, fingerprint: dict) -> None:
        self.folder, self.fingerprint = Path(folder), fingerprint

    def save(self, run: _Run, rng: random.Random, epoch: int) -> None:
        import shutil

        import torch
        from safetensors.torch import save_file

        from linker.folders import sha256_file

        tensors = {f"model.{k}": v for k, v in _trained_tensors(run.bert, run.head, run.config.frozen_layers).items()}
        tensors |= {f"best.{k}": v for k, v in (run.best_state or {}).items()}
        optimizer = run.optimizer.state_dict()
        for index, moments in optimizer["state"].items():
            tensors |= {f"optimizer.{index}.{key}": torch.as_tensor(value) for key, value in moments.items()}
        tensors["rng.torch"] = torch.get_rng_state()
        tmp = self.folder.with_name(self.folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
        state = {"fingerprint": self.fingerprint, "epoch": epoch, "step": run.step, "history": run.history,
                 "best": run.best, "param_groups": optimizer["param_groups"],
                 "schedule": {k: v if k != "lr_lambdas" else [None] * len(v)  # lambdas: code, not state
                              for k, v in run.schedule.state_dict().items()},
                 "python_rng": _jsonable(rng.getstate()), "sha256": sha256_file(tmp / "state.safetensors")}
        (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
        old = self.folder.with_name(self.folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.folder.exists():
            self.folder.rename(old)
        tmp.rename(self.folder)
        shutil.rmtree(old, ignore_errors=True)

    def restore(self, run: _Run, rng: random.Random) -> int:
        """Put the saved state into `run` and `rng`; the epochs done (0: none saved, or a damaged state)."""
        import torch
        from safetensors.torch import load_file

        from linker.errors import ConfigError
        from linker.folders import sha256_file

        path = self.folder / "state.json"
        if not path.is_file():
            return 0
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            damaged = state.get("sha256") != sha256_file(self.folder / "state.safetensors")
        except (OSError, ValueError, AttributeError):
            damaged = True
        if damaged:
            log.warning("%s: damaged (unreadable, or its tensors' sha256 differs); training starts over", self.folder)
            return 0
        if state["fingerprint"] != self.fingerprint:
            changed = sorted(k for k in {*state["fingerprint"], *self.fingerprint}
                             if state["fingerprint"].get(k) != self.fingerprint.get(k))
            raise ConfigError(f"{self.folder}: the state of a stopped run with other settings or data ({', '.join(changed)}"
                              f"); run it with the same options to resume, or remove {self.folder} to start over")
        tensors = load_file(str(self.folder / "state.safetensors"))
        trained = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
        body = {k: v for k, v in trained.items() if not k.startswith("head.")}
        with torch.no_grad():
            run.bert.load_state_dict(body, strict=False)
            run.head.load_state_dict({k.removeprefix("head."): v for k, v in trained.items() if k.startswith("head.")})
        moments: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                moments.setdefault(int(index), {})[name] = value
        run.optimizer.load_state_dict({"state": moments, "param_groups": state["param_groups"]})
        run.schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(tensors["rng.torch"])
        rng.setstate(_tuples(state["python_rng"]))
        run.step, run.history, run.best = state["step"], state["history"], state["best"]
        run.best_state = {k.removeprefix("best."): v for k, v in tensors.items() if k.startswith("best.")} or None
        return int(state["epoch"])

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _jsonable(value):
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _base(config: ExtractorTrainConfig):
    """The base encoder (on the CPU) and the tagger's configuration; ConfigError when `frozen_layers` leaves no
    layer to train."""
    from linker.encoders import load_encoder, transformer_module

    encoder = load_encoder(config.base, threads=config.threads, device="cpu")
    n_layers = transformer_module(encoder.model).config.num_hidden_layers
    if not 0 <= config.frozen_layers < n_layers:
        from linker.errors import ConfigError

        raise ConfigError(f"--frozen-layers: expected 0 to {n_layers - 1}, found {config.frozen_layers}")
    return encoder, TaggerConfig(labels=LABELS, max_length=config.max_length, stride=config.stride,
                                 frozen_layers=config.frozen_layers)


@dataclass(frozen=True)
class _Data:
    """What a run trains and chooses on: the training windows and the dev documents, with what the card records."""

    windows: list[_Window]
    phee_sentences: int  # PHEE training sentences used
    tac_used: list[Path]  # TAC training label files used
    tac_dev_files: list[Path]
    dev_phee: list[Doc]
    dev_tac: list[Doc]
    lexicon: Lexicon  # the training split's MedDRA names (`tac_names`): the evidence the term head is tuned with


def _training_data(phee_train: Path, phee_dev: Path, tac_folder: Path, config: ExtractorTrainConfig, tokenizer,
                   rng: random.Random) -> _Data:
    """PHEE train (a seeded sample with `phee_limit`) and the TAC training split as windows; the dev documents."""
    tac_train_files, tac_dev_files = tac_split(tac_folder, config.tac_dev_share, config.tac_seed)
    phee = read_phee(phee_train)
    if config.phee_limit is not None and config.phee_limit < len(phee):
        phee = random.Random(config.seed).sample(phee, config.phee_limit)
    tac_used = tac_train_files[: config.tac_train_limit] if config.tac_train_limit is not None else tac_train_files
    train_docs = phee + read_tac_files(tac_used)
    dev_phee, dev_tac = read_phee(phee_dev), read_tac_files(tac_dev_files)
    if config.dev_limit is not None:
        dev_phee, dev_tac = dev_phee[: config.dev_limit], dev_tac[: config.dev_limit]
    windows = _windows_of(train_docs, tokenizer, config, LABELS, rng)
    lexicon = Lexicon(tac_names(tac_used), source="TAC 2017 training split: Normalization names")
    return _Data(windows, len(phee), tac_used, tac_dev_files, dev_phee, dev_tac, lexicon)


@dataclass
class _Run:
    """One training run's moving parts, shared by the epoch stages."""

    config: ExtractorTrainConfig
    bert: Any
    head: Any
    extractor: Extractor  # bert + head, for the dev scores
    trained: list  # the parameters of the trained (upper) layers
    optimizer: Any
    schedule: Any
    pad: int  # the tokenizer's padding id
    total: int  # steps in all epochs: the learning rate decays linearly to 0 there
    started: float  # perf_counter at the start of training: the time budget counts from it
    report: Callable[[str], None]
    step: int = 0
    history: list[dict] = field(default_factory=list)  # one entry per epoch
    best: dict | None = None  # the chosen epoch's entry
    best_state: dict | None = None  # ... and its trained tensors


def _start_run(encoder, tagger: TaggerConfig, data: _Data, config: ExtractorTrainConfig, started: float,
               report: Callable[[str], None]) -> _Run:
    """The frozen part's output stored on the windows, the upper layers unfrozen, a new head and their optimizer."""
    import torch

    from linker.encoders import transformer_module

    bert, tokenizer = transformer_module(encoder.model), encoder.model.tokenizer
    bert.to(config.device)
    for param in bert.parameters():
        param.requires_grad_(False)
    pad = tokenizer.pad_token_id or 0
    _cache_frozen(bert, data.windows, pad, config.frozen_layers)
    trained = [p for layer in bert.encoder.layer[config.frozen_layers:] for p in layer.parameters()]
    for param in trained:
        param.requires_grad_(True)
    head = build_head(bert.config.hidden_size, tagger).to(config.device)
    optimizer = torch.optim.AdamW([{"params": trained, "lr": config.lr},
                                   {"params": head.parameters(), "lr": config.head_lr}], weight_decay=0.01)
    total = -(-len(data.windows) // config.batch_size) * config.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / max(total, 1)))
    return _Run(config, bert, head, Extractor(bert, tokenizer, head, tagger, name=config.name), trained, optimizer, schedule,
                pad, total, started, report)


def _cache_frozen(bert, windows: list[_Window], pad: int, frozen_layers: int) -> None:
    """Each window's output of the embeddings and the lower `frozen_layers` layers (fp16), computed once: they
    never change. In groups of similar lengths, so little of each forward pass is padding."""
    import torch

    bert.eval()
    device = device_of(bert)
    for first in range(0, len(windows), 64):
        group = sorted(windows[first:first + 64], key=lambda w: len(w.ids))
        for sub in range(0, len(group), 32):
            part = group[sub:sub + 32]
            ids, mask, _, _ = _pad(part, pad)
            hidden = bottom(bert, ids.to(device), mask.to(device), frozen_layers)
            for row, w in enumerate(part):
                w.hidden = hidden[row, : len(w.ids)].to(torch.float16)


def _train_epoch(run: _Run, windows: list[_Window], epoch: int, rng: random.Random) -> tuple[bool, float]:
    """One pass over the windows in `rng`'s batches; (stopped by the time budget, mean loss)."""
    import torch

    config, bert, head = run.config, run.bert, run.head
    bert.train()
    head.train()
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    running, count, epoch_started = 0.0, 0, time.perf_counter()
    for batch in _batches(windows, config.batch_size, rng, key=lambda w: len(w.ids)):
        width = max(len(w.ids) for w in batch)
        hidden = torch.zeros((len(batch), width, bert.config.hidden_size), device=config.device)
        for row, w in enumerate(batch):
            hidden[row, : len(w.ids)] = w.hidden.float()
        _, mask, tags, status = (t.to(config.device) for t in _pad(batch, run.pad))
        tag_logits, status_logits = split_logits(top(bert, head, hidden, mask, config.frozen_layers), len(LABELS))
        loss = loss_fn(tag_logits.reshape(-1, 3), tags.reshape(-1))
        if (status != -100).any():
            loss = loss + 0.5 * loss_fn(status_logits.reshape(-1, 3), status.reshape(-1))
        run.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*run.trained, *head.parameters()], 1.0)
        run.optimizer.step()
        run.schedule.step()
        running, count, run.step = running + loss.item(), count + 1, run.step + 1
        if run.step % 100 == 0:
            run.report(f"epoch {epoch} step {run.step}/{run.total} loss {running / count:.4f} "
                       f"({time.perf_counter() - epoch_started:.0f}s this epoch)")
        if config.max_seconds is not None and time.perf_counter() - run.started > config.max_seconds:
            return True, running / max(count, 1)
    return False, running / max(count, 1)


def _choose_epoch(run: _Run, data: _Data, epoch: int, loss: float) -> None:
    """Score the epoch on the dev sets (`evaluate_dev`) into `run.history`; keep its tensors when it is the best."""
    run.bert.eval()
    run.head.eval()
    scores = evaluate_dev(run.extractor, data.dev_phee, data.dev_tac, lexicon=data.lexicon)
    entry = {"epoch": epoch, "steps": run.step, "loss": round(loss, 4),
             "threshold": scores["thresholds"], **{k: v for k, v in scores.items() if k != "thresholds"},
             "seconds": round(time.perf_counter() - run.started)}
    run.history.append(entry)
    run.report(f"epoch {epoch}: loss {entry['loss']} thresholds {scores['thresholds']} PHEE dev EM_F1 "
               f"{scores['phee_dev']['EM_F1']} Token_F1 {scores['phee_dev']['Token_F1']} TAC dev exact F1 "
               f"{scores['tac_dev']['exact']['f1']} relaxed F1 {scores['tac_dev']['relaxed']['f1']}")
    if run.best is None or entry["choice"] > run.best["choice"]:
        run.best, run.best_state = entry, _trained_tensors(run.bert, run.head, run.config.frozen_layers)


def _write_release(run: _Run, data: _Data, out: Path, base_revision: str, *, command: str, stopped: bool,
                   cpu: float) -> dict:
    """The release folder `out` (the best epoch's tensors, the decoding chosen with them, the training record and
    the model card); the summary `train_extractor` returns."""
    import torch

    from linker.models import write_release

    config, best, seconds = run.config, run.best, time.perf_counter() - run.started
    info = {
        "labels": list(LABELS), "statuses": ["positive", "negated", "hypothetical"], "styles": {
            "terms": f"AdverseEvent spans from the {AR} head (TAC 2017 convention)",
            "phrases": f"AdverseEvent spans from the {AE} head (PHEE convention)"}, "max_length": config.max_length,
        "stride": config.stride, "frozen_layers": config.frozen_layers, "threshold": best["threshold"],
        "extend": best["extend"], "split": best["split"], "lexicon": best["lexicon"],
        "training": {"config": {k: v for k, v in asdict(config).items()}, "command": command,
                     "windows": len(data.windows), "phee_sentences": data.phee_sentences,
                     "tac_train_labels": [f.stem for f in data.tac_used],
                     "tac_dev_labels": [f.stem for f in data.tac_dev_files], "wall_seconds": round(seconds),
                     "cpu_seconds": round(cpu), "load_average": [round(x, 2) for x in os.getloadavg()],
                     "torch_threads": torch.get_num_threads(), "device": _device_name(config.device),
                     "stopped_by_max_seconds": stopped},
        "history": run.history,
        "metrics": {"chosen_epoch": best["epoch"], "threshold": best["threshold"], "phee_dev": best["phee_dev"],
                    "tac_dev": best["tac_dev"], "lexicon_dev": best.get("lexicon_dev", {}),
                    "heads_dev": best.get("heads_dev", {})},
    }
    manifest = write_release(Path(out), name=config.name, version=VERSIONS.get(config.name, VERSION), kind=KIND, base=config.base,
                             base_revision=base_revision, tensors=run.best_state, card=model_card(info, base_revision),
                             info=info)
    return {"out": str(out), "weights_bytes": manifest["files"]["weights.safetensors"]["bytes"], **info["metrics"],
            "wall_seconds": round(seconds), "cpu_seconds": round(cpu)}


# The manifest fields `write_release` writes itself; the rest is the release's record (`info`)
WRITTEN_FIELDS = {"format", "name", "version", "kind", "base", "base_revision", "tensors", "files", "decoding_sha256"}


def tune_release(out: Path, phee_dev: Path, tac_folder: Path, *, command: str = "", threads: int | None = None,
                 report=lambda message: log.info("%s", message), phee_train: Path | None = None) -> dict:
    """Choose the decoding (threshold, extend, split per head, the lexicon cut) of an existing release on the dev data
    again, as training does after each epoch, and rewrite the release with the same tensors (`linker train extractor
    --tune-only`), as this version of linker writes it (its `VERSION`: the decoding it chose is this version's)."""
    from linker.errors import InputFormatError
    from linker.extract import extractor as extractor_module
    from linker.models import MANIFEST, check_release_out, read_release, shown

    started, cpu0 = time.perf_counter(), _cpu_seconds()
    check_release_out(out, KIND)  # an encoder release has no decoding to tune (nor training record to read)
    release = read_release(out)
    manifest = release.manifest
    training = manifest.get("training")
    train_files, dev_files = _tac_files(release, Path(out), tac_folder)
    extractor = extractor_module._load(Path(out), threads, digest=False)  # the decoding is chosen again here
    lexicon = Lexicon(tac_names(train_files), source="TAC 2017 training split: Normalization names")
    scores = evaluate_dev(extractor, read_phee(phee_dev), read_tac_files(dev_files), lexicon=lexicon)
    report(f"tuned: thresholds {scores['thresholds']} extend {scores['extend']} split {scores['split']} lexicon "
           f"{scores['lexicon']} PHEE dev EM_F1 {scores['phee_dev']['EM_F1']} TAC dev exact F1 "
           f"{scores['tac_dev']['exact']['f1']}")
    info = {key: value for key, value in manifest.items() if key not in WRITTEN_FIELDS}
    info.update(threshold=scores["thresholds"], extend=scores["extend"], split=scores["split"],
                lexicon=scores["lexicon"])
    metrics = info.get("metrics") if isinstance(info.get("metrics"), dict) else {}
    info["metrics"] = {**metrics, "threshold": scores["thresholds"], "extend": scores["extend"],
                       "split": scores["split"], "lexicon": scores["lexicon"], "phee_dev": scores["phee_dev"],
                       "tac_dev": scores["tac_dev"], "lexicon_dev": scores.get("lexicon_dev", {}),
                       "heads_dev": scores.get("heads_dev", {})}
    info["training"] = {**training, "tuned": {
        "command": command, "wall_seconds": round(time.perf_counter() - started),
        "cpu_seconds": round(_cpu_seconds() - cpu0), "load_average": [round(x, 2) for x in os.getloadavg()]}}
    rewrite_release(release, info, version=VERSIONS.get(release.name, VERSION))
    if phee_train is not None:  # the decision head reads the same frozen tagger: learnt again with the decoding
        info["decision"] = learn_decision(Path(out), phee_train, phee_dev, tac_folder, threads=threads, report=report)
    return {"out": str(out), **info["metrics"], **({"decision": info["decision"]} if phee_train is not None else {})}


def _tac_files(release, out: Path, tac_folder: Path) -> tuple[list[Path], list[Path]]:
    """(training, development) TAC label files of `tac_folder` by the release's record of its development split."""
    from linker.errors import InputFormatError
    from linker.models import MANIFEST, shown

    training = release.manifest.get("training")
    stems = training.get("tac_dev_labels") if isinstance(training, dict) else None
    if not isinstance(stems, list) or not all(isinstance(s, str) and s not in ("", ".", "..") and Path(s).name == s
                                              and "\\" not in s for s in stems):
        raise InputFormatError(f"{out / MANIFEST}: field 'training.tac_dev_labels'",
                               "a list of TAC label file names (no folders)", shown(stems))
    return ([f for f in sorted(Path(tac_folder).glob("*.xml")) if f.stem not in set(stems)],
            [Path(tac_folder) / f"{stem}.xml" for stem in stems])


def learn_decision(out: Path, phee_train: Path, phee_dev: Path, tac_folder: Path, *, threads: int | None = None,
                   command: str = "", report=lambda message: log.info("%s", message)) -> dict:
    """Learn the decision head (`linker.extract.decision`: adverse event, indication, beneficial or medical history)
    of the tagger release `out` over its frozen hidden states, on the gold spans of PHEE train and the TAC training
    split, its cut chosen on those of PHEE dev and the TAC development split (the release's), and write it into the
    release (the tensors ``decision.*``, ``decision_cut``, the record ``decision``): `train_extractor` and
    `tune_release` end with it, ``--decision-only`` runs it alone. Returns the record."""
    import torch

    from linker.extract import extractor as extractor_module
    from linker.extract.decision import CLASSES, train_decision_head
    from linker.models import load_tensors, read_release

    started, cpu0 = time.perf_counter(), _cpu_seconds()
    release = read_release(out)
    train_files, dev_files = _tac_files(release, Path(out), tac_folder)
    extractor = extractor_module._load(Path(out), threads, digest=False)
    learnt = train_decision_head(extractor.hidden_many, read_phee(phee_train) + read_tac_files(train_files),
                                 read_phee(phee_dev) + read_tac_files(dev_files))
    record = {"classes": list(CLASSES), **{k: v for k, v in learnt.items() if k not in ("weight", "bias")},
              "wall_seconds": round(time.perf_counter() - started), "cpu_seconds": round(_cpu_seconds() - cpu0),
              **({"command": command} if command else {})}
    report(f"decision head: cut {record['cut']}, dev gold spans F1 {record['dev']}, mean F1 by seed "
           f"{record['seeds']}")
    tensors = {key: value for key, value in load_tensors(release).items() if not key.startswith("decision.")}
    tensors.update({"decision.weight": torch.from_numpy(learnt["weight"]),
                    "decision.bias": torch.from_numpy(learnt["bias"])})
    info = {key: value for key, value in release.manifest.items() if key not in WRITTEN_FIELDS}
    info.update(decision_cut=learnt["cut"], decision=record)
    rewrite_release(release, info, version=release.version, tensors=tensors)
    return record


def _device_name(device: str) -> str:
    """The card's words for where training ran: "CPU", or the GPU's name."""
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tuned(training: dict) -> str:
    tuned = training.get("tuned")
    if not tuned:
        return ""
    return (f"\nDecoding chosen again on the same dev data (no training): `{tuned['command']}` "
            f"({tuned['wall_seconds']:,} s wall, {tuned['cpu_seconds']:,} s CPU).\n")


def _lexicon_line(cuts: dict | None) -> str:
    head = ("Dictionary evidence (the names of the index `linker annotate --index` codes with): a phrase of several "
            "names becomes one span per name, and a name the cues negate is returned, not coded; ")
    if cuts:
        return head + (f"a name becomes a term where the tagger's in-span probability over it reaches {cuts} (chosen "
                       "on the TAC dev split with the training split's MedDRA names).")
    return head + ("no name becomes a term on the dictionary's word alone: on the TAC dev split, with the training "
                   "split's MedDRA names, no cut beat the tagger alone.")


# What a model card says of each base a tagger is trained on: its full name, its transformer layers, and what its
# embeddings would add to the release in fp16.
BASES = {
    "minilm": ("all-MiniLM-L6-v2", 6, "23 MB"),
    "e5-small": ("multilingual-e5-small", 12, "192 MB: a vocabulary of 250,002 pieces"),
}


def _decision_line(record: dict | None) -> str:
    """The card's words on the decision head (`learn_decision`), or none for a release without it."""
    if not record:
        return ""
    return (f"A decision head (`linker.extract.decision`, one linear map of the same hidden states) relabels a "
            f"positive AdverseEvent span Indication, TherapeuticEffect or MedicalHistory where its probability of "
            f"being an adverse event is below {record['cut']}; learnt on the gold spans of PHEE train and the TAC "
            f"training split ({record['examples']['train']}), {record['epochs']} epochs, the cut chosen on those of "
            "PHEE dev and the TAC development split "
            f"(F1 by class {record['dev']}; mean F1 by seed, the first shipped: {record['seeds']}); "
            f"{record['wall_seconds']} s wall" + (f": `{record['command']}`" if record.get("command") else "") + ".\n")


def _english(info: dict) -> bool:
    """Whether the card is the English tagger's (base minilm) rather than the multilingual one's."""
    return info["training"]["config"].get("base", "minilm") == "minilm"


def _tests(info: dict) -> str:
    t = info["training"]
    cut = (" The time budget (`--max-seconds`) ended the last epoch some steps early, at a learning rate near 0."
           if t.get("stopped_by_max_seconds") else "")
    if _english(info):
        return "Test figures: `eval/extract/report.md` (`python -m bench.extract`)." + cut
    return ("Figures in other languages and against linker-ae: `eval/extract/languages.md` (`python -m "
            "bench.extract_languages`); no test set was scored for this release." + cut)


def _language(info: dict) -> str:
    return "English" if _english(info) else "non-English"


def _use(info: dict) -> str:
    if _english(info):
        return ("English only: the base is an English model and all training\ntext is English; other languages are "
                "neither trained nor measured.")
    return ("Every training text is English:\nother languages (es, fr, de, nl, ja) are reached by cross-lingual "
            "transfer through the multilingual base\nalone, measured in `eval/extract/languages.md` "
            "(`python -m bench.extract_languages`). `linker annotate` picks\nthis tagger for a text that is not "
            "English.")


def _throughput(measured: dict | None) -> str:
    """The card's throughput section: this release against an earlier one, as `record_throughput` stored it."""
    import textwrap

    if not measured:
        return ""
    v = measured
    text = (f"Against `{v['other']}` (earlier releases: `git log -- linker/models`), per CPU thread, in one "
            f"process, the two alternating, the median of {v['runs']} runs (`{v['command']}`, {v['measured_on']}, "
            f"load average {[round(x, 2) for x in v['load_average_before']]}): {v['this_per_s']} against "
            f"{v['other_per_s']} PHEE sentences/s (**{v['ratio']}x** its speed; {v['sentences']} PHEE dev sentences, "
            "PHEE's style) and "
            f"{v['this_labels_per_s']} against {v['other_labels_per_s']} drug labels/s (**{v['labels_ratio']}x**; "
            f"every section of the {v['labels']} TAC dev labels, one call a label, the default style). Absolute "
            "rates depend on the machine: compare the two of one run.")
    return "\n## Throughput\n\n" + textwrap.fill(text, 118, break_on_hyphens=False, break_long_words=False) + "\n"


def record_throughput(folder: Path, measured: dict) -> dict:
    """Store `measured` (`bench.extract`'s comparison of this release's speed with an earlier one's) in the release
    in `folder` and write its card again: the same tensors, decoding and revision."""
    from linker.models import check_release_out, read_release

    check_release_out(folder, KIND)
    release = read_release(folder)
    info = {key: value for key, value in release.manifest.items() if key not in WRITTEN_FIELDS}
    return rewrite_release(release, {**info, "throughput": measured}, version=release.version)


def rewrite_release(release, info: dict, *, version: str, tensors: dict | None = None) -> dict:
    """Write `release` again in its folder with the same tensors (or `tensors`), the record `info` and the card made
    from it (a record the card cannot be made from is refused in one line, the release left as it was); the
    in-process cache of its tagger is dropped. Returns the manifest."""
    from linker.errors import InputFormatError
    from linker.extract import extractor as extractor_module
    from linker.models import MANIFEST, load_tensors, write_release

    folder, base_revision = Path(release.folder), str(release.manifest.get("base_revision", ""))
    try:
        card = model_card(info, base_revision)
    except (KeyError, TypeError, ValueError) as exc:  # a record the card needs, missing or mistyped
        raise InputFormatError(f"{folder / MANIFEST}: fields 'training' and 'metrics'",
                               "the training record `linker train extractor` writes",
                               f"{type(exc).__name__} {str(exc)[:60]}") from None
    manifest = write_release(folder, name=release.name, version=version, kind=KIND, base=release.base,
                             base_revision=base_revision, tensors=load_tensors(release) if tensors is None else tensors,
                             card=card, info=info)
    with extractor_module._CACHE_LOCK:
        extractor_module._CACHE.pop(str(folder.resolve()), None)
    return manifest


def model_card(info: dict, base_revision: str) -> str:
    t, m = info["training"], info["metrics"]
    base = t["config"].get("base", "minilm")
    full_name, layers, embeddings = BASES[base]
    frozen = info['frozen_layers']
    body = (f"the embeddings and the first {frozen} transformer layers as the base has them; the top {layers - frozen} layers"
            if frozen else f"the embeddings as the base has them (they would add {embeddings}); all {layers} transformer layers")
    return f"""# {t['config'].get('name', NAME)}: adverse-event span tagger

A BIO token classifier over word pieces on top of `{base}` ({full_name}, {base_revision}): {body} and a
linear head trained here. Only the trained tensors ship (fp16).

Heads: {', '.join(info['labels'])}, each B/I/O; a status head marks an event span positive, negated or
hypothetical. `AdverseEvent` learns PHEE's convention (whole effect phrases), `AdverseReaction` TAC 2017's (short
reaction terms, severity left out). `extract(style=...)`: "terms" returns the latter as AdverseEvent spans (learnt
from drug labels only: it finds next to nothing in narrative text), "phrases" the former, "auto" (the default) the
terms and the phrases where no term overlaps them. Windows of {info['max_length']} word pieces, step {info['stride']}; span thresholds
per head {info['threshold']}, hysteresis {info.get('extend', {})}, split on B {info.get('split', {})}
(all chosen on dev). {_lexicon_line(info.get('lexicon'))}
{_decision_line(info.get('decision'))}

## Training data and licences

- PHEE train ({t['phee_sentences']:,} sentences; MIT licence, `../shared/data/phee/LICENSE`): `Effect` spans are
  adverse events in sentences with an `Adverse_event` trigger, therapeutic effects where the only triggers are
  `Potential_therapeutic_event`; `Drug` spans; `Treat-Disorder` spans (what the drug is given for) as `Indication`;
  an event's `Negated` / `Speculated` attribute marks the effects of a one-event sentence negated / hypothetical.
  An adverse event that an Indication or TherapeuticEffect span overlaps with at least its confidence is dropped:
  the tagger read it as what is treated.
- TAC 2017 ADR training labels (public, NLM / FDA): {len(t['tac_train_labels'])} of the 101 labels;
  `AdverseReaction` mentions (discontinuous mentions as their pieces); `Negated` relations -> negated,
  `Hypothetical` relations to a DrugClass or Animal -> hypothetical. The other {len(t['tac_dev_labels'])}
  labels (a seeded 20% of the files) are the development split, held out from training and used, with PHEE dev,
  for every choice (epoch, threshold).

## Command and cost

`{t['command']}`

{t['windows']:,} training windows; {t['wall_seconds']:,} s wall, {t['cpu_seconds']:,} s CPU, on {t.get('device', 'CPU')} with
{t['torch_threads']} torch thread(s), load average at the end {t['load_average']}.
{_tuned(t)}
## Metrics (development data: chosen epoch {m['chosen_epoch']})

| set | metric | value |
|---|---|---|
| PHEE dev | Effect EM_F1 | {m['phee_dev']['EM_F1']} |
| PHEE dev | Effect Token_F1 | {m['phee_dev']['Token_F1']} |
| TAC 2017 dev split | AdverseReaction exact F1 | {m['tac_dev']['exact']['f1']} |
| TAC 2017 dev split | AdverseReaction relaxed F1 | {m['tac_dev']['relaxed']['f1']} |
{"".join(f"| PHEE dev | {label} exact F1 | {v['f1']} |" + chr(10) for label, v in m.get('heads_dev', {}).items())}
The tagger alone, as training chose it. `linker annotate` adds the dictionary's steps (one span per name, events
that share words, span edges: docs/extract.md); `eval/extract/report.md` scores the tagger with them.

{_tests(info)}
{_throughput(info.get('throughput'))}
## Intended use and limits

Finding adverse-event and drug mentions in {_language(info)} case reports and drug labels, to be coded by `linker annotate`
and reviewed by a person. Not a diagnostic device. {_use(info)} The tagger alone writes a discontinuous mention as
its separate pieces and overlapping mentions of one label as one; with a dictionary (`annotate`), events that share
words across "and", "or" or a slash are written as discontinuous mentions. Status (negated, hypothetical) is learnt from few
examples (a few hundred) and is weaker than the spans.
"""


__all__ = ["TAGGER_NAMES", "ExtractorTrainConfig", "evaluate_dev", "learn_decision", "model_card", "record_throughput",
           "train_extractor", "tune_release"]
