"""Re-rank latency per mention: retriever alone vs retriever + cross-encoder, alternated in one process.

    python -m bench.rerank --index indexes/rr/ncbi_tfidf --rerank models/rr-ncbi-minilm
        --dataset SPEC [--mentions 200] [--rerank-k 16] [--runs 3] [--threads 2] [--name bench_rerank_ncbi]
        [--precisions auto | fp32,bf16,int8,numpy]

The machine is shared, so the figure that travels is the *ratio* of the two (median of --runs
alternated runs, the same mentions in the same batches); milliseconds per mention and the load
average are recorded beside it. With several `--precisions` the re-ranker runs in each (the first
is the reference, fp32 the exact one) and the report adds their parity on the benchmarked mentions:
top-1 agreement with the first and each one's Acc@1 (each mention linked whole, as the benchmark
links it: a composite is right when some gold id is on top, BioSyn's rule), the index's calibrated
mix applying to all. ``int8`` is measured here only, as the library does not offer it for re-rankers: the fp32
re-ranker with its Linear layers quantised dynamically (`linker.precision.quantize_int8`), to show why. ``numpy`` is
fp32 in `linker.runtime`'s numpy cross-encoder (what a calibrated index loads: no torch); the others run on torch.
Writes eval/bench/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from bench.report import Report
from linker.datasets import load_dataset
from linker.eval.metrics import mention_hits
from linker.eval.report import gold_matcher
from linker.link import Linker
from linker.precision import quantize_int8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--rerank", required=True, help="a re-ranker folder or a shipped re-ranker's name")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--mentions", type=int, default=200, help="distinct mention texts; 0: all")
    parser.add_argument("--precisions", default="auto",
                        help="the re-ranker's, comma-separated: auto, fp32, bf16, int8 (torch), numpy (numpy fp32)")
    parser.add_argument("--rerank-k", type=int, default=16)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="bench_rerank")
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    report = Report(args.name, out=args.out, title=f"Re-rank latency: {args.name}")
    torch.set_num_threads(args.threads)
    mentions = load_dataset(args.dataset)
    texts = list(dict.fromkeys(m.text for m in mentions))[: args.mentions or None]
    precisions = list(dict.fromkeys(p.strip() for p in args.precisions.split(",")))
    reranked = [name_of(p, len(precisions)) for p in precisions]
    contenders = {"retriever": Linker.load(args.index, rerank="none")}
    for precision, name in zip(precisions, reranked):
        contenders[name] = Linker.load(args.index, rerank=args.rerank, rerank_k=args.rerank_k,
                                       rerank_precision="fp32" if precision in ("int8", "numpy") else precision,
                                       rerank_runtime="numpy" if precision == "numpy" else "torch")
        if precision == "int8":
            quantize_int8(contenders[name].reranker.model)
    for linker in contenders.values():
        linker.link(texts[:8], k=args.k)  # warm-up: first-call allocations, tokenizer caches
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    tops: dict[str, list[str | None]] = {}
    loads = [os.getloadavg()]
    for _ in range(args.runs):
        for name, linker in contenders.items():
            started = time.perf_counter()
            results = linker.link(texts, k=args.k)
            seconds[name].append(time.perf_counter() - started)
            tops[name] = [r.candidates[0].concept_id if r.candidates else None for r in results]
        loads.append(os.getloadavg())
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    parity = None
    if len(reranked) > 1:
        benchmarked = set(texts)
        expand, _known = gold_matcher(contenders["retriever"])  # one index behind every contender
        parity = {"reference": reranked[0], "mentions": sum(m.text in benchmarked for m in mentions),
                  "acc1": {name: accuracy_at_1(expand, mentions, texts, tops[name]) for name in contenders},
                  "top1_agreement": {name: sum(a == b for a, b in zip(tops[name], tops[reranked[0]])) / len(texts)
                                     for name in reranked[1:]}}
    result = {
        "mentions": len(texts), "k": args.k, "rerank_k": args.rerank_k, "runs": args.runs, "threads": args.threads,
        "seconds": seconds,
        "ms_per_mention_median": {name: 1000 * value / len(texts) for name, value in medians.items()},
        "ratio_reranked_to_retriever": {name: medians[name] / medians["retriever"] for name in reranked},
        **({"ratio_to_reference": {name: medians[name] / medians[reranked[0]] for name in reranked[1:]},
            "parity": parity} if parity else {}),
        "load_average_per_run": [list(load) for load in loads],
    }
    ms = result["ms_per_mention_median"]
    lines = [
        f"{len(texts)} distinct test mentions linked at k={args.k}, {args.runs} alternated runs, torch {args.threads} "
        f"threads; load average before/after each run: {result['load_average_per_run']}.",
        "",
        "| system | median ms / mention | runs (s) |", "|---|---|---|",
        *[f"| {name} | {ms[name]:.1f} | {', '.join(f'{v:.2f}' for v in seconds[name])} |" for name in contenders],
        "",
        *[f"- Re-ranking the top {args.rerank_k}{'' if len(reranked) == 1 else ' in ' + precision} costs "
          f"**{result['ratio_reranked_to_retriever'][name]:.1f}x** the retriever alone." for precision, name in
          zip(precisions, reranked)],
        "", "Median ratios; the absolute figures move with the machine's load.", "",
        *(parity_lines(result, reranked) if parity else []),
    ]
    report.write(result, lines)
    print("\n".join(lines))


def name_of(precision: str, count: int) -> str:
    return "retriever + re-ranker" + ("" if count == 1 else f" ({precision})")


def accuracy_at_1(expand, mentions, texts: list[str], tops: list[str | None]) -> float:
    """Acc@1 of the mentions whose text was benchmarked, from each text's top concept."""
    top_of = dict(zip(texts, tops))
    kept = [m for m in mentions if m.text in top_of]
    predicted = [((top_of[m.text],) if top_of[m.text] else (),) for m in kept]
    return float(mention_hits([m.gold for m in kept], predicted, 1, composite="any", expand=expand).mean())


def parity_lines(result: dict, reranked: list[str]) -> list[str]:
    parity = result["parity"]
    reference = parity["reference"]
    agreement, cost = parity["top1_agreement"], result["ratio_to_reference"]
    rows = []
    for name in ["retriever", *reranked]:
        agree = "–" if name not in agreement else f"{100 * agreement[name]:.2f}%"
        ratio = "1" if name == reference else "–" if name not in cost else f"{cost[name]:.2f}x"
        rows.append(f"| {name} | {100 * parity['acc1'][name]:.2f} | {agree} | {ratio} |")
    return [
        f"Parity on the {result['mentions']} texts ({parity['mentions']} mentions), against {reference}:", "",
        "| system | Acc@1 | top-1 agreement | time vs the reference |", "|---|---|---|---|", *rows, "",
    ]


if __name__ == "__main__":
    main()
