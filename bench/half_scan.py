"""The flat scan's float16 first pass (`linker.index.dense.HalfScan`) against the float32 scan, on a real index.

    python -m bench.half_scan [--index indexes/default] [--runs 5] [--name half_scan]

Queries: distinct real development mentions (`bench.scale.queries`: the lay development slice and NCBI-disease's
development set), encoded by the index's own query encoder, searched one at a time as a service's one-mention
requests are. Both ways run `exact_flat_topk` (candidates re-scored from the float32 rows, the answer proved or
fetched again wider); they differ in the pass that finds the candidates:

- *float32 scan*: FAISS's SIMD inner products of the query with every float32 row, the rows cut into one block per
  core (`_scan`), what an index does for its first `HALF_SCAN_AFTER` scans;
- *float16 scan*: the same over float16 copies of the rows (`HalfScan`), under the wider bound of their rounding.

Parity: every mention's rows and scores at 40 names (what `Linker.link` fetches at k = 5), both ways; and how many
mentions the float16 pass had to fetch again. Speed: ms a mention for the search alone, then for a whole one-mention
`Linker.link` (encoder, search, re-ranker, calibration), the two ways alternated mention by mention, median of
--runs runs' medians, with the load average. Cost: the time to make the copies and the memory they hold.
Writes eval/bench/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from bench.report import Report, table
from bench.scale import queries, rss
from linker.index.dense import HALF_SCAN_AFTER, HalfScan, exact_flat_topk, exact_scores, float16_scan_slack, \
    max_row_norm, sort_hits
from linker.link import Linker

FETCH = 40  # names: Linker.link's first fetch at its default k = 5
LINK_MENTIONS = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--name", default="half_scan")
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()
    report = Report(args.name, out=args.out, title="Flat dense scan: a float16 first pass against the float32 one")
    load_before = [round(x, 2) for x in os.getloadavg()]
    linker = Linker.load(args.index)
    dense = linker.index.names
    embeddings = dense.embeddings
    texts = queries()
    vectors = np.ascontiguousarray(dense.encode_queries(texts), dtype=np.float32)
    norm = max_row_norm(embeddings)
    exact_flat_topk(vectors[:1], embeddings, FETCH, max_norm=norm)  # the float32 rows paged in before the copies

    made, resident = [], rss()["VmRSS"]
    for _ in range(3):
        started = time.perf_counter()
        half = HalfScan(embeddings)
        made.append(time.perf_counter() - started)
    held = rss()["VmRSS"] - resident  # the last copies (the earlier ones are freed)
    copy_mib = sum(part.code_size * part.ntotal for part in half.parts) / 2**20

    # Parity, one mention a call as the service searches.
    differ, fetched_again = 0, 0
    for vector in vectors:
        one = vector[None]
        s32, r32 = exact_flat_topk(one, embeddings, FETCH, max_norm=norm)
        s16, r16 = exact_flat_topk(one, embeddings, FETCH, max_norm=norm, half=half)
        differ += int(not (np.array_equal(r32, r16) and np.array_equal(s32, s16)))
        approx, rows = half.search(one, min(len(embeddings), FETCH + 16))  # exact_flat_topk's first fetch
        scores, _ = sort_hits(exact_scores(one, embeddings, rows), rows, FETCH)
        slack = float16_scan_slack(embeddings.shape[1], np.linalg.norm(one.astype(np.float64), axis=1), norm)
        fetched_again += int(not scores[0, FETCH - 1] > approx[0, -1] + slack[0])

    ways = {"float32 scan": None, "float16 scan": half}
    search_ms: dict[str, list[float]] = {name: [] for name in ways}
    link_ms: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.runs):
        per: dict[str, list[float]] = {name: [] for name in ways}
        for vector in vectors:
            for name, pass_ in ways.items():
                started = time.perf_counter()
                exact_flat_topk(vector[None], embeddings, FETCH, max_norm=norm, half=pass_)
                per[name].append(1000 * (time.perf_counter() - started))
        for name in ways:
            search_ms[name].append(statistics.median(per[name]))
        per = {name: [] for name in ways}
        for text in texts[:LINK_MENTIONS]:
            for name, pass_ in ways.items():
                dense._half, dense._scans = pass_, -(10**9)  # this pass, and no copies made meanwhile
                started = time.perf_counter()
                linker.link([text])
                per[name].append(1000 * (time.perf_counter() - started))
        for name in ways:
            link_ms[name].append(statistics.median(per[name]))
    load_after = [round(x, 2) for x in os.getloadavg()]
    search = {name: round(statistics.median(v), 2) for name, v in search_ms.items()}
    link = {name: round(statistics.median(v), 2) for name, v in link_ms.items()}
    result = {"index": str(args.index), "names": len(embeddings), "dim": int(embeddings.shape[1]),
              "mentions": len(texts), "fetch": FETCH, "runs": args.runs, "half_scan_after": HALF_SCAN_AFTER,
              "blocks": len(half.parts), "mentions_differing": differ, "mentions_fetched_again": fetched_again,
              "search_ms": search, "search_ms_runs": search_ms, "link_ms": link, "link_ms_runs": link_ms,
              "link_mentions": min(LINK_MENTIONS, len(texts)), "make_copies_s": [round(x, 3) for x in made],
              "copies_mib": round(copy_mib, 1), "rss_growth_mib": round(held, 1),
              "load_before": load_before, "load_after": load_after}
    ratio = lambda d: d["float32 scan"] / d["float16 scan"]  # noqa: E731
    lines = [f"Index `{args.index}`: {len(embeddings):,} names, {embeddings.shape[1]} dimensions. {len(texts)} distinct "
             "development mentions (the lay development slice and NCBI-disease's development set), encoded by the "
             f"index's query encoder, {FETCH} names asked for each, one mention a call. Both ways re-score the "
             "candidates from the float32 rows and prove the answer (`exact_flat_topk`); *float16 scan* finds them "
             f"over float16 copies of the rows (`HalfScan`, {len(half.parts)} blocks, one per core), which an index "
             f"makes at its {HALF_SCAN_AFTER}th one-query scan. Alternated mention by mention, median of "
             f"{args.runs} runs' medians; load average {load_before} before, {load_after} after.", ""]
    lines += table(["", "float32 scan", "float16 scan", "float32 / float16"],
                   [("search, ms a mention", f"{search['float32 scan']:.2f}", f"{search['float16 scan']:.2f}",
                     f"{ratio(search):.2f}x"),
                    (f"one-mention `Linker.link` (first {result['link_mentions']} mentions), ms",
                     f"{link['float32 scan']:.2f}", f"{link['float16 scan']:.2f}", f"{ratio(link):.2f}x")],
                   align="lrrr")
    lines += ["", f"**Parity.** Mentions whose {FETCH} rows or scores differ between the two ways: {differ} of "
              f"{len(texts)}. The float16 pass's first fetch ({FETCH + 16} names) proved the answer for "
              f"{len(texts) - fetched_again} of them; {fetched_again} were fetched again, wider.", "",
              f"**Cost.** Making the copies: {statistics.median(made):.2f} s (median of 3); they hold "
              f"{copy_mib:.0f} MiB (the process grew by {held:.0f} MiB), beside the float32 rows' "
              f"{embeddings.nbytes / 2**20:.0f} MiB of mapped file."]
    report.write(result, lines)


if __name__ == "__main__":
    main()
