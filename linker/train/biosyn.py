"""BioSyn fine-tuning (Sung et al., ACL 2020): synonym marginalisation with iterative candidates.

Each epoch, every training mention gets `topk` candidate dictionary names: the best
`topk * dense_ratio` by the *current* encoder (so candidates get harder as the model improves)
and the rest by character n-gram tf-idf (fixed), without duplicates. A candidate's score is
``dense + sparse_weight * sparse``, sparse_weight a learned scalar; the loss is the negative log
of the summed softmax probability of all candidates of the gold concept (every synonym of the
right concept counts, none is singled out as "the" target).

Differences from the reference code (dmis-lab/BioSyn), all forced by reusing the project's
encoders, each recorded in train_config.json:
- embeddings come from the sentence-transformers model's own pooling and are L2-normalised (the
  dense index searches cosine), where BioSyn takes BERT's raw [CLS] dot product. Cosines lie in
  [-1, 1], so the logits are multiplied by `logit_scale` = 20 (temperature 0.05, as SimCSE,
  Gao et al. 2021); without it the softmax over 20 candidates is nearly flat.
- names are not rewritten (no lowercasing or punctuation removal beyond what tf-idf's own
  `normalize` does), because the dense index encodes the dictionary names as they are.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from linker.dictionary import alternative_ids, read_concept_table
from linker.errors import ConfigError, LinkerError
from linker.index.tfidf import PRESETS, TfidfNameIndex
from linker.precision import autocast, check_precision
from linker.text import code_key, normalize
from linker.train import common
from linker.train.losses import marginal_nll

log = logging.getLogger(__name__)

SPARSE_WEIGHT_FILE = "biosyn.json"  # the learned sparse weight, for a hybrid index over this encoder


@dataclass(frozen=True)
class BiosynConfig:
    """One BioSyn run. Defaults: dmis-lab/BioSyn README training command for NCBI-disease."""

    lr: float = 1e-5  # README: --learning_rate 1e-5
    weight_decay: float = 0.01  # train.py --weight_decay default 0.01 (Adam, as RerankNet)
    batch_size: int = 16  # README: --train_batch_size 16
    epochs: int = 10  # README: --epoch 10 (NCBI-disease)
    topk: int = 20  # README: --topk 20 candidates per mention
    dense_ratio: float = 0.5  # README: --dense_ratio 0.5 (half dense, half sparse)
    max_length: int = 25  # README: --max_length 25 tokens
    initial_sparse_weight: float = 0.0  # README: --initial_sparse_weight 0 (then learned)
    sparse_lr: float = 0.01  # rerankNet.py: the sparse weight has its own Adam lr 0.01, no weight decay
    logit_scale: float = 20.0  # ours: cosine scores / temperature 0.05 (SimCSE); see module docstring
    freeze_layers: int = 0  # Medical Crossing froze embeddings + 4 or 10 layers
    freeze_embeddings: bool = False
    max_queries: int | None = None  # train on a seeded sample of the (deduplicated) mentions
    max_seconds: float | None = None  # time budget: stop after the step that passes it and save (CPU runs)
    seed: int = 0  # train.py --seed default 0
    device: str | None = None
    threads: int | None = None
    precision: str = "auto"  # forward passes in fp32 or bf16 (auto: bf16 where native); see common.training_precision

    def __post_init__(self) -> None:
        check_precision(self.precision, allow_none=False)
        if self.topk < 2:
            raise ConfigError(f"--topk must be >= 2 (softmax over candidates), found {self.topk}")
        if not 0.0 <= self.dense_ratio <= 1.0:
            raise ConfigError(f"--dense-ratio must be within [0, 1], found {self.dense_ratio}")
        if self.batch_size < 1 or self.epochs < 1 or self.lr <= 0 or self.sparse_lr < 0 or self.max_length < 4:
            raise ConfigError(
                f"need batch_size >= 1, epochs >= 1, lr > 0, max_length >= 4; found "
                f"{self.batch_size}, {self.epochs}, {self.lr}, {self.max_length}"
            )
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"--max-seconds must be positive, found {self.max_seconds}")
        if self.freeze_layers < 0 or (self.max_queries is not None and self.max_queries < 1):
            raise ConfigError(f"--freeze-layers must be >= 0 and --max-queries >= 1; found "
                              f"{self.freeze_layers}, {self.max_queries}")


@dataclass(frozen=True)
class Query:
    text: str
    gold: frozenset[str]  # code_key of each acceptable concept id


@dataclass(frozen=True)
class Dictionary:
    names: tuple[str, ...]
    keys: tuple[str, ...]  # code_key(concept_id) of each name row
    aliases: dict[str, frozenset[str]]  # code_key(id) -> the concepts it is an alternative of (OMIM id -> MeSH id)

    def resolve(self, gold: frozenset[str]) -> frozenset[str]:
        """Gold ids plus the concepts that are alternatives of any of them (xrefs, either way)."""
        return gold.union(*(self.aliases.get(g, ()) for g in gold))


def load_dictionary(path: str | Path) -> Dictionary:
    """Unique (name, concept) rows of a concept table, names equal after normalisation merged."""
    table = read_concept_table(path).table
    seen: set[tuple[str, str]] = set()
    names, keys = [], []
    for cid, name in zip(table.column("concept_id").to_pylist(), table.column("name").to_pylist()):
        key = (normalize(name, "default"), code_key(cid))
        if key[0] and key not in seen:
            seen.add(key)
            names.append(name)
            keys.append(key[1])
    concepts = set(keys)  # only alternatives that are concepts of the dictionary can be positives
    aliases = {k: v & concepts for k, v in alternative_ids(table).items()}
    return Dictionary(tuple(names), tuple(keys), {k: v for k, v in aliases.items() if v})


def training_queries(mentions, config: BiosynConfig) -> tuple[list[Query], dict]:
    """BioSyn's training queries: composite mentions dropped, duplicates (text, gold) dropped.

    `mentions` are `linker.datasets.Mention`s; gold is a tuple of parts, each a tuple of
    alternative ids. A seeded sample of `max_queries` is kept when set.
    """
    queries: list[Query] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    composite = 0
    for m in mentions:
        if len(m.gold) != 1:
            composite += 1
            continue
        gold = frozenset(code_key(g) for g in m.gold[0] if g.strip())
        key = (normalize(m.text, "default"), gold)
        if gold and key not in seen:
            seen.add(key)
            queries.append(Query(m.text, gold))
    total = len(queries)
    if config.max_queries is not None and total > config.max_queries:
        queries = random.Random(config.seed).sample(queries, config.max_queries)
    stats = {"mentions": len(mentions), "composite_dropped": composite, "unique_queries": total, "queries": len(queries)}
    if not queries:
        raise LinkerError("no usable training mentions (need mentions with one gold concept); check --train")
    return queries, stats


def watched_queries(mentions, dictionary: Dictionary, config: BiosynConfig) -> list[Query]:
    """The queries a `monitor` split is scored on: each single-concept mention once (never a --max-queries
    sample), its gold widened by the dictionary's alternative ids."""
    queries = training_queries(mentions, replace(config, max_queries=None))[0]
    return [Query(q.text, dictionary.resolve(q.gold)) for q in queries]


def acc_at_1(queries: Sequence[Query], keys: Sequence[str], top: np.ndarray) -> float:
    """Share of `queries` whose top name row (`top[i]`, an index into `keys`) is of a gold concept."""
    return float(np.mean([keys[r] in q.gold for q, r in zip(queries, top)]))


def watched_acc1(model: str | Path, dictionary: str | Path, spec: str, config: BiosynConfig) -> float:
    """`train_biosyn`'s `monitor` number (dense Acc@1 of the single-concept mentions of dataset `spec` against
    `dictionary`, texts cut at the training max_length), computed afresh from a model folder as it is on this
    machine: a model trained on a lent GPU and carried back in fp16 is checked against the number it logged."""
    from linker.encoders import load_encoder
    from linker.datasets import load_dataset

    names = load_dictionary(dictionary)
    queries = watched_queries(load_dataset(spec), names, config)
    encoder = load_encoder(str(model), threads=config.threads)
    encoder.model.max_seq_length = config.max_length
    top = dense_top(encoder.encode([q.text for q in queries], role="query"),
                    encoder.encode(list(names.names), role="passage"), 1)[:, 0]
    return round(acc_at_1(queries, names.keys, top), 4)


def dense_top(q: np.ndarray, d: np.ndarray, k: int, chunk: int = 256) -> np.ndarray:
    """(n_queries, k) name rows of the highest cosine, best first (ties by lower row).

    Exact, in chunks of queries: 256 x 100k names of float32 scores is 100 MB at a time.
    """
    k = min(k, d.shape[0])
    out = np.empty((q.shape[0], k), dtype=np.int64)
    for start in range(0, q.shape[0], chunk):
        scores = q[start : start + chunk] @ d.T  # (chunk, names)
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.lexsort((part, -np.take_along_axis(scores, part, 1)), axis=1)
        out[start : start + chunk] = np.take_along_axis(part, order, 1)
    return out


def merge_candidates(dense_rows: np.ndarray, sparse_rows: np.ndarray, topk: int, dense_ratio: float) -> np.ndarray:
    """BioSyn's candidate set: the first topk*dense_ratio dense rows, then sparse rows not yet taken.

    When the sparse list runs short (a mention sharing few n-grams), further dense rows fill up.
    """
    n_dense = int(topk * dense_ratio)
    out = np.full((dense_rows.shape[0], topk), -1, dtype=np.int64)
    for i in range(dense_rows.shape[0]):
        chosen = list(dict.fromkeys(int(r) for r in dense_rows[i, :n_dense]))
        for pool in (sparse_rows[i], dense_rows[i, n_dense:]):
            for r in pool:
                if len(chosen) >= topk:
                    break
                if r >= 0 and int(r) not in chosen:
                    chosen.append(int(r))
        out[i, : len(chosen)] = chosen
    return out


def train_biosyn(
    train_spec: str | Sequence[str],
    dict_path: str | Path,
    *,
    encoder: str,
    out: str | Path,
    config: BiosynConfig = BiosynConfig(),
    resume: bool = False,
    show_progress: bool = False,
    mentions=None,
    overwrite: bool = False,
    monitor=None,
) -> dict:
    """Fine-tune `encoder` BioSyn-style on the mentions of `train_spec`; write a model folder to `out`.

    `train_spec` is a dataset spec for `linker.datasets.load_dataset` ("FORMAT:PATH"), or
    several (train and dev); `mentions` may pass already loaded mentions instead (the specs are
    then only recorded). An existing `out` is replaced only with `overwrite` (and only a folder
    that linker wrote). `monitor` (mentions, e.g. a held-out split) gets its dense Acc@1 against the
    training dictionary recorded before each epoch and after the last, for a training curve; it
    reuses the dictionary vectors each epoch encodes anyway, so only the final point costs an
    extra encoding. Nothing is chosen by it. `resume` continues from `<out>.checkpoint`, or continues a
    finished `out` for more `config.epochs` (fresh optimizer, recorded as optimizer_restarted_before_epoch).

    The stages: `training_data` (queries, dictionary, the fixed tf-idf candidates), `resume_point` and
    `start_run`, then per epoch `mine_candidates` (dense candidates from the current encoder) and `train_epoch`;
    `finish_run` writes the model folder.
    """
    from linker.encoders import load_encoder

    out, dict_path = Path(out), Path(dict_path)
    train_specs = [train_spec] if isinstance(train_spec, str) else list(train_spec)
    finished = finished_run(out) if resume else None
    common.check_train_output(out, encoder=encoder, dict_path=dict_path, train_specs=train_specs,
                              overwrite=overwrite or finished is not None)
    common.set_seed(config.seed)
    if config.threads:
        torch.set_num_threads(config.threads)
    device = common.pick_device(config.device)
    precision = common.training_precision(config.precision, device)
    data = training_data(dict_path, train_specs, config, mentions=mentions, monitor=monitor)

    base = load_encoder(encoder, device=device, threads=config.threads)
    start = resume_point(out, resume=resume, finished=finished, extra={
        "queries": data.query_stats, "dictionary_names": len(data.dictionary.names)})
    run = start_run(base, start, data, config, device, precision)
    for epoch in range(run.state["epoch"], config.epochs):
        candidates = mine_candidates(run)
        log.info("epoch %d candidates in %.0fs: dense Acc@1 on train %.3f, on monitor %s, %d/%d queries without a "
                 "positive", epoch + 1, candidates.seconds, candidates.dense_acc1, candidates.watch_acc1,
                 candidates.no_positive, len(data.queries))
        if train_epoch(run, candidates, epoch, show_progress=show_progress):
            break  # stopped by the time budget
        run.state["epoch"] = epoch + 1
        if epoch + 1 < config.epochs:
            common.save_checkpoint(out, run.model, run.optimizer, run.state, run.metrics,
                                   {"sparse_weight": run.sparse_weight.detach()})
    return finish_run(run, out, encoder=encoder, spec=base.spec, train_specs=train_specs, dict_path=dict_path,
                      resume=resume)


def start_run(base, start: ResumePoint, data: TrainingData, config: BiosynConfig, device: str, precision: str) -> _Run:
    """The model (`base`, a loaded `linker.encoders.Encoder`, with the weights of `start` when it resumes), the
    learned sparse weight and their optimizer, ready for the first epoch to run."""
    sparse_weight = torch.nn.Parameter(torch.tensor(float(config.initial_sparse_weight), device=device))
    if start.weights_from is not None:
        from sentence_transformers import SentenceTransformer

        base.model.load_state_dict(SentenceTransformer(str(start.weights_from), device=device).state_dict())
        with torch.no_grad():
            sparse_weight.copy_(start.sparse_weight.to(device))
    model = base.model.to(device)
    original_max_length = model.max_seq_length
    model.max_seq_length = config.max_length
    counts = common.freeze(model, embeddings=config.freeze_embeddings, layers=config.freeze_layers)
    # RerankNet: Adam over the encoder (weight decay 0.01) and the sparse weight (its own lr, no decay).
    optimizer = common.adam(
        [
            {"params": [p for p in model.parameters() if p.requires_grad]},
            {"params": [sparse_weight], "lr": config.sparse_lr, "weight_decay": 0.0},
        ],
        decoupled=False,
        lr=config.lr,
        weight_decay=config.weight_decay,
    )
    if start.optimizer_state is not None:
        common.restore_optimizer(optimizer, *start.optimizer_state)
    return _Run(config, device, precision, data, _Texts.of(base.spec, data), model, optimizer, sparse_weight,
                start.metrics, start.state, counts, original_max_length)


def finish_run(run: _Run, out: Path, *, encoder: str, spec, train_specs: Sequence[str], dict_path: Path,
               resume: bool) -> dict:
    """The watched queries' last point, then the model folder: weights, ``biosyn.json`` (the sparse weight),
    the run's config and metrics; the summary `train_biosyn` returns."""
    model, metrics, config = run.model, run.metrics, run.config
    if run.data.watch and metrics.epochs:
        model.eval()
        metrics.extra["monitor_dense_acc1_after_training"] = monitor_acc1(
            run, common.embed_no_grad(model, run.texts.names, run.device, run.precision))
    model.max_seq_length = run.original_max_length
    model.eval()
    weight = float(run.sparse_weight.detach())
    metrics.extra.update({
        "train_seconds": run.timer.seconds,
        "hardware": common.hardware(run.device, config.threads),
        "precision": run.precision,
        "parameters": run.parameters,
        "sparse_weight": weight,
        "resumed": resume,
    })
    run_config = {
        **common.run_header("biosyn", encoder, spec),
        "config": asdict(config),
        "data": {"train": list(train_specs), "dict": str(dict_path)},
        "data_sha256": common.data_hashes([dict_path, *(f for s in train_specs for f in _spec_files(s))]),
    }
    common.write_outputs(out, model, config=run_config, metrics=metrics,
                         extra_files={SPARSE_WEIGHT_FILE: {"sparse_weight": weight, "score": "dense + sparse_weight * sparse"}})
    return {"out": str(out), "steps": run.state["step"], **metrics.extra,
            "first_loss": metrics.steps[0]["loss"] if metrics.steps else None,
            "last_epoch_loss": metrics.epochs[-1]["mean_loss"] if metrics.epochs else None}


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on, fixed for all its epochs: the dictionary, the training queries (gold widened by
    the dictionary's xrefs), the watched (`monitor`) queries, and the tf-idf side (BioSyn's char 1-2 index,
    the query vectors, and each query's `topk` sparse candidate rows)."""

    dictionary: Dictionary
    queries: list[Query]
    query_stats: dict
    watch: list[Query]
    sparse: TfidfNameIndex
    query_vectors: Any
    sparse_rows: np.ndarray  # (queries, topk)
    name_keys: np.ndarray  # the dictionary's keys as an array, to look up candidate rows


def training_data(dict_path: Path, train_specs: Sequence[str], config: BiosynConfig, *, mentions=None,
                  monitor=None) -> TrainingData:
    """Read the dictionary and the training mentions (`mentions`, or those of `train_specs`), make the queries
    and find their tf-idf candidates."""
    dictionary = load_dictionary(dict_path)
    if mentions is None:
        from linker.datasets import load_dataset

        mentions = [m for spec in train_specs for m in load_dataset(spec)]
    queries, query_stats = training_queries(mentions, config)
    # A mention annotated with an alternative id (NCBI's OMIM ids; MEDIC keys the disease by its MeSH
    # id and keeps OMIM in xrefs) has that concept's names as positives too.
    resolved = [Query(q.text, dictionary.resolve(q.gold)) for q in queries]
    query_stats["gold_widened_by_xrefs"] = sum(len(r.gold) > len(q.gold) for q, r in zip(queries, resolved))
    watch = watched_queries(monitor, dictionary, config) if monitor else []
    if len(dictionary.names) < config.topk:
        raise ConfigError(f"{dict_path}: {len(dictionary.names)} names, fewer than --topk {config.topk}")
    sparse = TfidfNameIndex.build(dictionary.names, PRESETS["medical-crossing"])  # BioSyn's char 1-2
    query_vectors = sparse.vectors([q.text for q in resolved])
    _, sparse_rows = sparse.search_vectors(query_vectors, config.topk)  # fixed for the whole run
    return TrainingData(dictionary, resolved, query_stats, watch, sparse, query_vectors, sparse_rows,
                        np.array(dictionary.keys, dtype=object))


@dataclass(frozen=True)
class _Texts:
    """What the encoder reads: names, training queries and watched queries with the encoder's prompts."""

    names: list[str]
    queries: list[str]
    watch: list[str]

    @classmethod
    def of(cls, spec, data: TrainingData) -> _Texts:
        query_prefix, name_prefix = spec.query_prefix or "", spec.passage_prefix or ""
        return cls([name_prefix + n for n in data.dictionary.names], [query_prefix + q.text for q in data.queries],
                   [query_prefix + q.text for q in data.watch])


# --------------------------------------------------------------------------- resume


@dataclass
class ResumePoint:
    """Where a run starts: afresh, from `<out>.checkpoint` (model, optimizer, sparse weight, counters), or from
    a finished `out` trained on (its weights and sparse weight; Adam starts afresh)."""

    state: dict  # {"epoch": epochs done, "step": steps done}
    metrics: common.Metrics
    weights_from: Path | None = None  # a model folder to load the weights from
    sparse_weight: torch.Tensor | None = None  # the learned sparse weight there
    optimizer_state: tuple | None = None  # (tensors, param groups) of `common.restore_optimizer`


def finished_run(out: Path) -> common.Metrics | None:
    """The metrics of a finished model folder at `out` that `--resume` may train on (None: none there);
    ConfigError for one stopped by --max-seconds inside an epoch, whose checkpoint is gone."""
    finished = common.finished_metrics(out)
    if finished is not None and "stopped_at_time_budget" in finished.extra:
        raise ConfigError(f"{out}: stopped by --max-seconds inside epoch {finished.extra['stopped_at_time_budget']['epoch']} "
                          "and its checkpoint is gone, so that epoch cannot be finished; train again without --resume")
    return finished


def resume_point(out: Path, *, resume: bool, finished: common.Metrics | None, extra: dict) -> ResumePoint:
    """A fresh start (metrics with `extra`), `out`'s checkpoint with `resume`, or the `finished` folder (`finished_run`)."""
    if resume and finished is None:
        weights_from, trainer_state, tensors, groups = common.load_checkpoint(out)
        return ResumePoint({"epoch": trainer_state["epoch"], "step": trainer_state["step"]},
                           common.Metrics.from_json(trainer_state["metrics"]), weights_from,
                           tensors["extra.sparse_weight"], (tensors, groups))
    if finished is not None:
        # A finished folder continued for more epochs: its weights and sparse weight, but its optimizer state went
        # with the checkpoint, so Adam starts afresh here (recorded, since that is not an uninterrupted run).
        state = {"epoch": len(finished.epochs), "step": len(finished.steps)}
        finished.extra.setdefault("optimizer_restarted_before_epoch", []).append(state["epoch"] + 1)
        return ResumePoint(state, finished, out, torch.tensor(finished.extra["sparse_weight"]))
    return ResumePoint({"epoch": 0, "step": 0}, common.Metrics(extra=extra))


# --------------------------------------------------------------------------- epochs


@dataclass
class _Run:
    """One training run's moving parts, shared by the epoch stages."""

    config: BiosynConfig
    device: str
    precision: str
    data: TrainingData
    texts: _Texts
    model: Any  # a SentenceTransformer
    optimizer: torch.optim.Optimizer
    sparse_weight: torch.nn.Parameter
    metrics: common.Metrics
    state: dict  # {"epoch", "step"} done
    parameters: dict  # trainable / frozen counts (`common.freeze`)
    original_max_length: int  # the encoder's own token limit, restored before saving
    timer: common.Timer = field(default_factory=common.Timer)


@dataclass(frozen=True)
class Candidates:
    """One epoch's candidates (BioSyn's iterative candidate retrieval) and what was measured on the way."""

    rows: np.ndarray  # (queries, topk) name rows, -1 = no candidate
    sparse: np.ndarray  # (queries, topk) their tf-idf scores
    positive: np.ndarray  # (queries, topk) bool: a name of a gold concept
    dense_acc1: float  # the current encoder's dense Acc@1 on the training queries
    watch_acc1: float | None  # ... on the watched queries (None: none)
    seconds: float

    @property
    def no_positive(self) -> int:
        return int((~self.positive.any(axis=1)).sum())


def monitor_acc1(run: _Run, name_vectors: np.ndarray) -> float | None:
    """Dense Acc@1 of the watched queries against the dictionary's vectors (None without watched queries)."""
    if not run.data.watch:
        return None
    top = dense_top(common.embed_no_grad(run.model, run.texts.watch, run.device, run.precision), name_vectors, 1)[:, 0]
    return round(acc_at_1(run.data.watch, run.data.name_keys, top), 4)


def mine_candidates(run: _Run) -> Candidates:
    """Dense candidates afresh from the current encoder, merged with the fixed sparse ones (`merge_candidates`)."""
    refresh = common.Timer()
    data, config = run.data, run.config
    name_vectors = common.embed_no_grad(run.model, run.texts.names, run.device, run.precision)
    query_dense = common.embed_no_grad(run.model, run.texts.queries, run.device, run.precision)
    dense_rows = dense_top(query_dense, name_vectors, config.topk)
    rows = merge_candidates(dense_rows, data.sparse_rows, config.topk, config.dense_ratio)
    name_keys = data.name_keys
    positive = np.array([[r >= 0 and name_keys[r] in q.gold for r in row] for q, row in zip(data.queries, rows)],
                        dtype=bool)
    return Candidates(rows, data.sparse.score_rows(data.query_vectors, rows), positive,
                      acc_at_1(data.queries, name_keys, dense_rows[:, 0]), monitor_acc1(run, name_vectors),
                      refresh.seconds)


def train_epoch(run: _Run, candidates: Candidates, epoch: int, *, show_progress: bool = False) -> bool:
    """One pass over the queries in seeded order, a step per batch with a positive; its record is appended to
    `run.metrics.epochs`. True when the time budget stopped it (recorded as ``stopped_at_time_budget``)."""
    config, metrics = run.config, run.metrics
    run.model.train()
    # Order and dropout seeded per epoch, so a resumed run repeats an uninterrupted one exactly.
    order = list(range(len(run.data.queries)))
    random.Random(config.seed + epoch).shuffle(order)
    torch.manual_seed(config.seed + epoch)
    steps_per_epoch = math.ceil(len(run.data.queries) / config.batch_size)
    bar = tqdm(range(steps_per_epoch), desc=f"biosyn epoch {epoch + 1}/{config.epochs}", disable=not show_progress)
    losses: list[float] = []
    skipped = 0
    for step in bar:
        idx = order[step * config.batch_size : (step + 1) * config.batch_size]
        result = _step(run, candidates, idx)
        if result is None:
            skipped += 1  # nothing to learn from this batch: no step, no loss recorded
            continue
        value, used = result
        losses.append(value)
        metrics.steps.append({"step": run.state["step"], "epoch": epoch + 1, "loss": round(value, 6), "queries": used,
                              "sparse_weight": round(float(run.sparse_weight.detach()), 6),
                              "seconds": run.timer.seconds})
        if not show_progress and (step + 1) % max(1, steps_per_epoch // 10) == 0:  # ~10 log lines per epoch
            log.info("%s epoch %d step %d/%d: loss %.4f (%.0fs)", "biosyn", epoch + 1, step + 1, steps_per_epoch,
                     value, run.timer.seconds)
        bar.set_postfix(loss=f"{value:.4f}", w=f"{float(run.sparse_weight.detach()):.3f}")
        if config.max_seconds is not None and run.timer.seconds > config.max_seconds:
            metrics.extra["stopped_at_time_budget"] = {"epoch": epoch + 1, "step_in_epoch": step + 1,
                                                       "steps_per_epoch": steps_per_epoch}
            log.info("biosyn: time budget of %.0fs reached after step %d/%d of epoch %d; saving",
                     config.max_seconds, step + 1, steps_per_epoch, epoch + 1)
            break
    metrics.epochs.append({
        "epoch": epoch + 1,
        "mean_loss": round(sum(losses) / len(losses), 6) if losses else None,
        "train_dense_acc1_before_epoch": round(candidates.dense_acc1, 4),
        "monitor_dense_acc1_before_epoch": candidates.watch_acc1,
        "queries_without_positive": candidates.no_positive,
        "batches_without_positive": skipped,
        "sparse_weight": round(float(run.sparse_weight.detach()), 6),
        "candidate_seconds": candidates.seconds,
        "seconds": run.timer.seconds,
    })
    return "stopped_at_time_budget" in metrics.extra


def _step(run: _Run, candidates: Candidates, idx: list[int]) -> tuple[float, int] | None:
    """One optimiser step on the queries `idx`: the marginal NLL of their gold candidates under
    ``logit_scale * (dense + sparse_weight * sparse)``; (loss, queries used), or None for a batch without a positive."""
    config, device = run.config, run.device
    rows = candidates.rows[idx]  # (batch, topk), -1 = no candidate
    valid = torch.from_numpy(rows >= 0).to(device)
    pos = torch.from_numpy(candidates.positive[idx]).to(device)
    if not bool(pos.any()):
        return None
    with autocast(run.precision, device):
        # one call: queries and candidates share its length buckets
        vectors = common.embed(run.model, [run.texts.queries[i] for i in idx]
                               + [run.texts.names[max(r, 0)] for r in rows.ravel()], device)
    vectors = F.normalize(vectors.float(), dim=1)
    q_vec, c_vec = vectors[: len(idx)], vectors[len(idx) :]  # (batch, dim), (batch * topk, dim)
    c_vec = c_vec.view(len(idx), config.topk, -1)  # (batch, topk, dim)
    dense = torch.einsum("bd,bkd->bk", q_vec, c_vec)  # (batch, topk) cosine
    s = torch.from_numpy(candidates.sparse[idx]).to(device)
    logits = config.logit_scale * (dense + run.sparse_weight * s)
    logits = logits.masked_fill(~valid, float("-inf"))
    loss, used = marginal_nll(logits, pos)
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    run.state["step"] += 1
    return float(loss.detach()), used


def _spec_files(spec: str) -> Sequence[Path]:
    """The file(s) a dataset spec names ("FORMAT:PATH[#option]"), for hashing; folders hash nothing."""
    _, _, rest = spec.partition(":")
    path = Path(rest.split("#", 1)[0])
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
