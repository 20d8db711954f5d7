"""Dense-index benchmark on real names: encoder throughput and FAISS kinds (speed, recall).

Names: MEDIC; queries: the NCBI-disease test mentions (`bench.data`). Measures
  1. names/s of each encoder (passage role, batch 64) on the first --encode-names names;
  2. for --faiss-names names encoded once with --faiss-encoder: build seconds, queries/s and
     recall@1/@10 against exact search (tie-aware, `linker.index.dense.recall_against_exact`)
     of flat, hnsw, ivf-sq8 and ivf-pq (`DenseNameIndex.from_embeddings`, the kind set in `DenseConfig`).
Writes eval/bench/bench_dense.{md,json}; ratios within one run are more telling than absolute numbers.

    python -m bench.dense [--encoders minilm,e5-small] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench import data
from bench.report import Report, table
from linker.encoders import load_encoder
from linker.index.dense import DenseConfig, DenseNameIndex, encode_names, recall_against_exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", default="minilm,e5-small")
    parser.add_argument("--encode-names", type=int, default=2000)
    parser.add_argument("--faiss-encoder", default="minilm")
    parser.add_argument("--faiss-names", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()

    report = Report("bench_dense", out=args.out, title="Dense index benchmark")
    names, queries = data.medic_names(), data.pubtator_texts("test")
    result = {
        "data": {"names_available": len(names), "queries": len(queries)},
        "threads": args.threads,
        "encoders": {},
        "faiss": {},
    }
    encoders = {}
    for name in args.encoders.split(","):
        encoder = encoders[name] = load_encoder(name, threads=args.threads)
        sample = names[: args.encode_names]
        encoder.encode(sample[:64], role="passage")  # warm-up: first-call allocations
        started = time.perf_counter()
        encoder.encode(sample, role="passage", batch_size=64)
        seconds = time.perf_counter() - started
        result["encoders"][name] = {
            "dim": encoder.dim, "names": len(sample), "seconds": round(seconds, 2),
            "names_per_s": round(len(sample) / seconds, 1), "revision": encoder.spec.revision,
        }
        print(name, result["encoders"][name])

    encoder = encoders.get(args.faiss_encoder) or load_encoder(args.faiss_encoder, threads=args.threads)
    subset = names[: args.faiss_names]
    with tempfile.TemporaryDirectory(prefix="linker-bench-dense-") as work:
        started = time.perf_counter()
        embeddings, _ = encode_names(subset, encoder, Path(work), batch_size=64)
        result["faiss_encode_seconds"] = round(time.perf_counter() - started, 1)
        query_vectors = encoder.encode(queries, role="query")
        base = DenseConfig(encoder=args.faiss_encoder, threads=args.threads)
        for kind in ("flat", "hnsw", "ivf-sq8", "ivf-pq"):
            config = replace(base, faiss_kind=kind)
            started = time.perf_counter()
            index = DenseNameIndex.from_embeddings(encoder, config, embeddings)
            build_seconds = time.perf_counter() - started
            index.search_vectors(query_vectors[:32], 10)  # warm-up
            measured = recall_against_exact(index, query_vectors, (1, 10))
            result["faiss"][kind] = {"build_seconds": round(build_seconds, 2), **measured}
            print(kind, result["faiss"][kind])
    result["faiss_names"] = len(subset)
    base = DenseConfig()
    lines = [
        f"{args.threads} threads.",
        "",
        "## Encoding names (passage role, batch 64)",
        "",
        *table(["encoder", "dim", "names", "names/s"],
               [(n, v["dim"], v["names"], v["names_per_s"]) for n, v in result["encoders"].items()]),
        "",
        f"## FAISS over {len(subset)} MEDIC names ({args.faiss_encoder}), {len(queries)} NCBI-disease test mentions",
        "",
        f"Defaults: hnsw M={base.hnsw_m} efSearch={base.hnsw_ef_search}; ivf nlist=4*sqrt(n), nprobe={base.ivf_nprobe}; "
        f"ivf-pq m={base.pq_m} x {base.pq_nbits} bits; IVF candidates re-ranked exactly (x{base.rerank_factor}).",
        "",
        *table(["kind", "build s", "queries/s", "recall@1", "recall@10"],
               [(k, v["build_seconds"], v["approx_queries_per_s"], v["recall_at_1"], v["recall_at_10"])
                for k, v in result["faiss"].items()]),
        "",
        "Recall is against exact search over the same vectors (ties count as hits).",
    ]
    report.write(result, lines)


if __name__ == "__main__":
    main()
