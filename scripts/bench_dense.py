"""Dense-index benchmark on real names: encoder throughput and FAISS kinds (speed, recall).

Names: MEDIC (../shared/data/ncbi_disease/medic_06Jul2012.txt); queries: the NCBI-disease test
mentions. Measures
  1. names/s of each encoder (passage role, batch 64) on the first --encode-names names;
  2. for --faiss-names names encoded once with --faiss-encoder: build seconds, queries/s and
     recall@1/@10 against exact search (tie-aware, `linker.index.dense.recall_against_exact`)
     of flat, hnsw, ivf-sq8 and ivf-pq.
Writes eval/bench/bench_dense.json and eval/bench/bench_dense.md. The CPU may be shared: the load average
is recorded, and ratios within one run are more telling than absolute numbers.

    .venv/bin/python scripts/bench_dense.py [--encoders minilm,e5-small] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path


from linker.encoders import load_encoder
from linker.index.dense import DenseConfig, DenseNameIndex, _build_faiss, encode_names, recall_against_exact

DATA = Path(os.environ.get("LINKER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def medic_names(path: Path) -> list[str]:
    """Unique names of MEDIC lines `ID|ALT_IDS||name|synonym|...`, in file order."""
    seen: dict[str, None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        _, sep, rest = line.partition("||")
        if sep:
            for name in rest.split("|"):
                if name.strip():
                    seen.setdefault(name.strip(), None)
    return list(seen)


def ncbi_mentions(path: Path) -> list[str]:
    return [line.split("\t")[3] for line in path.read_text(encoding="utf-8").splitlines() if line.count("\t") >= 5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", default="minilm,e5-small")
    parser.add_argument("--encode-names", type=int, default=2000)
    parser.add_argument("--faiss-encoder", default="minilm")
    parser.add_argument("--faiss-names", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()

    names = medic_names(DATA / "ncbi_disease" / "medic_06Jul2012.txt")
    queries = ncbi_mentions(DATA / "ncbi_disease" / "NCBItestset_corpus.txt")
    result = {
        "data": {"names_available": len(names), "queries": len(queries)},
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "load_average_1m_start": round(os.getloadavg()[0], 2),
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
        embeddings = encode_names(subset, encoder, Path(work), batch_size=64)
        result["faiss_encode_seconds"] = round(time.perf_counter() - started, 1)
        query_vectors = encoder.encode(queries, role="query")
        base = DenseConfig(encoder=args.faiss_encoder, threads=args.threads)
        for kind in ("flat", "hnsw", "ivf-sq8", "ivf-pq"):
            config = replace(base, faiss_kind=kind)
            started = time.perf_counter()
            index = DenseNameIndex(encoder, config, embeddings, _build_faiss(embeddings, config))
            build_seconds = time.perf_counter() - started
            index.search_vectors(query_vectors[:32], 10)  # warm-up
            measured = recall_against_exact(index, query_vectors, (1, 10))
            result["faiss"][kind] = {"build_seconds": round(build_seconds, 2), **measured}
            print(kind, result["faiss"][kind])
    result["faiss_names"] = len(subset)
    result["load_average_1m_end"] = round(os.getloadavg()[0], 2)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_dense.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    base = DenseConfig()
    lines = [
        "# Dense index benchmark",
        "",
        f"{result['cpus']} CPUs, {args.threads} threads; 1-min load average {result['load_average_1m_start']} at start, "
        f"{result['load_average_1m_end']} at end (the machine was shared with other jobs, so absolute speeds are low "
        "and noisy; compare rows of one run).",
        "",
        "## Encoding names (passage role, batch 64)",
        "",
        "| encoder | dim | names | names/s |",
        "|---|---|---|---|",
        *(f"| {n} | {v['dim']} | {v['names']} | {v['names_per_s']} |" for n, v in result["encoders"].items()),
        "",
        f"## FAISS over {len(subset)} MEDIC names ({args.faiss_encoder}), {len(queries)} NCBI-disease test mentions",
        "",
        f"Defaults: hnsw M={base.hnsw_m} efSearch={base.hnsw_ef_search}; ivf nlist=4*sqrt(n), nprobe={base.ivf_nprobe}; "
        f"ivf-pq m={base.pq_m} x {base.pq_nbits} bits; IVF candidates re-ranked exactly (x{base.rerank_factor}).",
        "",
        "| kind | build s | queries/s | recall@1 | recall@10 |",
        "|---|---|---|---|---|",
        *(f"| {k} | {v['build_seconds']} | {v['approx_queries_per_s']} | {v['recall_at_1']} | {v['recall_at_10']} |"
          for k, v in result["faiss"].items()),
        "",
        "Recall is against exact search over the same vectors (ties count as hits).",
        "Regenerate: `.venv/bin/python scripts/bench_dense.py`",
        "",
    ]
    (args.out / "bench_dense.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
