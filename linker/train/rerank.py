"""`train_rerank`: a cross-encoder (mention, candidate name) -> score, trained on what the retriever confuses.

Training queries come from two places:

- the dictionary itself (self-supervised, no annotated data needed): for a concept with two or
  more distinct names, one name plays the mention and the concept's other names are right
  answers (`synonyms_per_concept` anchors per concept, a seeded sample of `max_queries` in all);
- labelled mentions (`--train` dataset specs), all of them, single-concept mentions only.

Each query gets one positive and `negatives` hard negatives, mined once before training with a
character tf-idf index over the dictionary names (the retriever the project ships; the same
confusions a dense retriever makes are mostly lexical too). `mining` sets that index's parameters:
the library's default, or those of the tf-idf index the re-ranker will serve, so that it trains on
the confusions it will be shown (the retriever's top-k at link time). The positive is the best-scoring
name of a gold concept other than the query's own row (BioSyn's "hard positive"), the negatives
are the best-scoring names of other concepts. The loss is the softmax cross-entropy of the
positive among its group (1 + negatives logits), the listwise objective cross-encoder
re-rankers are usually fine-tuned with. Negatives are not re-mined between epochs (BioSyn
re-mines because its retriever is the model being trained; here the retriever is fixed).

Conventions shared with `train sap` / `train biosyn`: seeded order and dropout per epoch,
checkpoints in ``<out>.checkpoint`` (every `checkpoint_every` steps and after each epoch) and
``--resume``, bf16 autocast where the CPU supports it, progress bar or ~10 log lines per epoch,
``train_config.json`` and ``train_metrics.json`` beside the weights (safetensors).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from linker.dictionary import read_concept_table
from linker.errors import ConfigError
from linker.index.tfidf import TfidfConfig
from linker.precision import autocast, check_precision
from linker.retrieve import ConceptIndex
from linker.text import code_key
from linker.train import common

log = logging.getLogger(__name__)

MINE_BATCH = 1024  # queries per tf-idf search while mining


@dataclass(frozen=True)
class RerankConfig:
    lr: float = 3e-5  # peak rate; sentence-transformers' cross-encoder examples use 2e-5 to 5e-5 for MiniLM
    warmup: float = 0.1  # share of the steps with a linear warm-up; then linear decay to 0 at the last step
    batch_size: int = 16  # queries per step; each brings 1 + negatives pairs
    negatives: int = 7  # hard negatives per query: 8 pairs per query, 128 per step at batch 16
    epochs: int = 1
    max_queries: int | None = 20000  # synonym queries (seeded sample); labelled mentions are all kept
    synonyms_per_concept: int = 2
    fetch: int = 64  # names retrieved per query to find a positive and the negatives
    mining: TfidfConfig | None = None  # the tf-idf parameters that mine them; None = TfidfConfig() (char_wb 3-3)
    # ...or an index folder built from the same dictionary (tf-idf, dense or hybrid) whose search mines
    # them: the retriever the re-ranker will serve, so it learns to undo that retriever's mistakes.
    mine_index: str | None = None
    weight_decay: float = 0.01
    # the word, position and type embeddings keep the base's values: a third of MiniLM's parameters, which a
    # model trained so need not ship (it goes on top of its base, as the shipped encoders do)
    freeze_embeddings: bool = False
    checkpoint_every: int = 200  # steps; 0 = only after each epoch
    max_seconds: float | None = None  # time budget: stop after the step that passes it and save (CPU runs)
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    precision: str = "auto"  # forward passes in fp32 or bf16 (auto: bf16 where native); as train sap/biosyn

    def __post_init__(self) -> None:
        for name in ("batch_size", "negatives", "epochs", "synonyms_per_concept", "fetch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, found {getattr(self, name)}")
        if self.fetch <= self.negatives:
            raise ConfigError(f"fetch ({self.fetch}) must exceed negatives ({self.negatives})")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive, found {self.lr}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"warmup is a share of the steps in [0, 1), found {self.warmup}")
        check_precision(self.precision, allow_none=False)
        if self.precision == "int8":
            raise ConfigError("precision int8 is for inference only; train in auto, bf16 or fp32")
        if self.mining is not None and not isinstance(self.mining, TfidfConfig):
            raise ConfigError(f"mining takes a TfidfConfig, found {type(self.mining).__name__}")
        if self.mining is not None and self.mine_index is not None:
            raise ConfigError("mine the negatives with a tf-idf preset or with an index, not both")


def learning_rate(config: RerankConfig, step: int, total: int) -> float:
    """The rate of step `step` (0-based) of `total`: linear warm-up then linear decay (a pure function of the
    step, so a resumed run continues the same schedule without saving a scheduler)."""
    warm = max(1, round(config.warmup * total))
    if step < warm:
        return config.lr * (step + 1) / warm
    return config.lr * max(0.0, (total - step) / max(1, total - warm))


@dataclass(frozen=True)
class Group:
    """One training query: its text, one right name, hard wrong names."""

    mention: str
    positive: str
    negatives: tuple[str, ...]
    labelled: bool


@dataclass(frozen=True)
class _Query:
    text: str
    concepts: frozenset[int]
    own_row: int  # the anchor's own name row (never its own positive), -1 for labelled mentions
    labelled: bool


def _synonym_queries(codes: np.ndarray, names: list[str], config: RerankConfig) -> list[_Query]:
    rng = random.Random(config.seed)
    by_concept: dict[int, list[int]] = {}
    for row, code in enumerate(codes.tolist()):
        by_concept.setdefault(code, []).append(row)
    queries = []
    for code, rows in by_concept.items():
        distinct = list({names[r].lower(): r for r in rows}.values())
        if len(distinct) < 2:
            continue
        for row in rng.sample(distinct, min(config.synonyms_per_concept, len(distinct))):
            queries.append(_Query(names[row], frozenset([code]), row, False))
    if config.max_queries is not None and len(queries) > config.max_queries:
        queries = rng.sample(queries, config.max_queries)
    return queries


def _labelled_queries(specs: Sequence[str], concepts: ConceptIndex, xrefs: dict[str, list[str]]
                      ) -> tuple[list[_Query], dict]:
    """Single-concept labelled mentions; a gold id may be a concept id or one of its xrefs (NCBI's OMIM ids
    are alternative ids of MEDIC's MeSH concepts)."""
    from linker.datasets import load_dataset

    code_of = {code_key(cid): i for i, cid in enumerate(concepts.ids)}
    for i, cid in enumerate(concepts.ids):
        for x in xrefs.get(cid, ()):
            code_of.setdefault(code_key(x), i)
    queries, composite, unknown = [], 0, 0
    for spec in specs:
        for mention in load_dataset(spec):
            if len(mention.gold) != 1:
                composite += 1
                continue
            wanted = frozenset(code_of[code_key(a)] for a in mention.gold[0] if code_key(a) in code_of)
            if not wanted:
                unknown += 1
                continue
            queries.append(_Query(mention.text, wanted, -1, True))
    unique = list({(q.text, q.concepts): q for q in queries}.values())
    return unique, {"labelled_mentions": len(queries), "labelled_unique": len(unique),
                    "composite_dropped": composite, "gold_not_in_dictionary": unknown}


def mine_groups(dict_path: str | Path, train_specs: Sequence[str], config: RerankConfig) -> tuple[list[Group], dict]:
    """The training groups (query, hard positive, hard negatives) and counts for the metrics file."""
    table = read_concept_table(dict_path).table
    names: list[str] = table.column("name").to_pylist()
    concepts = ConceptIndex(table.column("concept_id"))
    codes = concepts.codes
    queries = _synonym_queries(codes, names, config)
    xrefs: dict[str, list[str]] = {}
    for cid, refs in zip(table.column("concept_id").to_pylist(), table.column("xrefs").to_pylist()):
        xrefs.setdefault(cid, []).extend(refs or ())
    labelled, stats = _labelled_queries(train_specs, concepts, xrefs)
    queries += labelled
    if not queries:
        raise ConfigError(f"{dict_path}: no concept has two distinct names and no labelled mention was given; "
                          "nothing to train a re-ranker on")
    index, negatives_from = _mining_index(dict_path, names, config)
    rng = random.Random(config.seed + 1)
    by_concept: dict[int, list[int]] = {}
    for row, code in enumerate(codes.tolist()):
        by_concept.setdefault(code, []).append(row)
    groups: list[Group] = []
    no_positive = padded = 0
    fetch = min(config.fetch, index.size)
    for start in range(0, len(queries), MINE_BATCH):
        chunk = queries[start : start + MINE_BATCH]
        _scores, rows = index.search([q.text for q in chunk], fetch)
        for query, hits in zip(chunk, rows.tolist()):
            lower = query.text.lower()
            positive, negatives, seen = None, [], set(query.concepts)
            for row in hits:
                if row < 0:
                    break
                code = int(codes[row])
                if code in query.concepts:
                    if positive is None and row != query.own_row and (query.labelled or names[row].lower() != lower):
                        positive = names[row]
                elif names[row].lower() == lower:  # another concept with the query's very name: no signal to learn
                    continue
                elif code not in seen and len(negatives) < config.negatives:
                    seen.add(code)
                    negatives.append(names[row])
            if positive is None:  # no other name of a gold concept among the fetched: any other one
                others = [r for c in sorted(query.concepts) for r in by_concept[c]
                          if r != query.own_row and (query.labelled or names[r].lower() != lower)]
                if not others:
                    no_positive += 1
                    continue
                positive = names[rng.choice(others)]
            while len(negatives) < config.negatives:  # rare: a tiny dictionary; random other concepts
                row = rng.randrange(len(names))
                if int(codes[row]) not in seen and names[row].lower() != lower:
                    seen.add(int(codes[row]))
                    negatives.append(names[row])
                    padded += 1
                elif len(seen) >= len(concepts):
                    raise ConfigError(f"{dict_path}: too few concepts for {config.negatives} negatives per query")
            groups.append(Group(query.text, positive, tuple(negatives), query.labelled))
    stats.update({"synonym_queries": sum(not g.labelled for g in groups), "groups": len(groups),
                  "queries_without_positive": no_positive, "random_negatives": padded,
                  "dictionary_names": len(names), "concepts": len(concepts),
                  "negatives_from": negatives_from})
    log.info("re-ranker training groups: %s", stats)
    return groups, stats


def _mining_index(dict_path: str | Path, names: list[str], config: RerankConfig):
    """The name search that mines the negatives, and how to describe it in the metrics."""
    if config.mine_index is not None:
        from linker.index import load_index

        loaded = load_index(config.mine_index)
        if loaded.concepts.table.column("name").to_pylist() != names:
            raise ConfigError(f"{config.mine_index} was not built from {dict_path} (its {loaded.names.size:,} names "
                              f"differ from the dictionary's {len(names):,}); mine with an index of that dictionary")
        return loaded.names, f"index {Path(config.mine_index).name} ({loaded.kind})"
    from linker.index.tfidf import TfidfNameIndex

    mining = config.mining or TfidfConfig()
    preset = f", preset {mining.preset}" if mining.preset else ""
    return (TfidfNameIndex.build(names, mining),
            f"tf-idf {mining.analyzer} {mining.ngram_min}-{mining.ngram_max} ({mining.normalization} normalisation{preset})")


def train_rerank(
    dict_path: str | Path,
    *,
    encoder: str,
    out: str | Path,
    train_specs: Sequence[str] = (),
    config: RerankConfig = RerankConfig(),
    resume: bool = False,
    show_progress: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train a cross-encoder from `encoder` on `dict_path` synonyms (+ labelled `train_specs`); write `out`.

    An existing `out` is replaced only with `overwrite` (and only a folder that linker wrote).

    The stages: `mine_groups` (the training groups), `start_run` (the model, from `<out>.checkpoint` with
    `resume`), `train_epoch` per epoch, `finish_run` (the model folder).
    """
    out = Path(out)
    dict_path = Path(dict_path)
    common.check_train_output(out, encoder=encoder, dict_path=dict_path, train_specs=train_specs, overwrite=overwrite)
    common.set_seed(config.seed)
    if config.threads:
        torch.set_num_threads(config.threads)
    device = common.pick_device(config.device)
    precision = common.training_precision(config.precision, device)
    groups, group_stats = mine_groups(dict_path, train_specs, config)

    run = start_run(encoder, out, groups, common.Metrics(extra={"data": group_stats}), config, device, precision,
                    resume=resume)
    for epoch in range(run.state["epoch"], config.epochs):
        if train_epoch(run, out, epoch, show_progress=show_progress):
            break  # stopped by the time budget
        run.state.update(epoch=epoch + 1, step_in_epoch=0)
        if epoch + 1 < config.epochs:
            common.save_checkpoint(out, run.model, run.optimizer, run.state, run.metrics)
    return finish_run(run, out, encoder=encoder, train_specs=train_specs, dict_path=dict_path, resume=resume)


@dataclass
class _Run:
    """One training run's moving parts, shared by the epoch stages."""

    config: RerankConfig
    device: str
    groups: list[Group]
    model: Any  # a linker.rerank.CrossEncoder
    optimizer: torch.optim.Optimizer
    metrics: common.Metrics
    state: dict  # {"epoch", "step", "step_in_epoch"} done
    timer: common.Timer = field(default_factory=common.Timer)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.groups) / self.config.batch_size)


def start_run(encoder: str, out: Path, groups: list[Group], metrics: common.Metrics, config: RerankConfig,
              device: str, precision: str, *, resume: bool) -> _Run:
    """A cross-encoder made from `encoder` and its optimizer, ready for the first step to run: afresh with
    `metrics`, or with the weights, optimizer state, counters and metrics of `<out>.checkpoint`."""
    from linker.rerank import CrossEncoder, init_cross_encoder

    state = {"epoch": 0, "step": 0, "step_in_epoch": 0}
    if resume:
        model_dir, saved, tensors, param_groups = common.load_checkpoint(out)
        state = {key: saved.get(key, 0) for key in state}
        metrics = common.Metrics.from_json(saved["metrics"])
        model = CrossEncoder.load(model_dir, device=device, precision=precision)
    else:
        model = init_cross_encoder(encoder, device=device, precision=precision, seed=config.seed)
    if config.freeze_embeddings:  # on a resumed run too, so that its optimizer holds the same parameters
        for parameter in model.model.base_model.embeddings.parameters():
            parameter.requires_grad_(False)
    params = [p for p in model.model.parameters() if p.requires_grad]
    optimizer = common.adam(params, decoupled=True, lr=config.lr, weight_decay=config.weight_decay)
    if resume:
        common.restore_optimizer(optimizer, tensors, param_groups)
    return _Run(config, device, groups, model, optimizer, metrics, state)


def train_epoch(run: _Run, out: Path, epoch: int, *, show_progress: bool = False) -> bool:
    """The rest of epoch `epoch` (all of it, or the steps after a checkpoint inside it) in seeded order, one step
    per batch of groups, with checkpoints every `checkpoint_every` steps; its record is appended to
    `run.metrics.epochs`. True when the time budget stopped it (recorded as ``stopped_at_time_budget``)."""
    config, metrics, state = run.config, run.metrics, run.state
    steps_per_epoch = run.steps_per_epoch
    run.model.model.train()
    order = list(range(len(run.groups)))
    random.Random(config.seed + epoch).shuffle(order)
    first = state["step_in_epoch"]  # > 0 only for the epoch a checkpoint was saved inside
    torch.manual_seed(config.seed + epoch * 100_003 + first)  # dropout: a resumed run continues seeded
    bar = tqdm(range(first, steps_per_epoch), desc=f"rerank epoch {epoch + 1}/{config.epochs}",
               disable=not show_progress)
    epoch_losses: list[float] = []
    for step in bar:
        batch = [run.groups[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]
        value, accuracy = _step(run, batch)
        state["step_in_epoch"] = step + 1
        epoch_losses.append(value)
        metrics.steps.append({"step": state["step"], "epoch": epoch + 1, "loss": round(value, 6),
                              "batch_acc": round(accuracy, 4), "seconds": run.timer.seconds})
        if not show_progress and (step + 1) % max(1, steps_per_epoch // 10) == 0:
            recent = metrics.steps[-max(1, steps_per_epoch // 10):]
            log.info("rerank epoch %d step %d/%d: loss %.4f, batch acc %.3f (%.0fs)", epoch + 1, step + 1,
                     steps_per_epoch, np.mean([s["loss"] for s in recent]),
                     np.mean([s["batch_acc"] for s in recent]), run.timer.seconds)
        bar.set_postfix(loss=f"{value:.4f}")
        if config.checkpoint_every and state["step"] % config.checkpoint_every == 0 and step + 1 < steps_per_epoch:
            common.save_checkpoint(out, run.model, run.optimizer, state, metrics)
            run.model.model.train()
        if config.max_seconds is not None and run.timer.seconds > config.max_seconds:
            metrics.extra["stopped_at_time_budget"] = {"epoch": epoch + 1, "step_in_epoch": step + 1,
                                                       "steps_per_epoch": steps_per_epoch}
            log.info("rerank: time budget of %.0fs reached after step %d of epoch %d; saving", config.max_seconds,
                     step + 1, epoch + 1)
            break
    if epoch_losses:
        metrics.epochs.append({"epoch": epoch + 1, "mean_loss": round(float(np.mean(epoch_losses)), 6),
                               "seconds": run.timer.seconds})
        log.info("rerank epoch %d: mean loss %.4f (%.0fs)", epoch + 1, metrics.epochs[-1]["mean_loss"],
                 run.timer.seconds)
    return "stopped_at_time_budget" in metrics.extra


def _step(run: _Run, batch: list[Group]) -> tuple[float, float]:
    """One optimiser step on `batch` at the scheduled rate: the softmax cross-entropy of each group's positive
    (column 0) among its 1 + negatives pairs; (loss, share of the groups whose positive scored highest)."""
    config, device, model = run.config, run.device, run.model
    width = 1 + config.negatives
    mentions = [g.mention for g in batch for _ in range(width)]
    names = [name for g in batch for name in (g.positive, *g.negatives)]
    for group in run.optimizer.param_groups:
        group["lr"] = learning_rate(config, run.state["step"], run.steps_per_epoch * config.epochs)
    with autocast(model.precision, device):
        logits = model.logits(mentions, names).float().view(len(batch), width)  # (batch, 1 + negatives)
    loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long, device=device))
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    run.state["step"] += 1
    return float(loss.detach()), float((logits.argmax(dim=1) == 0).float().mean())


def finish_run(run: _Run, out: Path, *, encoder: str, train_specs: Sequence[str], dict_path: Path,
               resume: bool) -> dict:
    """The model folder: weights, the run's config and metrics; the summary `train_rerank` returns."""
    model, metrics, config = run.model, run.metrics, run.config
    model.model.eval()
    metrics.extra.update({
        "train_seconds": run.timer.seconds,
        "steps": run.state["step"],
        "precision": model.precision,
        "bf16": model.precision == "bf16",  # the key reports read before `precision` existed
        "hardware": common.hardware(run.device, config.threads),
        "parameters": sum(p.numel() for p in model.model.parameters()),
        "resumed": resume,
    })
    run_config = {
        **common.run_header("rerank", encoder, None),
        "config": asdict(config),
        "data": {"dict": str(dict_path), "train": list(train_specs)},
        "data_sha256": common.data_hashes([dict_path]),
    }
    common.write_outputs(out, model, config=run_config, metrics=metrics)
    return {"out": str(out), **{k: v for k, v in metrics.extra.items() if k != "hardware"},
            "first_loss": metrics.steps[0]["loss"] if metrics.steps else None,
            "last_epoch_loss": metrics.epochs[-1]["mean_loss"] if metrics.epochs else None}
