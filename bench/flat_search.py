"""The flat dense search: the proved exact top k (`exact_flat_topk`) against the search it replaced, and the passes
that can find its candidates.

    python -m bench.flat_search [--index indexes/default] [--runs 5] [--name flat_search]

Queries: the lay development phrases (``linker/data/lay/lay_dev.tsv``) encoded by the index's own query encoder. Each
search asks for 40 names, what `Linker.link`'s default k = 5 fetches (`linker.retrieve.OVERFETCH`). Contenders, timed
in turn in one process on the same batches, median of --runs, at 1 and 2 math threads (numpy's BLAS and FAISS's
OpenMP limited alike):

- *before*: numpy's blocked BLAS products over every name (`flat_search`), the top 41 re-scored by `exact_scores`
  (the flat search of commit 4c87f79);
- *numpy pass*, *scan* and *FAISS BLAS*: `exact_flat_topk` with its candidates from `flat_search`, from the scan
  (`_scan`: FAISS's SIMD inner products of one query with every name, and a partial sort) or from `faiss.knn`'s
  BLAS products;
- *now*: `exact_flat_topk` as a dense index runs it: the scan up to `SCAN_MAX_QUERIES` queries a call, its rows cut
  into one block per math thread (`_scan_blocks`), FAISS's BLAS products above;
- *scan, one block*: the scan as it was before the blocks, every row on the calling thread.

Then whole `Linker.link` calls of one phrase (the lay development phrases in turn), the scan in one block and in
blocks, alternated, median of --runs; and the scan alone at sizes of the index's first rows, to choose the size
from which it is cut (`SCAN_SPLIT_ROWS`).

Parity: the rows `exact_flat_topk` returns for every phrase, against *before*'s. Writes eval/bench/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.report import Report, table
from linker.datasets import load_dataset
from linker.index import dense as dense_module
from linker.index.dense import (SCAN_MAX_QUERIES, exact_flat_topk, exact_scores, flat_search, max_row_norm,
                                sort_hits)
from linker.link import Linker

FETCH = 40  # names: Linker.link's first fetch at its default k = 5 (max(MIN_FETCH, k x OVERFETCH))
BATCHES = (1, 2, 4, 8, 16, 64)
PHRASES_PER_TIMING = 32  # each timing searches at least this many phrases, in calls of the batch size


def before(vectors: np.ndarray, embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The flat search as it was: BLAS top k + 1, re-scored exactly, sorted."""
    scores, rows = flat_search(vectors, embeddings, min(len(embeddings), k + 1))
    return sort_hits(exact_scores(vectors, embeddings, rows), rows, k)


ONE_BLOCK = 2**62  # a `SCAN_SPLIT_ROWS` no index reaches: every row on the calling thread
EVERY_CORE = 2  # one block per core for any number of rows


@contextmanager
def scan_split(rows: int):
    """`_scan` cut into blocks from `rows` rows (`SCAN_SPLIT_ROWS`) while in the `with`."""
    kept, dense_module.SCAN_SPLIT_ROWS = dense_module.SCAN_SPLIT_ROWS, rows
    try:
        yield
    finally:
        dense_module.SCAN_SPLIT_ROWS = kept


def in_one_block(search):
    def run(v):
        with scan_split(ONE_BLOCK):
            return search(v)
    return run


def link_timings(linker, phrases: list[str], runs: int) -> dict:
    """ms a `Linker.link` call of one phrase, the scan in one block and in blocks, alternated phrase by phrase."""
    splits = {"one block": ONE_BLOCK, "blocks": dense_module.SCAN_SPLIT_ROWS}
    times: dict[str, list[float]] = {name: [] for name in splits}
    for _ in range(runs):
        per: dict[str, list[float]] = {name: [] for name in splits}
        for phrase in phrases:
            for name, rows in splits.items():
                with scan_split(rows):
                    started = time.perf_counter()
                    linker.link([phrase])
                    per[name].append(1000 * (time.perf_counter() - started))
        for name, values in per.items():
            times[name].append(statistics.median(values))
    return {name: round(statistics.median(v), 2) for name, v in times.items()}


def split_timings(embeddings: np.ndarray, vector: np.ndarray, runs: int) -> dict:
    """ms of one scan (40 rows asked) over the first n rows, in one block and in blocks, alternated."""
    out = {}
    for n in (16_384, 32_768, 65_536, 131_072, len(embeddings)):
        rows = embeddings[: min(n, len(embeddings))]
        per: dict[str, list[float]] = {"one block": [], "blocks": []}
        for _ in range(runs * 10):
            for name, split in (("one block", ONE_BLOCK), ("blocks", EVERY_CORE)):
                with scan_split(split):
                    started = time.perf_counter()
                    dense_module._scan(vector, rows, FETCH)
                    per[name].append(1000 * (time.perf_counter() - started))
        out[len(rows)] = {name: round(statistics.median(v), 3) for name, v in per.items()}
    return out


def _limit_threads(threads: int) -> None:
    import faiss
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads, user_api="blas")
    faiss.omp_set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--name", default="flat_search")
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    report = Report(args.name, out=args.out, title="Flat dense search: proved exact top k, and its candidate passes")
    dense = Linker.load(args.index).index.names
    embeddings = dense.embeddings
    phrases = list(dict.fromkeys(m.text for m in load_dataset("lay:linker/data/lay/lay_dev.tsv")))
    vectors = np.ascontiguousarray(dense.encode_queries(phrases), dtype=np.float32)
    norm = max_row_norm(embeddings)

    contenders = {
        "before": lambda v: before(v, embeddings, FETCH),
        "numpy pass": lambda v: exact_flat_topk(v, embeddings, FETCH, max_norm=norm, use_faiss=False),
        "scan": lambda v: exact_flat_topk(v, embeddings, FETCH, max_norm=norm, scan_max_queries=10**9),
        "FAISS BLAS": lambda v: exact_flat_topk(v, embeddings, FETCH, max_norm=norm, scan_max_queries=0),
        "now": lambda v: exact_flat_topk(v, embeddings, FETCH, max_norm=norm),
        "scan, one block": in_one_block(lambda v: exact_flat_topk(v, embeddings, FETCH, max_norm=norm)),
    }
    _limit_threads(1)
    rows = {name: np.concatenate([run(vectors[i : i + 64])[1] for i in range(0, len(vectors), 64)])
            for name, run in contenders.items()}
    parity = {name: int((found != rows["before"]).any(axis=1).sum()) for name, found in rows.items()}
    proved_same = all(bool((found == rows["now"]).all()) for name, found in rows.items() if name != "before")

    timings: dict[str, dict[str, list[float]]] = {}
    for threads in (1, 2):
        _limit_threads(threads)
        for batch in BATCHES:
            calls = max(1, PHRASES_PER_TIMING // batch)
            for run in range(args.runs):
                for name, search in contenders.items():
                    started = time.perf_counter()
                    for c in range(calls):
                        start = (run * calls + c) * batch % (len(vectors) - batch)
                        search(vectors[start : start + batch])
                    ms = 1000 * (time.perf_counter() - started) / (calls * batch)
                    timings.setdefault(f"{threads}/{batch}", {}).setdefault(name, []).append(ms)
    medians = {key: {name: round(statistics.median(v), 3) for name, v in by.items()} for key, by in timings.items()}
    _limit_threads(2)
    linker = Linker.load(args.index)
    links = link_timings(linker, phrases[:100], args.runs)
    splits = split_timings(embeddings, vectors[:1], args.runs)
    result = {"index": str(args.index), "names": len(embeddings), "storage": str(embeddings.dtype),
              "phrases": len(phrases), "fetch": FETCH, "runs": args.runs, "scan_max_queries": SCAN_MAX_QUERIES,
              "rows_differing_from_before": parity, "passes_agree": proved_same,
              "ms_per_phrase_median": medians, "link_one_phrase_ms": links, "scan_ms_by_rows": splits,
              "scan_split_rows": dense_module.SCAN_SPLIT_ROWS}
    names = list(contenders)
    lines = [f"Index `{args.index}`: {len(embeddings):,} names, {embeddings.dtype} vectors. {len(phrases)} lay "
             f"development phrases encoded by the index's encoder, {FETCH} names asked for each (what `Linker.link` "
             f"fetches at k = 5). Median of {args.runs} runs, the contenders in turn in one process; each cell is ms "
             "a phrase (lower is better), with *now*'s speed-up over *before*.", "",
             "*before* is commit 4c87f79's flat search (numpy's BLAS products, the top 41 re-scored); the others are "
             "`exact_flat_topk`, its candidates found by numpy's BLAS products (*numpy pass*), a scan of FAISS's SIMD "
             "inner products, one query at a time (*scan*), or FAISS's BLAS products (*FAISS BLAS*), and *now* as a "
             f"dense index runs it: the scan up to {SCAN_MAX_QUERIES} queries a call, its rows cut into one block per "
             "math thread, FAISS's BLAS products above; *scan, one block* is the scan before the blocks.", ""]
    lines += table(["math threads", "phrases a call", *names, "now / before"],
                   [[*key.split("/"), *(f"{m[n]:.2f}" for n in names), f"{m['before'] / m['now']:.2f}x"]
                    for key, m in medians.items()], align="rr" + "r" * (len(names) + 1))
    lines += ["", "**Parity.** Phrases whose 40 rows differ from *before*'s: "
              + ", ".join(f"{n} {parity[n]}" for n in names if n != "before")
              + f" of {len(phrases)}. Every pass gives `exact_flat_topk` the same answer on every phrase: "
              f"{proved_same}. `exact_flat_topk` proves its answer is the exact order (`exact_scores`, then row) "
              "whichever pass found the candidates; *before* trusted the BLAS order at the 41st name.", "",
              f"**One phrase, the whole `Linker.link`** (the index's query encoder, the search, re-ranking and "
              f"calibration; 2 math threads; the first 100 development phrases in turn, the scan in one block and in "
              f"blocks alternated phrase by phrase, median of {args.runs} runs' medians): one block "
              f"{links['one block']} ms, blocks {links['blocks']} ms "
              f"({links['one block'] / links['blocks']:.2f}x).", "",
              "**The scan alone** (`_scan`, one phrase, 40 rows asked) over the index's first rows, one block and as "
              f"many blocks as cores, alternated, median of {args.runs * 10}; blocks are cut from "
              f"`SCAN_SPLIT_ROWS` = {dense_module.SCAN_SPLIT_ROWS:,} rows:", "",
              *table(["rows", "one block ms", "blocks ms", "one block / blocks"],
                     [(f"{n:,}", f"{v['one block']:.2f}", f"{v['blocks']:.2f}", f"{v['one block'] / v['blocks']:.2f}x")
                      for n, v in splits.items()], align="rrrr")]
    report.write(result, lines)


if __name__ == "__main__":
    main()
