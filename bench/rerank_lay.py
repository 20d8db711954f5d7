"""Cross-encoder re-rankers behind the dense linker-en index, on the lay development slice only.

    python -m bench.rerank_lay --index INDEX --reranker LABEL=FOLDER [--reranker ...] [--k 32]
        [--trained LABEL='command'] [--out eval/rerank/lay_dev]

INDEX: a dense linker-en index over the default dictionary less every held-out lay name (the test and development
slices: `linker dict build --source default --exclude-names linker/data/lay/heldout_names.tsv --exclude-names
linker/data/lay/dev_names.tsv`). For each re-ranker: Acc@1 of the retriever alone, and of its top k re-ordered by
logit + w x retriever score for each mix weight w, and the weight `linker calibrate` would choose (its own mixing and
choice, `linker.eval.calibrate`), at k = 4, 8, 16 and --k. The lay test set is never read: this is where a re-ranker is chosen, or not.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from bench.report import Report, add_note_options, note_of, table

ROOT = Path(__file__).resolve().parents[1]
# The columns shown of `linker calibrate`'s grid (`RETRIEVER_WEIGHTS`: each is on it); the choice reads the whole grid.
SHOWN_WEIGHTS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def dev_rerank_accuracy(index: Path, reranker: str | Path, k: int, *, ks: tuple[int, ...] = (),
                        per_phrase: bool = False) -> dict:
    """Acc@1 on the lay development slice of the retriever alone, and of its top `k` re-scored by `reranker` and
    re-ordered by logit + w x retriever score, as `linker calibrate` mixes them (`mix_hits`), for each w of its grid;
    the weight it would choose there (`choose_weight`). The share whose gold is in the top `k` bounds both.
    `ks`: the same for fewer re-scored candidates, under ``by_k``. `per_phrase`: each table also lists, phrase by
    phrase, whether the retriever's top answer is right and whether the mix at the chosen weight is (0 / 1), for
    paired comparisons."""
    from linker.datasets import load_dataset
    from linker.eval.calibrate import RETRIEVER_WEIGHTS, choose_weight, mix_hits
    from linker.eval.metrics import mention_hits
    from linker.eval.report import gold_matcher, predict
    from linker.link import Linker
    from linker.sources.default import LAY_DEV

    mentions = load_dataset(f"lay:{LAY_DEV}")
    gold = [m.gold for m in mentions]
    out: dict = {"phrases": len(mentions), "rerank_k": k, "by_k": {}}
    linker_ = Linker.load(index, rerank=reranker, rerank_k=k)  # loaded once; each row sets how many it re-scores
    linker_.calibration = None  # the re-ranker's raw logits, as `linker calibrate` fits them
    expand, _known = gold_matcher(linker_)
    for top in sorted({*(t for t in ks if t < k), k}):
        linker_.rerank_k = top
        started = time.perf_counter()
        ranked = predict(linker_, mentions, top, query_lang=False, progress=False)
        seconds = time.perf_counter() - started

        def right(field: str, at: int) -> np.ndarray:
            return mention_hits(gold, [tuple(getattr(r, field) for r in q) for q in ranked], at, composite="all",
                                expand=expand)

        def share(hits: np.ndarray) -> float:
            return round(100 * float(hits.mean()), 2)

        by_mention = mix_hits(ranked, gold, RETRIEVER_WEIGHTS, composite="all", expand=expand)  # (phrases, weights)
        accuracy = {w: 100 * float(a) for w, a in zip(RETRIEVER_WEIGHTS, by_mention.mean(axis=0))}
        weight, smoothed = choose_weight(accuracy)
        retriever_right = right("retriever_ids", 1)
        table = {"retriever_acc": share(right("retriever_ids", top)), "retriever_acc1": share(retriever_right),
                 "reranked_acc1_by_mix_weight": {str(w): round(accuracy[w], 2) for w in SHOWN_WEIGHTS},
                 "calibrate_choice": {"retriever_weight": weight, "acc1": round(accuracy[weight], 2),
                                      "smoothed_acc1": round(smoothed, 2)},
                 "ms_per_phrase": round(1000 * seconds / len(mentions), 1)}
        if per_phrase:
            chosen = by_mention[:, RETRIEVER_WEIGHTS.index(weight)]  # the column `accuracy[weight]` averages
            table["per_phrase"] = {"retriever_right": retriever_right.astype(int).tolist(),
                                   "reranked_right": chosen.astype(int).tolist()}
        out["by_k"][str(top)] = table
    return out


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for value in values or ():
        label, sep, rest = value.partition("=")
        if not sep or not label or not rest:
            raise SystemExit(f"{option}: expected LABEL=VALUE, found {value!r}")
        out[label] = rest
    return out


def markdown(r: dict) -> list[str]:
    """The report's lines below its header (`bench.report.Report`)."""
    lines = [f"Index `{r['index']}`: the default dictionary less every held-out lay name. {r['phrases']} development "
             "phrases (`linker/data/lay/lay_dev.tsv`); the test set is not read.", "",
             "Each cell: Acc@1 of the retriever's top k re-scored by the re-ranker and re-ordered by logit + w x "
             "retriever score, as `linker calibrate` mixes them. w = 0 is the re-ranker alone. *calibrate's w*: the "
             "weight `linker calibrate` would choose on these phrases (the best Acc@1 averaged over half an octave "
             "of its grid, 0 to 2^20), with its Acc@1; the time is the whole link, retriever and re-ranker, "
             f"per phrase ({r['torch_threads']} torch threads).", "",
             *([r["note"], ""] if r.get("note") else [])]
    for label, row in r["rerankers"].items():
        lines += [f"## {label}", "", f"Folder `{row['folder']}`" + (f"; trained by `{row['trained']}`"
                                                                     if row.get("trained") else "") + ".", ""]
        lines += table(["k", "gold in top k", "retriever Acc@1", *(f"w = {w:g}" for w in SHOWN_WEIGHTS),
                        "calibrate's w", "its Acc@1", "ms a phrase"],
                       [[k, f"{t['retriever_acc']:.2f}", f"{t['retriever_acc1']:.2f}",
                         *(f"{v:.2f}" for v in t["reranked_acc1_by_mix_weight"].values()),
                         f"{t['calibrate_choice']['retriever_weight']:.3g}", f"{t['calibrate_choice']['acc1']:.2f}",
                         t["ms_per_phrase"]] for k, t in row["by_k"].items()], align="r" * (6 + len(SHOWN_WEIGHTS)))
        lines.append("")
    return lines


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--reranker", action="append", required=True, metavar="LABEL=FOLDER")
    parser.add_argument("--trained", action="append", metavar="LABEL=COMMAND", help="how LABEL was trained")
    parser.add_argument("--k", type=int, default=32)
    add_note_options(parser, "how the folders the commands name were made (a paragraph)")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "rerank" / "lay_dev",
                        help="report path without its suffix (.md and .json are written)")
    args = parser.parse_args()
    note = note_of(args)  # before any work: a missing file fails at once
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rerankers, trained = _pairs(args.reranker, "--reranker"), _pairs(args.trained, "--trained")
    report = Report(args.out.name, out=args.out.parent,
                    title="Re-rankers behind the dense linker-en index: the lay development slice")
    result = {"index": str(args.index), "note": note, "torch_threads": torch.get_num_threads(), "rerankers": {}}
    for label, folder in rerankers.items():
        row = dev_rerank_accuracy(args.index, folder, args.k, ks=(4, 8, 16))
        result["phrases"] = row.pop("phrases")
        result["rerankers"][label] = {"folder": folder, "trained": trained.get(label), **row}
    report.write(result, markdown(result))


if __name__ == "__main__":
    main()
