"""What the default index gets wrong on the lay development slice, and what tells a wrong answer from a right one.

    python -m bench.lay_dev_errors [--index indexes/default] [--out eval/lay/dev_errors]

Links the held-in set that `make demo`'s calibration is fitted on (the 632 lay development phrases, their own names
masked out of the index, and 1,000 of the index's names) as `linker calibrate` does, with the index's re-ranker,
mix weight and margin rule, and reports:

1. *Confidence inputs*, out of fold (5 folds, as `linker calibrate` chooses its margin weight): the Brier score and
   the `auto` band (out-of-fold confidence at least 0.95) of the shipped map's input (score + margin weight x margin
   + exactness), of that input plus a weight x the retrievers' agreement (the dense retriever's top concept is the
   re-ranked top one) for each weight, and of a logistic regression over every signal (score, margin, exactness,
   agreement, cosine, re-ranker logit), cross-fitted with the isotonic map on the same folds.
2. *The wrong answers* on the development phrases, by kind: the gold concept not among the re-ranked top k (the
   retriever's miss); the answer an HPO ancestor or descendant of the gold; a sibling (they share an `is_a` parent);
   an ICD-10-CM code; another HPO concept.

The lay test set is never read.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import numpy as np

from bench import data
from bench.report import Report, table

ROOT = Path(__file__).resolve().parents[1]
AGREEMENT_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
DICTIONARY_NAMES = 1000  # as the Makefile's `linker calibrate --dictionary-names`
KINDS = ("gold not among the re-ranked", "HPO ancestor or descendant", "HPO sibling", "ICD-10-CM code",
         "other HPO concept")


def held_in(index: Path) -> dict:
    """The calibration's held-in set linked by `index` as `linker calibrate` links it: per mention with a candidate,
    its best candidate's Ranked, right or wrong, and whether it is a dictionary name."""
    from linker.confidence import MARGIN_FETCH
    from linker.eval import calibrate as cal
    from linker.eval.metrics import mention_hits
    from linker.eval.report import gold_matcher, predict, top_of
    from linker.link import Linker
    from linker.sources.default import LAY_DEV, LAY_DEV_HELDOUT

    linker_ = Linker.load(index, rerank_precision="fp32")
    shipped, linker_.calibration = linker_.calibration, None
    mentions, from_sample, exclude, _ = cal._held_in(linker_, f"lay:{LAY_DEV}", [LAY_DEV_HELDOUT], DICTIONARY_NAMES)
    ranked = predict(linker_, mentions, MARGIN_FETCH, query_lang=False, progress=False, exclude=exclude)
    ranked = [tuple(cal.mix(r, shipped.retriever_weight) for r in q) for q in ranked]
    expand, _known = gold_matcher(linker_)
    correct = mention_hits([m.gold for m in mentions], [tuple(r.ids for r in q) for q in ranked], 1, composite="all",
                           expand=expand)
    keep = np.isfinite(top_of(ranked, "top_score"))
    top, margin, exact = cal._score_and_margin(ranked, keep)
    weakest = [min(q, key=lambda r: r.top_score) for q, kept in zip(ranked, keep) if kept]
    return {"calibration": shipped, "mentions": [m for m, kept in zip(mentions, keep) if kept], "ranked": weakest,
            "correct": correct[keep].astype(np.float64), "dictionary": from_sample[keep],
            "score": top, "margin": margin, "exact": exact,
            "agree": np.array([float(r.retriever_ids[0] == r.ids[0]) for r in weakest]),
            "cosine": np.array([r.retriever_scores[0] for r in weakest]),
            "logit": np.array([r.scores[0] - shipped.retriever_weight * r.retriever_scores[0] for r in weakest]),
            "rerank_k": linker_.rerank_k}


def _band(confidence: np.ndarray, correct: np.ndarray, mask: np.ndarray, auto: float) -> dict:
    chosen = confidence[mask] >= auto
    return {"auto_pct": round(100 * float(chosen.mean()), 2),
            "auto_precision": round(100 * float(correct[mask][chosen].mean()), 2) if chosen.any() else None}


def cross_fitted_regression(x: np.ndarray, correct: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """Each mention's confidence from a logistic regression over `x` (standardised) and an isotonic map of its
    output, both fitted on the other folds (`linker.confidence.fold_of`, as `out_of_fold` splits them)."""
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    from linker.confidence import fold_of

    fold = fold_of(len(x), folds, seed)
    out = np.empty(len(x))
    for f in np.unique(fold):
        train = fold != f
        mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-9
        model = LogisticRegression(max_iter=1000).fit((x[train] - mean) / std, correct[train])
        z = ((x - mean) / std) @ model.coef_[0]
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(z[train], correct[train])
        out[~train] = iso.predict(z[~train])
    return out


def confidence_inputs(h: dict) -> dict:
    """Out-of-fold Brier and `auto` band of each candidate input of the confidence map."""
    from linker.confidence import EXACT_OFFSET, MARGIN_FOLDS, map_input, out_of_fold

    c = h["calibration"]
    y, lay = h["correct"], ~h["dictionary"]
    base = map_input(h["score"], h["margin"], h["exact"], c.margin_weight, EXACT_OFFSET)
    inputs = {f"shipped: score + {c.margin_weight:g} x margin + exactness": out_of_fold(base, y)}
    for w in AGREEMENT_WEIGHTS:
        inputs[f"shipped + {w:g} x agreement"] = out_of_fold(base + w * h["agree"], y)
    signals = np.c_[h["score"], h["margin"], h["exact"], h["agree"], h["cosine"], h["logit"]]
    inputs["logistic regression over score, margin, exactness, agreement, cosine, logit"] = cross_fitted_regression(
        signals, y, MARGIN_FOLDS)
    return {name: {"brier": round(float(np.mean((conf - y) ** 2)), 5),
                   "all": _band(conf, y, np.ones(len(y), bool), c.auto_from),
                   "lay": _band(conf, y, lay, c.auto_from)} for name, conf in inputs.items()}


def error_kinds(h: dict, parents: dict[str, tuple[str, ...]]) -> dict:
    """The wrong answers on the development phrases by kind (`KINDS`), with up to 5 examples of each."""
    ancestors: dict[str, set[str]] = {}

    def up(term: str) -> set[str]:
        if term not in ancestors:
            ancestors[term] = set()  # a cycle ends here
            ancestors[term] = {p for parent in parents.get(term, ()) for p in (parent, *up(parent))}
        return ancestors[term]

    counts, examples = Counter(), {kind: [] for kind in KINDS}
    lay = ~h["dictionary"]
    right = h["correct"].astype(bool)
    for mention, ranked, wrong in zip(h["mentions"], h["ranked"], lay & ~right):
        if not wrong:
            continue
        gold = {g for alternative in mention.gold for g in alternative}
        got = ranked.ids[0]
        if not gold & set(ranked.ids[:h["rerank_k"]]):
            kind = KINDS[0]
        elif not got.startswith("HP:"):
            kind = KINDS[3]
        elif any(got in up(g) or g in up(got) for g in gold):
            kind = KINDS[1]
        elif any(set(parents.get(got, ())) & set(parents.get(g, ())) for g in gold):
            kind = KINDS[2]
        else:
            kind = KINDS[4]
        counts[kind] += 1
        if len(examples[kind]) < 5:
            examples[kind].append({"phrase": mention.text, "gold": sorted(gold), "answer": got,
                                   "answer_name": ranked.names[0]})
    return {"phrases": int(lay.sum()), "wrong": int((lay & ~right).sum()),
            "by_kind": {kind: counts[kind] for kind in KINDS}, "examples": examples}


def markdown(r: dict) -> list[str]:
    e = r["errors"]
    lines = [f"Index `{r['index']}` (its re-ranker over the top {r['rerank_k']}, its mix weight and margin rule); "
             f"held-in set: {r['mentions']:,} mentions ({e['phrases']} lay development phrases, their names masked, "
             f"and {r['mentions'] - e['phrases']:,} of the index's names), as `make demo`'s `linker calibrate` "
             "links them. The lay test set is not read.", "",
             "## Which inputs tell a wrong answer from a right one", "",
             "Out of fold (5 folds): Brier score (lower is better) and the `auto` band, the mentions whose "
             "confidence is at least 0.95, with its precision: over the whole held-in set and over the lay "
             "phrases alone. *Agreement*: the dense retriever's own top concept is the re-ranked top one.", ""]
    lines += table(["map input", "Brier", "auto, all (%)", "its precision", "auto, lay phrases (%)", "its precision"],
                   [[name, f"{v['brier']:.5f}", v["all"]["auto_pct"], v["all"]["auto_precision"],
                     v["lay"]["auto_pct"], v["lay"]["auto_precision"]] for name, v in r["inputs"].items()],
                   align="lrrrrr")
    lines += ["", f"## The wrong answers on the {e['phrases']} development phrases", "",
              f"{e['wrong']} wrong ({100 * e['wrong'] / e['phrases']:.1f}%), by kind (the HPO hierarchy of "
              f"`{r['hpo']}`):", ""]
    lines += table(["kind", "phrases", "share of the wrong (%)", "examples (phrase → answer)"],
                   [[kind, n, f"{100 * n / max(e['wrong'], 1):.1f}",
                     "; ".join(f"{x['phrase']} → {x['answer']} {x['answer_name']}" for x in e["examples"][kind][:3])]
                    for kind, n in e["by_kind"].items()], align="lrrl")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=ROOT / "indexes" / "default")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "lay" / "dev_errors",
                        help="report path without its suffix (.md and .json are written)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from linker.sources.obo import read_obo_parents

    hpo = data.get("hpo").check().paths("obo")[0]
    report = Report(args.out.name, out=args.out.parent,
                    title="The default index on the lay development slice: what is wrong, and what tells it")
    h = held_in(args.index)
    result = {"index": os.path.relpath(args.index, ROOT), "rerank_k": h["rerank_k"], "mentions": len(h["correct"]),
              "hpo": f"../shared/data/{hpo.parent.name}/{hpo.name}", "inputs": confidence_inputs(h),
              "errors": error_kinds(h, read_obo_parents(hpo))}
    report.write(result, markdown(result))


if __name__ == "__main__":
    main()
