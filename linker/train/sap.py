"""SapBERT-style self-alignment pretraining on a concept table's own synonyms.

Liu et al. (NAACL 2021) pull the names of one concept together and push other concepts' names
apart, with a multi-similarity loss over hard pairs mined online in each batch. Training data
are pairs of names of the same concept taken from the dictionary itself, so no annotated
mentions are needed; with a multilingual table (HPO plus its es/fr/nl/de translations, UMLS
all languages) the pairs cross languages, which is how SapBERT-XLMR aligns languages.

With `SapConfig.hard_negatives`, each step also meets names of *other* concepts that the starting encoder puts
near the pairs' own names, mined once over a whole dictionary (BioSyn's lesson, Sung et al. 2020: negatives from
the dictionary, not only from the batch). A lay focus batch of 128 random concepts rarely holds "Injury of liver"
beside "liver damage"; the dictionary always does.

Plain torch loop over the sentence-transformers model (no trainer class), so the same code runs
on a laptop CPU and on a GPU, and every step's loss lands in the metrics JSON.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from linker.dictionary import read_concept_table
from linker.errors import ConfigError, LinkerError
from linker.precision import autocast, check_precision
from linker.text import normalize
from linker.train import common
from linker.train.losses import MultiSimilarityParams, multi_similarity_loss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SapConfig:
    """One SapBERT-style run. Defaults follow cambridgeltl/sapbert train/pretrain.sh unless noted."""

    lr: float = 2e-5  # pretrain.sh --learning_rate 2e-5
    weight_decay: float = 0.01  # train.py --weight_decay default 0.01 (AdamW)
    batch_size: int = 256  # pretrain.sh --train_batch_size 256 (pairs; 512 names per step)
    epochs: int = 1  # pretrain.sh --epoch 1
    max_length: int = 25  # pretrain.sh --max_length 25 (tokens; names are short)
    pairs_per_concept: int = 50  # data/generate_pretraining_data.ipynb: "if >50 pairs, then trim to 50" per CUI
    max_pairs: int | None = None  # overall cap after the per-concept cap (sampled with the seed)
    cross_lingual: bool = True  # with several languages, take cross-language pairs first
    use_miner: bool = True  # pretrain.sh --use_miner
    ms: MultiSimilarityParams = MultiSimilarityParams()
    freeze_embeddings: bool = False  # for e5-small the 250k-token embedding matrix dominates the cost
    freeze_layers: int = 0
    seed: int = 33  # pretrain.sh --random_seed 33
    device: str | None = None  # None = cuda when present, else cpu
    threads: int | None = None  # torch CPU threads; None keeps torch's default
    precision: str = "auto"  # forward passes in fp32 or bf16 (auto: bf16 where native); see common.training_precision
    # Names of other concepts mined per training name, nearest it under the starting encoder (`mine_negatives`);
    # each step adds one of its concept's for every pair. 0: the in-batch miner alone.
    hard_negatives: int = 0

    def __post_init__(self) -> None:
        check_precision(self.precision, allow_none=False)
        if self.batch_size < 2:
            raise ConfigError(f"batch size must be >= 2 (the loss needs negatives), found {self.batch_size}")
        if self.epochs < 1 or self.lr <= 0 or self.max_length < 4 or self.pairs_per_concept < 1:
            raise ConfigError(
                f"need epochs >= 1, lr > 0, max_length >= 4, pairs_per_concept >= 1; found "
                f"{self.epochs}, {self.lr}, {self.max_length}, {self.pairs_per_concept}"
            )
        if self.max_pairs is not None and self.max_pairs < 1:
            raise ConfigError(f"--max-pairs must be >= 1, found {self.max_pairs}")
        if self.freeze_layers < 0:
            raise ConfigError(f"--freeze-layers must be >= 0, found {self.freeze_layers}")
        if self.hard_negatives < 0:
            raise ConfigError(f"--hard-negatives must be >= 0, found {self.hard_negatives}")


@dataclass(frozen=True)
class SynonymPair:
    concept: int  # label: index of the concept among those that have pairs
    first: str
    second: str
    cross_lingual: bool
    concept_id: str  # the table's id: the label `mine_negatives` gives its negatives


def synonym_pairs(path: str | Path, config: SapConfig) -> tuple[list[SynonymPair], dict]:
    """Pairs of distinct names of the same concept, capped per concept and overall, seeded.

    Names equal after `normalize(..., "default")` count once (SapBERT lower-cases names and removes
    duplicates before pairing, data/generate_pretraining_data.ipynb).
    Cross-language pairs come first within a concept's cap when the table has several languages.
    """
    table = read_concept_table(path).table
    names: dict[str, dict[str, str]] = defaultdict(dict)  # concept -> normalised name -> (name, lang)
    langs: dict[str, str] = {}
    for cid, name, lang in zip(*(table.column(c).to_pylist() for c in ("concept_id", "name", "lang"))):
        key = normalize(name, "default")
        if key and key not in names[cid]:
            names[cid][key] = name
            langs[f"{cid}\t{key}"] = lang
    languages = sorted(set(langs.values()))
    rng = random.Random(config.seed)
    pairs: list[SynonymPair] = []
    concepts_with_pairs = 0
    for cid in sorted(names):
        keys = sorted(names[cid])
        if len(keys) < 2:
            continue
        candidates = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]]
        rng.shuffle(candidates)
        if config.cross_lingual and len(languages) > 1:
            candidates.sort(key=lambda ab: langs[f"{cid}\t{ab[0]}"] == langs[f"{cid}\t{ab[1]}"])  # stable
        label = concepts_with_pairs
        concepts_with_pairs += 1
        for a, b in candidates[: config.pairs_per_concept]:
            pairs.append(SynonymPair(label, names[cid][a], names[cid][b], langs[f"{cid}\t{a}"] != langs[f"{cid}\t{b}"],
                                     cid))
    if not pairs:
        raise LinkerError(
            f"{path}: no synonym pairs (no concept has two distinct names); self-alignment needs a "
            "dictionary with synonyms, e.g. MEDIC, UMLS or HPO with its translations"
        )
    if config.max_pairs is not None and len(pairs) > config.max_pairs:
        pairs = rng.sample(pairs, config.max_pairs)
    stats = {
        "concepts": len(names),
        "concepts_with_pairs": concepts_with_pairs,
        "pairs": len(pairs),
        "cross_lingual_pairs": sum(p.cross_lingual for p in pairs),
        "languages": languages,
    }
    log.info("synonym pairs: %s", stats)
    return pairs, stats


def mine_negatives(encoder, pairs: list[SynonymPair], table_path: str | Path, per_name: int
                   ) -> tuple[dict[int, list[tuple[str, int]]], dict]:
    """For each concept label of `pairs`, the names of other concepts of `table_path` nearest each of its names
    under `encoder` (`per_name` a name, exact inner-product search over normalised vectors), with the label each
    takes in a batch: its concept's own label when it has pairs, else one of its own past theirs. A name near
    several of the concept's names is kept as often, so it is drawn more often. A name equal, normalised, to one of
    the concept's own names is left out: the same string cannot be pushed away from itself."""
    from linker.extras import require

    faiss = require("faiss", extra="dense", what="mining hard negatives")
    started = time.perf_counter()
    table = read_concept_table(table_path).table
    rows: dict[tuple[str, str], str] = {}  # (concept, normalised name) -> name
    for cid, name in zip(table.column("concept_id").to_pylist(), table.column("name").to_pylist()):
        key = normalize(name, "default")
        if key:
            rows.setdefault((cid, key), name)
    concepts, keys, names = zip(*((cid, key, name) for (cid, key), name in rows.items()))
    label_of = {p.concept_id: p.concept for p in pairs}
    first_free = len(label_of)  # the pairs' labels are 0 .. len - 1
    outside = sorted({cid for cid in concepts if cid not in label_of})
    label_of.update({cid: first_free + i for i, cid in enumerate(outside)})
    own: dict[int, set[str]] = defaultdict(set)  # label -> its names, normalised
    anchors: dict[str, int] = {}  # each pair name -> its label
    for p in pairs:
        for name in (p.first, p.second):
            own[p.concept].add(normalize(name, "default"))
            anchors[name] = p.concept
    index = faiss.IndexFlatIP(encoder.dim)
    index.add(encoder.encode(list(names), role="passage"))
    queries = sorted(anchors)
    depth = min(len(names), 4 * per_name + 64)  # room for the concept's own names, skipped
    negatives: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for first in range(0, len(queries), 1024):
        chunk = queries[first:first + 1024]
        _, found = index.search(encoder.encode(chunk, role="query"), depth)
        for name, row in zip(chunk, found):
            label, kept = anchors[name], 0
            for j in row:
                if j < 0 or kept == per_name:
                    break
                if label_of[concepts[j]] != label and keys[j] not in own[label]:
                    negatives[label].append((names[j], label_of[concepts[j]]))
                    kept += 1
    stats = {"per_name": per_name, "from": str(table_path), "dictionary_names": len(names),
             "anchor_names": len(queries), "negatives": sum(map(len, negatives.values())),
             "seconds": round(time.perf_counter() - started, 1)}
    log.info("hard negatives: %s", stats)
    return dict(negatives), stats


def train_sap(
    dict_path: str | Path,
    *,
    encoder: str,
    out: str | Path,
    config: SapConfig = SapConfig(),
    resume: bool = False,
    show_progress: bool = False,
    overwrite: bool = False,
    negatives_from: str | Path | None = None,
) -> dict:
    """Fine-tune `encoder` on the synonym pairs of `dict_path`; write a model folder to `out`.

    Returns the metrics summary (also written as train_metrics.json beside the model). An
    existing `out` is replaced only with `overwrite` (and only a folder that linker wrote).
    `negatives_from`: the concept table the hard negatives are mined from (`config.hard_negatives`; default
    `dict_path`), with the starting encoder, before any step (again on resume: the same start mines the same).

    The stages: `synonym_pairs`, `mine_negatives` (with hard negatives), `start_run` (the model, from
    `<out>.checkpoint` with `resume`), `train_epoch` per epoch, `finish_run` (the model folder).
    """
    from linker.encoders import load_encoder

    out = Path(out)
    dict_path = Path(dict_path)
    if negatives_from is not None and not config.hard_negatives:
        raise ConfigError(f"--negatives-from {negatives_from}: nothing to mine there without --hard-negatives K "
                          "(names of other concepts a training name; 0 is the default)")
    negatives_from = Path(negatives_from) if negatives_from is not None else dict_path
    common.check_train_output(out, encoder=encoder, dict_path=dict_path, overwrite=overwrite,
                              tables=(negatives_from,))
    common.set_seed(config.seed)
    if config.threads:
        torch.set_num_threads(config.threads)
    device = common.pick_device(config.device)
    precision = common.training_precision(config.precision, device)
    pairs, pair_stats = synonym_pairs(dict_path, config)

    base = load_encoder(encoder, device=device, threads=config.threads)
    extra = {"pairs": pair_stats}
    negatives: dict[int, list[tuple[str, int]]] = {}
    if config.hard_negatives:
        negatives, extra["hard_negatives"] = mine_negatives(base, pairs, negatives_from, config.hard_negatives)
    run = start_run(base, out, pairs, common.Metrics(extra=extra), config, device, precision, resume=resume)
    run.negatives = negatives
    for epoch in range(run.state["epoch"], config.epochs):
        train_epoch(run, epoch, show_progress=show_progress)
        run.state["epoch"] = epoch + 1
        if epoch + 1 < config.epochs:
            common.save_checkpoint(out, run.model, run.optimizer, run.state, run.metrics)
    return finish_run(run, out, encoder=encoder, spec=base.spec, dict_path=dict_path,
                      negatives_from=negatives_from if negatives and negatives_from != dict_path else None,
                      resume=resume)


@dataclass
class _Run:
    """One training run's moving parts, shared by the epoch stages."""

    config: SapConfig
    device: str
    precision: str
    pairs: list[SynonymPair]
    prefix: str  # the encoder's passage prompt: dictionary names are passages at index time
    model: Any  # a SentenceTransformer
    optimizer: torch.optim.Optimizer
    metrics: common.Metrics
    state: dict  # {"epoch", "step"} done
    parameters: dict  # trainable / frozen counts (`common.freeze`)
    original_max_length: int  # the encoder's own token limit, restored before saving
    timer: common.Timer = field(default_factory=common.Timer)
    negatives: dict = field(default_factory=dict)  # label -> [(name, label)], `mine_negatives`


def start_run(base, out: Path, pairs: list[SynonymPair], metrics: common.Metrics, config: SapConfig, device: str,
              precision: str, *, resume: bool) -> _Run:
    """The model (`base`, a loaded `linker.encoders.Encoder`) and its optimizer, ready for the first epoch to run:
    afresh with `metrics`, or with the weights, optimizer state, counters and metrics of `<out>.checkpoint`."""
    state = {"epoch": 0, "step": 0}
    saved_optimizer = None
    if resume:
        model_dir, saved, tensors, groups = common.load_checkpoint(out)
        state = {"epoch": saved["epoch"], "step": saved["step"]}
        metrics = common.Metrics.from_json(saved["metrics"])
        saved_optimizer = (tensors, groups)
        from sentence_transformers import SentenceTransformer

        base.model.load_state_dict(SentenceTransformer(str(model_dir), device=device).state_dict())
    model = base.model.to(device)
    original_max_length = model.max_seq_length
    model.max_seq_length = config.max_length
    counts = common.freeze(model, embeddings=config.freeze_embeddings, layers=config.freeze_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = common.adam(params, decoupled=True, lr=config.lr, weight_decay=config.weight_decay)
    if saved_optimizer is not None:
        common.restore_optimizer(optimizer, *saved_optimizer)
    return _Run(config, device, precision, pairs, base.spec.passage_prefix or "", model, optimizer, metrics, state,
                counts, original_max_length)


def train_epoch(run: _Run, epoch: int, *, show_progress: bool = False) -> None:
    """One pass over the pairs in seeded order, a step per batch; its record is appended to `run.metrics.epochs`."""
    config, metrics = run.config, run.metrics
    run.model.train()  # every epoch: saving a checkpoint (model.save) leaves the model in eval mode
    # Order and dropout seeded per epoch, so a resumed run repeats an uninterrupted one exactly.
    order = list(range(len(run.pairs)))
    random.Random(config.seed + epoch).shuffle(order)
    torch.manual_seed(config.seed + epoch)
    draws = random.Random(f"hard negatives {config.seed} {epoch}")  # its own stream: the order stays as without
    steps_per_epoch = math.ceil(len(run.pairs) / config.batch_size)
    bar = tqdm(range(steps_per_epoch), desc=f"sap epoch {epoch + 1}/{config.epochs}", disable=not show_progress)
    epoch_losses: list[float] = []
    for step in bar:
        batch = [run.pairs[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]
        value, mined = _step(run, batch, draws)
        epoch_losses.append(value)
        metrics.steps.append({"step": run.state["step"], "epoch": epoch + 1, "loss": round(value, 6),
                              "mined_pairs": mined, "seconds": run.timer.seconds})
        if not show_progress and (step + 1) % max(1, steps_per_epoch // 10) == 0:  # ~10 log lines per epoch
            log.info("%s epoch %d step %d/%d: loss %.4f (%.0fs)", "sap", epoch + 1, step + 1, steps_per_epoch,
                     value, run.timer.seconds)
        bar.set_postfix(loss=f"{value:.4f}")
    metrics.epochs.append({"epoch": epoch + 1, "mean_loss": round(sum(epoch_losses) / len(epoch_losses), 6),
                           "seconds": run.timer.seconds})
    log.info("sap epoch %d: mean loss %.4f (%.0fs)", epoch + 1, metrics.epochs[-1]["mean_loss"], run.timer.seconds)


def _step(run: _Run, batch: list[SynonymPair], draws: random.Random) -> tuple[float, int]:
    """One optimiser step on the pairs `batch`: the multi-similarity loss of their 2 * batch names, labelled by
    concept, and of one hard negative a pair drawn from its concept's (`run.negatives`); (loss, mined pairs). No
    update when the miner finds no hard pair."""
    config, device = run.config, run.device
    texts = [run.prefix + p.first for p in batch] + [run.prefix + p.second for p in batch]
    labels = [p.concept for p in batch] * 2
    for p in batch:
        options = run.negatives.get(p.concept)
        if options:
            name, label = options[draws.randrange(len(options))]
            texts.append(run.prefix + name)
            labels.append(label)
    labels = torch.tensor(labels, device=device)
    with autocast(run.precision, device):
        vectors = common.embed(run.model, texts, device)  # (2 * batch + negatives drawn, dim)
    loss, mined = multi_similarity_loss(vectors.float(), labels, config.ms, mine=config.use_miner)
    run.optimizer.zero_grad()
    if mined:
        loss.backward()
        run.optimizer.step()
    run.state["step"] += 1
    return float(loss.detach()), mined


def finish_run(run: _Run, out: Path, *, encoder: str, spec, dict_path: Path, negatives_from: Path | None,
               resume: bool) -> dict:
    """The model folder: weights, the run's config and metrics; the summary `train_sap` returns."""
    model, metrics, config = run.model, run.metrics, run.config
    model.max_seq_length = run.original_max_length
    model.eval()
    metrics.extra.update({
        "train_seconds": run.timer.seconds,
        "pairs_per_second": round(len(run.pairs) * (config.epochs) / max(run.timer.seconds, 1e-9), 2),
        "precision": run.precision,
        "hardware": common.hardware(run.device, config.threads),
        "parameters": run.parameters,
        "resumed": resume,
    })
    run_config = {
        **common.run_header("sap", encoder, spec),
        "config": asdict(config),
        "data": {"dict": str(dict_path), **({"negatives_from": str(negatives_from)} if negatives_from else {})},
        "data_sha256": common.data_hashes([dict_path, *([negatives_from] if negatives_from else [])]),
    }
    common.write_outputs(out, model, config=run_config, metrics=metrics)
    return {"out": str(out), "steps": run.state["step"], **metrics.extra,
            "first_loss": metrics.steps[0]["loss"] if metrics.steps else None,
            "last_epoch_loss": metrics.epochs[-1]["mean_loss"] if metrics.epochs else None}
