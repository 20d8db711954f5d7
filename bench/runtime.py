"""The numpy query runtime against the torch encoder: parity on real mentions, and speed by batch size.

    python -m bench.runtime [--index indexes/default] [--runs 5] [--name bench_runtime]

Parity: the index's encoder is loaded both ways (`linker.encoders.load_query_encoder` with runtime ``numpy`` and
``torch``), and every distinct mention text of the lay development slice (``linker/data/lay/lay_dev.tsv``) and of
NCBI-disease's development set is encoded as a query: cosine of each text's two vectors, and the top-1 concept the
index links it to with each (the same `Linker`, the encoder swapped; k = 5). Speed: encoding batches of 1, 10, 100
and 1,000 of those texts, the two alternated in one process, median of --runs; wall seconds and this process's CPU
seconds (the cores are shared: CPU seconds travel better). Each encoder runs as the query path sets it up: the numpy
runtime on one BLAS thread (`linker.runtime.RUNTIME_THREADS`), torch on its default threads. The loads are timed
once each, after the index's load (whole-process start-up is in docs/performance.md). Writes
eval/bench/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from bench import data
from bench.report import Report, table
from linker.datasets import load_dataset
from linker.encoders import load_query_encoder
from linker.link import Linker

SIZES = (1, 10, 100, 1000)


def _timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--name", default="bench_runtime")
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    report = Report(args.name, out=args.out, title="Query runtime: numpy against torch")
    linker = Linker.load(args.index)
    dense = linker.index.names
    name = dense.encoder.spec.name
    load_seconds = {}
    encoders = {}
    for runtime in ("numpy", "torch"):
        started = time.perf_counter()
        encoders[runtime] = load_query_encoder(dense.encoder.spec, runtime=runtime,
                                               threads=dense.config.threads or None)
        load_seconds[runtime] = round(time.perf_counter() - started, 2)
    sets = {"lay dev": "lay:linker/data/lay/lay_dev.tsv", "NCBI-disease dev": data.get("ncbi").spec("dev")}
    parity_rows, parity = [], {}
    all_texts: list[str] = []
    for label, spec in sets.items():
        texts = list(dict.fromkeys(m.text for m in load_dataset(spec)))
        all_texts += texts
        vectors = {r: e.encode(texts, role="query") for r, e in encoders.items()}
        cosine = np.sum(vectors["numpy"] * vectors["torch"], axis=1)
        top1 = {}
        for runtime, encoder in encoders.items():
            dense.encoder = encoder
            top1[runtime] = [r.candidates[0].concept_id if r.candidates else None for r in linker.link(texts, k=5)]
        agree = float(np.mean([a == b for a, b in zip(top1["numpy"], top1["torch"])]))
        max_diff = float(np.abs(vectors["numpy"] - vectors["torch"]).max())
        parity[label] = {"spec": spec, "texts": len(texts), "top1_agreement": round(agree, 4),
                         "min_cosine": round(float(cosine.min()), 7), "mean_cosine": round(float(cosine.mean()), 7),
                         "max_abs_difference": max_diff}
        parity_rows.append([label, len(texts), f"{agree:.4f}", f"{cosine.min():.7f}", f"{cosine.mean():.7f}",
                            f"{max_diff:.1e}"])
    speed, speed_rows = {}, []
    for size in SIZES:
        batch = (all_texts * (size // len(all_texts) + 1))[:size]
        times = {r: [] for r in encoders}
        for _ in range(args.runs):
            for runtime, encoder in encoders.items():  # alternated, so that drift in the machine's load hits both
                times[runtime].append(_timed(lambda: encoder.encode(batch, role="query")))
        figures = {r: {"wall_s": statistics.median(w for w, _ in t), "cpu_s": statistics.median(c for _, c in t)}
                   for r, t in times.items()}
        speed[size] = figures
        n, t = figures["numpy"], figures["torch"]
        speed_rows.append([size, f"{n['wall_s'] * 1e3:.1f}", f"{t['wall_s'] * 1e3:.1f}", f"{n['cpu_s'] * 1e3:.1f}",
                           f"{t['cpu_s'] * 1e3:.1f}", f"{t['cpu_s'] / n['cpu_s']:.2f}"])
    lines = [
        f"Index `{args.index}` (encoder `{name}`, {dense.size:,} names); encoder loads, wall: numpy runtime "
        f"{load_seconds['numpy']} s (its modules imported by the index's own load before), torch "
        f"{load_seconds['torch']} s (torch, transformers and sentence-transformers imported first).", "",
        "## Parity (query vectors and linked top-1 concept, k = 5)", "",
        *table(["mentions", "distinct texts", "same top-1", "min cosine", "mean cosine", "max |difference|"],
               parity_rows, "lrrrrr"), "",
        f"## Encoding speed (median of {args.runs} alternated runs; milliseconds)", "",
        *table(["texts", "numpy wall", "torch wall", "numpy CPU", "torch CPU", "torch CPU / numpy CPU"], speed_rows,
               "rrrrrr"),
    ]
    report.write({"index": str(args.index), "encoder": name, "load_seconds": load_seconds, "parity": parity,
                  "speed": speed, "runs": args.runs}, lines)


if __name__ == "__main__":
    main()
