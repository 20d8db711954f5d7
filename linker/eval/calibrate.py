"""`calibrate`: fit an index's confidence map on held-in mentions and store it in the index folder.

Held-in means mentions with gold ids that the test set does not contain (a dev split, or
training mentions that are not also names of the index's dictionary: a mention that is itself a
dictionary name is an exact hit and would teach the map that every score is right). Each mention
gives one pair (its best candidate's final score, whether that candidate is right); mentions
without any candidate are left out (they are "no link" whatever the map says).

With a re-ranker, the same held-in set first chooses how its logit and the retriever's score mix
(final = logit + weight x retriever score). `RETRIEVER_WEIGHTS` runs from the re-ranker alone (0)
in quarter-octave steps to the retriever's order with the re-ranker breaking its ties (2**20, about
1e6: a dense retriever's top cosines can lie within 0.01 of each other, so 1000 still lets a logit
gap of 10 overturn them; at 1e6 only gaps below 1e-5 are the re-ranker's to decide).
`choose_weight` takes the best Acc@1 *averaged over half an octave either side* (the smallest
weight on a tie), not the best single point: a held-in set of a few hundred mentions makes the
curve jagged (NCBI-disease dev: 88.18 at 64, 86.91 at 128), and its highest point is partly that
set's noise. Chosen on one half of a held-in set and scored on the other (300 random halvings of
each of six held-in sets), this rule's held-out Acc@1 was on average above that of the best point
of the earlier 15-weight grid on every set, by 0.01 to 0.40 points, 0.12 on average
(scripts/mix_choice.py, eval/rerank/mix_choice.md). The map is then
fitted on the mixed score. A re-ranker whose chosen mix does not beat the retriever's own order
there is reported with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from linker.confidence import (
    AUTO_PRECISION, CALIBRATION, EXACT_OFFSET, EXACT_SCORE, MARGIN_FETCH, NO_LINK_BELOW, choose_margin_weight,
    expected_calibration_error, fit_isotonic, map_input, margins, out_of_fold, raw_probability, twins_of_top,
    write_calibration,
)
from linker.datasets import load_dataset, spec_inputs
from linker.errors import ConfigError
from linker.eval.metrics import mention_hits
from linker.eval.report import Ranked, gold_matcher, predict, top_of
from linker.eval.trust import decision_table
from linker.fileio import check_output, model_inputs

log = logging.getLogger(__name__)

RETRIEVER_WEIGHTS = (0.0, *(2.0 ** (i / 4) for i in range(-8, 81)))  # 0, then 1/4 .. 2**20 in quarter-octaves
MIX_SMOOTHING = 2  # grid neighbours averaged on each side of a weight: half an octave


def choose_weight(accuracy: dict[float, float], smoothing: int = MIX_SMOOTHING) -> tuple[float, float]:
    """(weight, its smoothed Acc@1): the best held-in Acc@1 averaged with `smoothing` grid neighbours
    on each side (fewer at the ends of the grid), the smallest weight on a tie."""
    weights = sorted(accuracy)
    values = np.array([accuracy[w] for w in weights], dtype=np.float64)
    smoothed = [float(values[max(0, i - smoothing): i + smoothing + 1].mean()) for i in range(len(values))]
    best = max(range(len(weights)), key=lambda i: (round(smoothed[i], 12), -i))  # rounded: float noise is no tie-break
    return weights[best], smoothed[best]


def mix(ranked: Ranked, weight: float) -> Ranked:
    """`ranked` re-ordered by re-ranker score + weight x retriever score (ties: the Linker's tie order)."""
    if not ranked.ids:
        return ranked
    scores = [s + weight * r for s, r in zip(ranked.scores, ranked.retriever_scores)]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], ranked.tie_key(i)))
    return Ranked(tuple(ranked.ids[i] for i in order), ranked.retriever_ids, scores[order[0]], ranked.top_confidence,
                  tuple(scores[i] for i in order), tuple(ranked.retriever_scores[i] for i in order),
                  tuple(ranked.ties[i] for i in order) if ranked.ties else (), None,
                  tuple(ranked.names[i] for i in order) if ranked.names else (),
                  tuple(ranked.sources[i] for i in order) if ranked.sources else ())


def mix_hits(ranked: list[tuple[Ranked, ...]], gold, weights, *, composite: str, expand) -> np.ndarray:
    """hits[mention, weight]: whether the mention is right at Acc@1 once its candidates are re-ordered by
    `mix(weight)` (the held-in curve `calibrate` chooses from, per mention for scripts/mix_choice.py)."""
    return np.stack([mention_hits(gold, [tuple(mix(r, w).ids for r in q) for q in ranked], 1, composite=composite,
                                  expand=expand) for w in weights], axis=1)


def check_calibration_output(index_dir: str | Path, dataset_spec: str, *, rerank: str | Path | None = None) -> None:
    """calibrate rewrites two files of the index folder (that is its job); neither may be a file it reads:
    the held-in mentions (and the files their spec names) or the re-ranker."""
    from linker.index.manifest import MANIFEST

    inputs = [*spec_inputs(dataset_spec, "--dataset"), *model_inputs(rerank, "--rerank")]
    for name, what in ((CALIBRATION, "calibration file"), (MANIFEST, "manifest")):
        check_output(Path(index_dir) / name, inputs=inputs, overwrite=True, option=f"--index {index_dir}: its {what}")


def calibrate(
    index_dir: str | Path,
    dataset_spec: str,
    *,
    rerank: str | Path | None = None,
    rerank_k: int | None = None,
    composite: str = "all",
    gold_via_xref: str | None = None,
    query_lang: bool = False,
    progress: bool | None = None,
    origin: str = "user",
    exclude_names: Sequence[str | Path] = (),
    auto_precision: float = AUTO_PRECISION,
    no_link_below: float = NO_LINK_BELOW,
    dictionary_names: int = 0,
) -> dict:
    """Link `dataset_spec` with the index (and re-ranker), fit isotonic P(correct | score), store it.

    `origin` is recorded in the manifest: "user" (held-in mentions of the user's own), or "default" (the shipped
    default index's, fitted on synonyms held out of its own dictionary); a later calibration replaces either.
    `dictionary_names`: that many names of the index join the held-in mentions (`dictionary_sample` says why).
    `exclude_names`: TSV files of (concept_id, name) pairs (as `linker dict build --exclude-names`) masked out while
    the mentions are linked, so that synonyms the index holds serve as held-out mentions, as a new mention would be.

    The map reads the score, the margin over the best rival (`margin_weight`, chosen by out-of-fold Brier score) and
    exactness; `auto_precision` and `no_link_below` are the decisions' thresholds (`linker.confidence`).

    Returns a summary: mentions, held-in Acc@1, ECE raw and fitted (in sample, out of fold), the held-in decisions.
    """
    from linker.link import Linker

    started = time.perf_counter()
    _check_probabilities(auto_precision=auto_precision, no_link_below=no_link_below)
    check_calibration_output(index_dir, dataset_spec, rerank=rerank)
    # fp32 (the map must not move with a CPU's bf16) at `rerank_k` or the replaced calibration's k: both recorded
    linker_ = Linker.load(index_dir, rerank=rerank, rerank_k=rerank_k, rerank_precision="fp32")
    linker_.calibration = None  # fit on the scorer's raw scores, whatever an earlier calibration said
    mentions, from_sample, exclude, held_out = _held_in(linker_, dataset_spec, exclude_names, dictionary_names)
    # the best rival past the top one's twins gives its margin (`linker.confidence.margins`)
    ranked = predict(linker_, mentions, MARGIN_FETCH, query_lang=query_lang, progress=progress, exclude=exclude)
    expand, _known = gold_matcher(linker_, gold_via_xref=gold_via_xref)
    gold = [m.gold for m in mentions]

    def hits_at(ranked_, field="ids", k=1):
        return mention_hits(gold, [tuple(getattr(r, field) for r in q) for q in ranked_], k, composite=composite,
                            expand=expand)

    weight, mixing, retriever_hits = 0.0, None, hits_at(ranked, "retriever_ids")
    if linker_.reranker is not None:
        weight, mixing = _choose_mixing(ranked, gold, hits_at, retriever_hits, composite=composite, expand=expand,
                                        rerank_k=linker_.rerank_k, where=(index_dir, dataset_spec))
        ranked = [tuple(mix(r, weight) for r in q) for q in ranked]
    correct = hits_at(ranked)
    scores = top_of(ranked, "top_score")
    keep = np.isfinite(scores)
    if keep.sum() < 2:
        raise ConfigError(f"calibration needs at least 2 held-in mentions with a candidate, found {int(keep.sum())}")
    feature, held_out_conf, margin_weight, brier = _fit_input(ranked, correct[keep], keep)
    shown = f"{dataset_spec} (names of {', '.join(held_out['files'])} held out)" if held_out else dataset_spec
    calibration = fit_isotonic(feature, correct[keep], scorer=linker_.scorer, fitted_on=shown,
                               retriever_weight=weight,  # the retriever's accuracy on the same mentions as `accuracy`:
                               retriever_accuracy=float(retriever_hits[keep].mean()) if mixing and keep.any() else None,
                               margin_weight=margin_weight, exact_offset=EXACT_OFFSET, **_reranker_run(linker_),
                               auto_from=auto_precision, auto_precision=auto_precision, no_link_below=no_link_below)
    manifest = write_calibration(index_dir, calibration, origin=origin)
    summary = {
        "index": str(index_dir), "dataset": dataset_spec,
        **({"held_out_names": held_out} if held_out else {}),
        "scorer": calibration.scorer, "mentions": len(mentions),
        **({"dictionary_names": int(from_sample.sum())} if dictionary_names else {}),
        "with_candidate": int(keep.sum()), "accuracy_at_1": round(float(correct[keep].mean()), 6),
        "ece_raw": round(expected_calibration_error(raw_probability(scores[keep], linker_.scorer), correct[keep]), 6),
        **_fit_summary(calibration, feature, held_out_conf, correct[keep], brier),
        **_decisions(calibration, held_out_conf, correct[keep], from_sample[keep], dataset_spec),
        **({"mixing": mixing} if mixing else {}),
        "files": sorted(manifest["files"]), "seconds": round(time.perf_counter() - started, 2),
    }
    log.info("calibrated %s on %d mentions: Acc@1 %.4f, ECE raw %.4f -> %.4f (in-sample)", index_dir,
             summary["with_candidate"], summary["accuracy_at_1"], summary["ece_raw"], summary["ece_fitted_in_sample"])
    return summary


def _reranker_run(linker_) -> dict:
    """How the re-ranker ran, for the calibration to record (nothing without one)."""
    if linker_.reranker is None:
        return {}
    return {"rerank_k": linker_.rerank_k, "rerank_precision": linker_.reranker.precision}


def _check_probabilities(**values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{name}: expected a probability from 0 to 1, found {value}")


def _held_in(linker_, dataset_spec: str, exclude_names: Sequence[str | Path], dictionary_names: int):
    """(mentions, whether each is a dictionary name, the row mask of `exclude_names`, its record): the dataset's
    mentions, then `dictionary_names` names of the index (`dictionary_sample`)."""
    mentions = load_dataset(dataset_spec)
    if not mentions:
        raise ConfigError(f"{dataset_spec}: no mentions with gold ids to calibrate on")
    exclude, held_out = _held_out_rows(linker_, exclude_names)
    sampled = dictionary_sample(linker_, dictionary_names, exclude)
    from_sample = np.r_[np.zeros(len(mentions), dtype=bool), np.ones(len(sampled), dtype=bool)]
    return [*mentions, *sampled], from_sample, exclude, held_out


def _fit_summary(calibration, feature: np.ndarray, held_out_conf: np.ndarray, correct: np.ndarray,
                 brier: dict[float, float]) -> dict:
    """ECE of the fitted map in sample and out of fold, its size, the margin weight and the thresholds."""
    return {
        "ece_fitted_in_sample": round(expected_calibration_error(calibration(feature), correct), 6),
        "ece_out_of_fold": round(expected_calibration_error(held_out_conf, correct), 6),
        "breakpoints": len(calibration.x),
        "margin_weight": calibration.margin_weight,
        "brier_out_of_fold_by_margin_weight": {str(w): round(b, 6) for w, b in brier.items()},
        "auto_from": calibration.auto_from, "auto_precision": calibration.auto_precision,
        "no_link_below": calibration.no_link_below,
    }


def _fit_input(ranked: list[tuple[Ranked, ...]], correct: np.ndarray, keep: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, float, dict[float, float]]:
    """The map's input per kept mention (score + margin_weight x margin + exactness, `linker.confidence`), the
    out-of-fold confidences of that input, the margin weight (`choose_margin_weight`) and the Brier score by weight."""
    top, margin, exact = _score_and_margin(ranked, keep)
    margin_weight, brier = choose_margin_weight(top, margin, correct, exact=exact)
    feature = map_input(top, margin, exact, margin_weight, EXACT_OFFSET)
    return feature, out_of_fold(feature, correct), margin_weight, brier


def _decisions(calibration, confidence: np.ndarray, correct: np.ndarray, from_sample: np.ndarray,
               dataset_spec: str) -> dict:
    """The held-in decisions (out of fold), overall and, with dictionary names, per source of mentions."""
    decided = np.array([calibration.decide(c) for c in confidence], dtype=object)
    out = {"decisions_out_of_fold": decision_table(decided, correct)}
    if from_sample.any():
        out["decisions_out_of_fold_by_source"] = {
            source: decision_table(decided[from_sample == own], correct[from_sample == own])
            for source, own in ((dataset_spec, False), ("dictionary names", True))}
    return out


def _score_and_margin(ranked: list[tuple[Ranked, ...]], keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kept mention, its weakest query's (by score) top score, margin (`linker.confidence.margins`) and whether
    the retriever matched a dictionary name exactly (`EXACT_SCORE`), as `Linker.link` gives them to the map."""
    rows = []
    for queries, kept in zip(ranked, keep):
        if kept:
            weakest = min(queries, key=lambda r: r.top_score)
            scores = np.asarray(weakest.scores)
            twins = twins_of_top(zip(weakest.names, weakest.sources), len(weakest.names)) if weakest.names else None
            rows.append((weakest.top_score, float(margins(scores, np.arange(len(scores)), twins)[0]),
                         float(weakest.retriever_scores[0] >= EXACT_SCORE)))
    out = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return out[:, 0], out[:, 1], out[:, 2]


DICTIONARY_SEED = 0


def dictionary_sample(linker_, n: int, exclude: np.ndarray | None) -> list:
    """`n` names of the index (rows not in `exclude`, drawn with `DICTIONARY_SEED`) as held-in mentions: a mention that
    is a dictionary name is common in use ("nausea") and never in a set of held-out synonyms, so without them the map
    never sees an exact match, nor that an exact name two concepts share is no clear win. The gold of
    a name is its own concept and the concepts of *other* sources with the same name (`name_key`): the default
    dictionary's HPO "Nausea" and ICD-10-CM R11.0 "Nausea" code the same thing in two terminologies, while a name two
    concepts of one source share is a real ambiguity, and only its own concept is right."""
    from linker.datasets import Mention
    from linker.sources.default import name_key

    if n < 0:
        raise ConfigError(f"dictionary_names: expected a count >= 0, found {n}")
    if n == 0:
        return []
    table = linker_.concepts.table
    rows = np.arange(table.num_rows) if exclude is None else np.nonzero(~exclude)[0]
    chosen = np.sort(np.random.default_rng(DICTIONARY_SEED).choice(rows, size=min(n, len(rows)), replace=False))
    picked = table.select(["concept_id", "name", "lang", "source"]).take(chosen).to_pylist()
    wanted = {name_key(r["name"]) for r in picked}
    same_name: dict[str, list[tuple[str, str]]] = {}  # name key -> (concept_id, source) of every row with it
    allowed = None if exclude is None else ~exclude
    for i, (cid, name, source) in enumerate(zip(*(table.column(c).to_pylist() for c in ("concept_id", "name", "source")))):
        if (allowed is None or allowed[i]) and (key := name_key(name)) in wanted:
            same_name.setdefault(key, []).append((cid, source))
    out = []
    for i, r in zip(chosen.tolist(), picked):
        others = [c for c, source in same_name[name_key(r["name"])] if source != r["source"]]
        gold = tuple(dict.fromkeys([r["concept_id"], *others]))
        out.append(Mention(r["name"], (gold,), r["lang"] or "en", "dictionary", int(i), int(i)))
    return out


def _held_out_rows(linker_, exclude_names: Sequence[str | Path]) -> tuple[np.ndarray | None, dict | None]:
    """`calibrate`'s mask of the index rows named in `exclude_names` (TSV (concept_id, name) pairs), and its record;
    (None, None) without files."""
    if not exclude_names:
        return None, None
    from linker.sources.default import name_key, read_name_pairs

    pairs = set().union(*(read_name_pairs(path) for path in exclude_names))
    table = linker_.concepts.table
    exclude = np.array([(c, name_key(n)) in pairs for c, n in zip(table.column("concept_id").to_pylist(),
                                                                   table.column("name").to_pylist())], dtype=bool)
    return exclude, {"files": [Path(p).name for p in exclude_names], "pairs": len(pairs), "rows": int(exclude.sum())}


def _choose_mixing(ranked, gold, hits_at, retriever_hits: np.ndarray, *, composite: str, expand, rerank_k: int,
                   where: tuple) -> tuple[float, dict]:
    """`calibrate`'s retriever weight in the re-ranker's mix (`RETRIEVER_WEIGHTS`, `choose_weight`) and its record;
    warns when the re-ranker does not beat the retriever's own order."""
    by_weight = mix_hits(ranked, gold, RETRIEVER_WEIGHTS, composite=composite, expand=expand).mean(axis=0)
    accuracy = {w: float(a) for w, a in zip(RETRIEVER_WEIGHTS, by_weight)}
    weight, smoothed = choose_weight(accuracy)
    retriever_order = float(retriever_hits.mean())
    # the share whose gold concept is among the re-scored candidates: what the best re-ranker could reach
    ceiling = hits_at(ranked, "retriever_ids", rerank_k)
    mixing = {"retriever_weight": weight, "accuracy_at_1_by_weight": accuracy, "smoothed_accuracy_at_1": smoothed,
              "accuracy_at_1_retriever_order": retriever_order, "reranker_helps": accuracy[weight] > retriever_order,
              "gold_among_reranked": float(ceiling.mean())}
    if not mixing["reranker_helps"]:
        log.warning("%s: the re-ranker does not beat the retriever's own order on %s (Acc@1 %.4f vs %.4f); "
                    "link without it (--rerank none)", *where, accuracy[weight], retriever_order)
    return weight, mixing
