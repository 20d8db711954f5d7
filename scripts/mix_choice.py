"""How `linker calibrate` should choose a re-ranker's mix weight on a held-in set: rules compared by cross-fitting.

    .venv/bin/python scripts/mix_choice.py [--systems ncbi-sapinit-prior,...] [--repeats 300] [--threads 2]

A re-ranked system's final score is logit + w x retriever score, w chosen on held-in mentions. With a
few hundred of them the Acc@1-by-w curve is jagged, so its highest point is partly noise. For each
system (an index that scripts/rerank_confidence.py built under --work, re-ranker bound), the held-in
mentions are linked once and each mention's Acc@1 hit is read at every weight of two grids: the
15 weights `calibrate` used before (0, 1/4 .. 256, 1000, 4000, 1e6) and the quarter-octave grid
(`linker.eval.calibrate.RETRIEVER_WEIGHTS`). Then, --repeats times, the held-in set is split in random
halves; each rule chooses w on one half and is scored on the other (both ways round). The rules: the
old grid's best point (the smallest w on a tie), the fine grid's best point, and the fine grid's best
point after averaging each weight with 1, 2 or 4 neighbours on each side (a quarter, half, one octave);
the *oracle* (the other half's own best fine-grid weight) bounds what any rule could reach. No test
mention is read. Writes eval/rerank/mix_choice.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from rerank_confidence import datasets, rerank_k  # noqa: E402  (the systems' held-in sets and options)

from linker.eval.calibrate import RETRIEVER_WEIGHTS, choose_weight, mix_hits  # noqa: E402
from linker.eval.datasets import load_dataset  # noqa: E402
from linker.eval.metrics import mention_hits  # noqa: E402
from linker.eval.report import gold_matcher, predict  # noqa: E402
from linker.fileio import atomic_file, portable_paths  # noqa: E402
from linker.link import Linker  # noqa: E402

OLD_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1000.0, 4000.0, 1e6)
SYSTEMS = ("ncbi-sapinit-prior", "ncbi-sapall-sapinit-prior", "cantemist-mined-sapinit-prior",
           "cantemist-sapbiosyn-sapinit", "codiesp-mined-sapinit-prior", "codiesp-sapbiosyn-sapinit")
RULES = {  # name -> (grid, neighbours averaged on each side; 0: the grid's best point, the old rule on OLD_GRID)
    "old grid, best point": (OLD_GRID, 0),
    "fine grid, best point": (RETRIEVER_WEIGHTS, 0),
    "fine grid, ±1/4 octave": (RETRIEVER_WEIGHTS, 1),
    "fine grid, ±1/2 octave (adopted)": (RETRIEVER_WEIGHTS, 2),
    "fine grid, ±1 octave": (RETRIEVER_WEIGHTS, 4),
}


def held_in_hits(folder: Path, spec: dict, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(weights, hits[mention, weight], the retriever order's Acc@1) on the system's held-in set."""
    linker_ = Linker.load(folder, rerank_k=k)
    linker_.calibration = None  # the raw logit and retriever score, as `calibrate` sees them
    mentions = load_dataset(spec["heldin"])
    ranked = predict(linker_, mentions, 1, query_lang=False, progress=False)
    expand, _known = gold_matcher(linker_)
    gold, composite = [m.gold for m in mentions], spec["eval"].get("composite", "all")
    weights = np.array(sorted(set(OLD_GRID) | set(RETRIEVER_WEIGHTS)))
    hits = mix_hits(ranked, gold, weights, composite=composite, expand=expand).astype(np.float64)
    retriever = mention_hits(gold, [tuple(r.retriever_ids for r in q) for q in ranked], 1, composite=composite,
                             expand=expand)
    return weights, hits, float(np.mean(retriever))


def choose(rule: str, accuracy: dict[float, float]) -> float:
    grid, smoothing = RULES[rule]
    return choose_weight({w: accuracy[w] for w in grid}, smoothing)[0]


def cross_fit(weights: np.ndarray, hits: np.ndarray, repeats: int, seed: int) -> dict:
    """Per rule: held-out Acc@1 of the weight chosen on the other half, over `repeats` random halvings x 2."""
    rng = np.random.default_rng(seed)
    column = {float(w): i for i, w in enumerate(weights)}
    scores: dict[str, list[float]] = {rule: [] for rule in [*RULES, "oracle"]}
    n = len(hits)
    for _ in range(repeats):
        order = rng.permutation(n)
        for fit, score in ((order[: n // 2], order[n // 2:]), (order[n // 2:], order[: n // 2])):
            on_fit, on_score = hits[fit].mean(axis=0), hits[score].mean(axis=0)
            accuracy = {float(w): float(on_fit[i]) for i, w in enumerate(weights)}
            for rule in RULES:
                scores[rule].append(float(on_score[column[choose(rule, accuracy)]]))
            scores["oracle"].append(float(max(on_score[column[w]] for w in RETRIEVER_WEIGHTS)))
    old = np.array(scores["old grid, best point"])
    out = {}
    for rule, values in scores.items():
        diff = np.array(values) - old
        out[rule] = {"heldout_acc1": float(np.mean(values)), "gain_over_old": float(diff.mean()),
                     "splits_better": float(np.mean(diff > 0)), "splits_worse": float(np.mean(diff < 0))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "rr")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "rerank")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rerank-k", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    specs = datasets(args.data, args.work, rebuild=False)
    results = {}
    for name in [s.strip() for s in args.systems.split(",") if s.strip()]:
        spec = specs[name]
        folder = args.work / f"{name}_{spec['kind']}_rerank"
        if not (folder / "manifest.json").exists():
            raise SystemExit(f"{folder}: missing; `python scripts/rerank_confidence.py --datasets {name} "
                             "--systems reranked` builds it")
        weights, hits, retriever = held_in_hits(folder, spec, rerank_k(spec, args))
        whole = {float(w): float(a) for w, a in zip(weights, hits.mean(axis=0))}
        results[name] = {
            "heldin": spec["heldin"], "mentions": len(hits), "retriever_order_acc1": retriever,
            "whole_set_choice": {rule: {"weight": (w := choose(rule, whole)), "acc1": whole[w]} for rule in RULES},
            "cross_fit": cross_fit(weights, hits, args.repeats, args.seed),
            "acc1_by_weight": whole,
        }
        print(name, {r: round(v["gain_over_old"] * 100, 3) for r, v in results[name]["cross_fit"].items()}, flush=True)
    report = {"command": " ".join(["python", "scripts/mix_choice.py", *sys.argv[1:]]), "repeats": args.repeats,
              "seed": args.seed, "load_average_at_end": list(os.getloadavg()), "systems": results}
    with atomic_file(args.out / "mix_choice.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(report, indent=1), data=args.data))
    with atomic_file(args.out / "mix_choice.md") as tmp:
        tmp.write_text(portable_paths(markdown(report), data=args.data))
    print(markdown(report))


def markdown(report: dict) -> str:
    rules = [*RULES, "oracle"]
    lines = ["# Choosing the re-ranker / retriever mix weight on held-in data", "",
             f"`{report['command']}`: every rule chooses the weight on one random half of the held-in set and is "
             f"scored on the other half ({report['repeats']} halvings, both ways round, seed {report['seed']}). "
             "Gain: held-out Acc@1 minus that of the old rule (the best point of the 15-weight grid), in points; "
             "better / worse: the share of the splits where the rule's held-out Acc@1 is above / below the old rule's. "
             "The oracle takes the held-out half's own best weight: no rule can reach it. No test mention is read.", "",
             "| system | held-in mentions | " + " | ".join(rules) + " |",
             "|---|---|" + "---|" * len(rules)]
    gains = {rule: [] for rule in rules}
    for name, s in report["systems"].items():
        cells = []
        for rule in rules:
            c = s["cross_fit"][rule]
            gains[rule].append(c["gain_over_old"])
            cells.append(f"{100 * c['gain_over_old']:+.2f} ({100 * c['splits_better']:.0f}% / "
                         f"{100 * c['splits_worse']:.0f}%)" if rule != "old grid, best point"
                         else f"{100 * c['heldout_acc1']:.2f}")
        lines.append(f"| {name} | {s['mentions']:,} | " + " | ".join(cells) + " |")
    lines.append("| mean gain | | " + " | ".join("" if r == "old grid, best point" else
                                                 f"{100 * np.mean(gains[r]):+.2f}" for r in rules) + " |")
    lines += ["", "The old rule's column is its own held-out Acc@1 (%); the others: gain (better / worse).", "",
              "## The weight each rule chooses on the whole held-in set", "",
              "| system | retriever order Acc@1 | " + " | ".join(RULES) + " |", "|---|---|" + "---|" * len(RULES)]
    for name, s in report["systems"].items():
        lines.append(f"| {name} | {100 * s['retriever_order_acc1']:.2f} | " + " | ".join(
            f"{c['weight']:.4g} ({100 * c['acc1']:.2f})" for c in s["whole_set_choice"].values()) + " |")
    lines += ["", "Held-in sets: " + "; ".join(f"{n}: `{s['heldin']}`" for n, s in report["systems"].items()) + ".",
              f"Load average at the end: {', '.join(f'{x:.2f}' for x in report['load_average_at_end'])}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
