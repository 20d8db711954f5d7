"""Encoders for the default index compared on the lay development slice only (the test set is never read).

    python -m bench.encoder_dev --encoder LABEL=ENCODER [--encoder ...] [--trained LABEL=COMMAND]
        [--work work/encoder_dev] [--out eval/lay/encoders_dev] [--note TEXT | --note-file PATH]

For each encoder (a shipped name or a model folder): a dense index over the default dictionary less every held-out
lay name, and its Acc@1 / Acc@5 on the development phrases (`linker.train.release.dev_accuracy`: the figure
`linker train release` chooses on; the index is kept under --work and reused while its encoder and table are
current); then the shipped re-ranker, linker-rerank-en, over its top 4 (as `make demo` binds it) and top 8, mixed
with the retriever's score at the weight `linker calibrate` would choose on these phrases
(`bench.rerank_lay.dev_rerank_accuracy`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench.report import Report, add_note_options, note_of, table
from bench.rerank_lay import _pairs, dev_rerank_accuracy

ROOT = Path(__file__).resolve().parents[1]
RERANKER = "linker-rerank-en"


def compare(encoders: dict[str, str], work: Path) -> dict:
    from linker.fileio import safe_stem
    from linker.train.release import dev_accuracy

    rows, flags = {}, {}  # flags: each encoder's right / wrong phrase by phrase at k = 4, for the pairing only
    for label, encoder in encoders.items():
        tag = safe_stem(label, "--encoder", what="a label")  # it names the index's folder under --work
        dense = dev_accuracy(encoder, work, tag)
        reranked = dev_rerank_accuracy(work / f"dev-index-{tag}", RERANKER, 8, ks=(4,), per_phrase=True)
        flags[label] = reranked["by_k"]["4"]["per_phrase"]
        rows[label] = {"encoder": encoder, **dense, "reranked": {
            k: {"gold_in_top_k": t["retriever_acc"], "acc1": t["calibrate_choice"]["acc1"],
                "retriever_weight": t["calibrate_choice"]["retriever_weight"]} for k, t in reranked["by_k"].items()}}
    first = next(iter(flags.values()), None)
    for label, row in rows.items():  # against the first encoder: right here only / right there only
        row["paired"] = {field: paired(first[field], flags[label][field])
                         for field in ("retriever_right", "reranked_right")}
    return rows


def paired(before: list[int], after: list[int]) -> dict:
    """Phrases right only after / only before, and the exact two-sided McNemar p of that split (a binomial test
    of the discordant phrases at 1/2): whether a gain is more than the phrases that happen to flip."""
    from math import comb

    gained = sum(1 for b, a in zip(before, after, strict=True) if a and not b)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b and not a)
    n, low = gained + lost, min(gained, lost)
    p = min(1.0, 2 * sum(comb(n, i) for i in range(low + 1)) / 2 ** n) if n else 1.0
    return {"gained": gained, "lost": lost, "p": round(p, 4)}


def markdown(result: dict) -> list[str]:
    rows = result["encoders"]
    phrases = next(iter(rows.values()))["phrases"] if rows else 0
    lines = [f"{phrases} development phrases (`linker/data/lay/lay_dev.tsv`); the test set is not read. Dense "
             "index over the default dictionary less every held-out lay name (`linker.train.release.dev_accuracy`). "
             f"*Re-ranked*: `{RERANKER}` over the top k, mixed at the weight `linker calibrate` chooses on these "
             "phrases, as `make demo` binds it at k = 4. At 632 phrases one phrase is 0.16 points and a 95% interval "
             "around 65% is about +-3.7: read differences of a point or two as a direction, not a result.", "",
             *([result["note"], ""] if result.get("note") else []),
             *table(["encoder", "Acc@1", "Acc@5", "gold in top 4", "re-ranked top 4: Acc@1", "gold in top 8",
                     "re-ranked top 8: Acc@1"],
                    [[label, f"{r['acc1']:.2f}", f"{r['acc5']:.2f}", f"{r['reranked']['4']['gold_in_top_k']:.2f}",
                      f"{r['reranked']['4']['acc1']:.2f}", f"{r['reranked']['8']['gold_in_top_k']:.2f}",
                      f"{r['reranked']['8']['acc1']:.2f}"] for label, r in rows.items()], align="lrrrrrr"), "",
             "Phrase by phrase against the first row (top 1 right only here / only there, exact McNemar p):", "",
             *table(["encoder", "dense top 1", "re-ranked top 4"],
                    [[label, *(f"+{r['paired'][f]['gained']} / -{r['paired'][f]['lost']} (p {r['paired'][f]['p']:.3f})"
                               for f in ("retriever_right", "reranked_right"))] for label, r in list(rows.items())[1:]],
                    align="lrr"), ""]
    trained = [(label, r["trained"]) for label, r in rows.items() if r.get("trained")]
    if trained:
        lines += ["How each was trained:", "", *(f"- {label}: `{command}`" for label, command in trained)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", action="append", required=True, metavar="LABEL=ENCODER")
    parser.add_argument("--trained", action="append", metavar="LABEL=COMMAND", help="how LABEL was trained")
    parser.add_argument("--work", type=Path, default=ROOT / "work" / "encoder_dev")
    add_note_options(parser, "a paragraph printed above the table")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "lay" / "encoders_dev",
                        help="report path without its suffix (.md and .json are written)")
    args = parser.parse_args()
    note = note_of(args)  # before any work: a missing file fails at once
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encoders, trained = _pairs(args.encoder, "--encoder"), _pairs(args.trained, "--trained")
    report = Report(args.out.name, out=args.out.parent,
                    title="Encoders for the default index: the lay development slice")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = compare(encoders, args.work)
    for label, row in rows.items():
        row["trained"] = trained.get(label)
    result = {"note": note, "encoders": rows}
    report.write(result, markdown(result))


if __name__ == "__main__":
    main()
