"""Re-rank latency per mention: retriever alone vs retriever + cross-encoder, alternated in one process.

    .venv/bin/python scripts/bench_rerank.py --index indexes/rr/ncbi_tfidf --rerank models/rr-ncbi-minilm
        --dataset SPEC [--mentions 200] [--rerank-k 16] [--runs 3] [--threads 2] [--name bench_rerank_ncbi]

The machine is shared, so the figure that travels is the *ratio* of the two (median of --runs
alternated runs, the same mentions in the same batches); milliseconds per mention and the load
average are recorded beside it. Writes eval/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from linker.eval.datasets import load_dataset
from linker.fileio import atomic_file, portable_paths
from linker.link import Linker

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--rerank", type=Path, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--mentions", type=int, default=200)
    parser.add_argument("--rerank-k", type=int, default=16)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="bench_rerank")
    parser.add_argument("--out", type=Path, default=ROOT / "eval")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="the shared data folder, written as ../shared/data in the report")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = list(dict.fromkeys(m.text for m in load_dataset(args.dataset)))[: args.mentions]
    contenders = {"retriever": Linker.load(args.index, rerank="none"),
                  "retriever + re-ranker": Linker.load(args.index, rerank=args.rerank, rerank_k=args.rerank_k)}
    for linker in contenders.values():
        linker.link(texts[:8], k=args.k)  # warm-up: first-call allocations, tokenizer caches
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    loads = [os.getloadavg()]
    for _ in range(args.runs):
        for name, linker in contenders.items():
            started = time.perf_counter()
            linker.link(texts, k=args.k)
            seconds[name].append(time.perf_counter() - started)
        loads.append(os.getloadavg())
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "command": " ".join(["python", "scripts/bench_rerank.py", *sys.argv[1:]]),
        "mentions": len(texts), "k": args.k, "rerank_k": args.rerank_k, "runs": args.runs, "threads": args.threads,
        "seconds": seconds,
        "ms_per_mention_median": {name: 1000 * value / len(texts) for name, value in medians.items()},
        "ratio_reranked_to_retriever": medians["retriever + re-ranker"] / medians["retriever"],
        "load_average_per_run": [list(load) for load in loads],
        "cpu_count": os.cpu_count(),
    }
    ms = result["ms_per_mention_median"]
    md = "\n".join([
        f"# Re-rank latency: {args.name}", "",
        f"Produced by `{result['command']}`.", "",
        f"{len(texts)} distinct test mentions linked at k={args.k}, {args.runs} alternated runs, torch {args.threads} "
        f"threads on {os.cpu_count()} shared cores; load average before/after each run: {result['load_average_per_run']}.",
        "",
        "| system | median ms / mention | runs (s) |", "|---|---|---|",
        *[f"| {name} | {ms[name]:.1f} | {', '.join(f'{v:.2f}' for v in seconds[name])} |" for name in contenders],
        "",
        f"Re-ranking the top {args.rerank_k} costs **{result['ratio_reranked_to_retriever']:.1f}x** the retriever "
        "alone (median ratio; the absolute figures move with the machine's load).", "",
    ])
    for path, text in ((args.out / f"{args.name}.json", json.dumps(result, indent=2)), (args.out / f"{args.name}.md", md)):
        with atomic_file(path) as tmp:
            tmp.write_text(portable_paths(text, root=ROOT, data=args.data), encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
