"""Benchmark index build and linking; compare tf-idf search with rapidfuzz and scikit-learn.

    python -m bench.link                 # full run, writes eval/bench/bench_link.{md,json}
    python -m bench.link --part generated-new   # one part of the full run, merged into
                                 # eval/bench/bench_link.{md,json} (parts: see --help); the others keep their rows

Dictionaries: (a) the embedded default dictionary (`linker dict build --source default`:
ICD-10-CM + English HPO), (b) a generated dictionary of ~1M names (every default name with
qualifier variants such as "acute X" or "X, left", each variant its own concept), (c) a random
subset of (a) for the dense and hybrid kinds (encoding all names with MiniLM on 2 shared cores
would take many minutes), (d) MEDIC for Acc@1 on the NCBI-disease test mentions.
Queries: NCBI-disease test mentions (real disease mentions, not dictionary names).

Every build and every linking run happens in a fresh subprocess, so its peak resident memory
(ru_maxrss) is its own. The machine is shared with other jobs: the load average is recorded
beside each figure, and comparisons are ratios measured in the same run on the same queries. Search levers
are `TfidfConfig` fields (search, candidate_df, min_score, concept_search, shard_names) set on the loaded index.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import data
from bench.report import REPO as ROOT
from bench.report import Report

K = 5
# (label, preset) of the tf-idf settings compared; "" = the library's default.
TFIDF_SETTINGS = [("old default (preset medical-crossing: char 1-2)", "medical-crossing"),
                  ("new default (char_wb 3-3, biosyn)", "")]
# (label, lever) of the tf-idf searches compared on every setting (see `apply_variant`).
TFIDF_VARIANTS = [
    ("exact", {"search": "exact"}),
    ("exact + sparse-dot-topn lower bound 0.2", {"search": "exact", "min_score": 0.2}),
    ("approximate, candidate_df 0.05", {"search": "approximate", "candidate_df": 0.05}),
    ("approximate, candidate_df 0.02", {"search": "approximate", "candidate_df": 0.02}),
    ("maxscore, names (first fetch 2/concept, widening)", {"search": "maxscore", "concept_search": False}),
    ("maxscore, top-k concepts in one search", {"search": "maxscore"}),
]
MAXSCORE_DEFAULT = "maxscore, top-k concepts in one search"  # what `search auto` runs above exact_max_names
# `--part`: the full run in pieces. tf-idf rows per (dictionary, setting); "others": the dense,
# hybrid and MEDIC rows.
PARTS = ("default-old", "default-new", "generated-old", "generated-new", "others")
# Qualifiers that turn one dictionary name into new, plausible names ("acute chest pain").
PREFIXES = ("acute", "chronic", "recurrent", "severe", "mild", "congenital", "bilateral")
SUFFIXES = ("left", "right", "unspecified", "in remission", "with complication", "of childhood")


def peak_mib() -> float:
    """Peak resident memory of this process image. VmHWM, not ru_maxrss: Linux carries ru_maxrss
    over from the parent across fork + exec, so a stage would report the driver's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)  # kB
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # elsewhere: an upper bound


def load() -> float:
    return round(os.getloadavg()[0], 2)


# ---- stages run in subprocesses -----------------------------------------------------------


def stage_build(args) -> dict:
    from linker.index import build_index
    from linker.index.dense import DenseConfig
    from linker.index.hybrid import HybridConfig

    from linker.index.tfidf import get_preset

    config = get_preset(args.preset) if args.preset else None
    # One torch thread: with two on two cores shared with other jobs, OpenMP threads wait on each
    # other (single-query encoding became an order of magnitude slower in a trial on this machine).
    dense = DenseConfig(encoder=args.encoder, threads=1)
    if args.kind == "dense":
        config = dense
    elif args.kind == "hybrid":
        config = HybridConfig(dense=dense)
    started, cpu = time.perf_counter(), time.process_time()
    manifest = build_index(args.dict, kind=args.kind, out=args.out, config=config, overwrite=True)  # its own work dir
    files = manifest["files"]
    return {"build_s": round(time.perf_counter() - started, 2), "build_cpu_s": round(time.process_time() - cpu, 2),
            "peak_mib": peak_mib(), "names": manifest["counts"]["names"], "concepts": manifest["counts"]["concepts"],
            "matrix_mib": round(files["tfidf/names.npz"]["size"] / 2**20, 1) if "tfidf/names.npz" in files else None}


def apply_variant(linker, variant: dict) -> None:
    """Set a tf-idf speed lever on a loaded index: its `TfidfConfig` with these fields replaced (search,
    candidate_df, min_score: sparse-dot-topn's lower bound, concept_search: maxscore's concept search,
    shard_names: the exact product's shard size)."""
    names = linker.index.names
    names.config = dataclasses.replace(names.config, **variant)  # an unknown lever is a TypeError
    names.warm_up()  # the structures of the search chosen (maxscore: postings, compiled kernel)


def stage_link(args) -> dict:
    from linker.link import Linker

    queries = json.loads(Path(args.queries).read_text())
    started = time.perf_counter()
    linker = Linker.load(args.index)
    load_s = time.perf_counter() - started
    variant = json.loads(args.variant) if args.variant else {}
    if variant:
        apply_variant(linker, variant)
    tfidf_config = getattr(linker.index.names, "config", None)
    # warm-up: lazy imports, encoder first call; for tf-idf all the queries, so that the Linker's caches
    # (preferred names of the concepts found) are as full for the 1-thread call as for the 2-thread call
    linker.link(queries if linker.index.kind == "tfidf" else queries[:20], k=K)
    cpu_per_mention = None
    one_thread_cpu, two_wall, two_cpu = [], [], []
    # Alternated `repeats` times, medians reported: one thread, CPU seconds (what one core does, however
    # loaded the machine; two such workers are what two dedicated cores give), then the batch as a user
    # runs it, the index's two threads, wall time and CPU seconds of both.
    for _ in range(args.repeats):
        if linker.index.kind == "tfidf":
            linker.index.names.config = dataclasses.replace(tfidf_config, threads=1)
            cpu = time.process_time()
            linker.link(queries, k=K)
            one_thread_cpu.append(time.process_time() - cpu)
            linker.index.names.config = tfidf_config
        started, cpu = time.perf_counter(), time.process_time()
        results = linker.link(queries, k=K)
        two_wall.append(time.perf_counter() - started)
        two_cpu.append(time.process_time() - cpu)
    if one_thread_cpu:
        cpu_per_mention = float(np.median(one_thread_cpu)) / len(queries)
    batch_s, batch_cpu_s = float(np.median(two_wall)), float(np.median(two_cpu))
    latencies = []
    for query in queries[: args.latency_queries]:
        started = time.perf_counter()
        linker.link([query], k=K)
        latencies.append(time.perf_counter() - started)
    latencies_ms = np.array(latencies) * 1000
    return {
        "load_s": round(load_s, 2),
        "queries": len(queries),
        "mentions_per_s": round(len(queries) / batch_s, 1),
        "mentions_per_cpu_s": round(1 / cpu_per_mention, 1) if cpu_per_mention else None,
        # the 2-thread call's CPU seconds (both threads): equal to the 1-thread figure when threading adds no work
        "mentions_per_cpu_s_2_threads": round(len(queries) / batch_cpu_s, 1),
        "repeats": {"one_thread_cpu_s": [round(x, 3) for x in one_thread_cpu],
                    "two_threads_wall_s": [round(x, 3) for x in two_wall], "two_threads_cpu_s": [round(x, 3) for x in two_cpu]},
        "exact": getattr(linker.index.names, "exact", True),
        "p50_ms": round(float(np.percentile(latencies_ms, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies_ms, 99)), 2),
        "latency_queries": len(latencies),
        "peak_mib": peak_mib(),
        "top": [[c.concept_id for c in r.candidates] for r in results],
    }


def stage_baselines(args) -> dict:
    """Name-level top-k on the same names and queries: tf-idf (1 and 2 threads), rapidfuzz, sklearn."""
    from rapidfuzz import fuzz, process
    from sklearn.neighbors import NearestNeighbors

    from linker.index import load_index
    from linker.text import normalize

    queries = json.loads(Path(args.queries).read_text())[: args.baseline_queries]
    index = load_index(args.index, checksums=False)
    names = [normalize(n) for n in index.concepts.table.column("name").to_pylist()]
    tfidf = index.names
    out: dict = {"queries": len(queries), "names": len(names)}
    top1: dict[str, list[str]] = {}

    def timed(label: str, run) -> None:
        started = time.perf_counter()
        top1[label] = run()
        seconds = time.perf_counter() - started
        out[label] = {"queries_per_s": round(len(queries) / seconds, 2), "load": load()}

    def tfidf_run(threads: int):
        tfidf.config = dataclasses.replace(tfidf.config, threads=threads)
        _scores, rows = tfidf.search(queries, K)
        return [names[r[0]] if r[0] >= 0 else None for r in rows]

    tfidf.search(queries[:2], K)  # untimed warm-up call
    timed("tfidf_1_thread", lambda: tfidf_run(1))
    timed("tfidf_2_threads", lambda: tfidf_run(2))

    def fuzzy(scorer):
        return [(process.extract(normalize(q), names, scorer=scorer, limit=K) or [(None,)])[0][0] for q in queries]

    timed("rapidfuzz_ratio", lambda: fuzzy(fuzz.ratio))
    # WRatio is ~30x slower than ratio: it runs on the first queries only, within a budget of
    # name comparisons, and its agreement is measured on those queries.
    all_queries, queries = queries, queries[: max(1, min(len(queries), args.wratio_budget // len(names)))]
    timed("rapidfuzz_wratio", lambda: fuzzy(fuzz.WRatio))
    out["rapidfuzz_wratio"]["queries"] = len(queries)
    queries = all_queries
    vectors = tfidf.vectors(queries)

    def brute():
        nn = NearestNeighbors(n_neighbors=K, metric="cosine", algorithm="brute", n_jobs=1).fit(tfidf.matrix)
        distances, rows = nn.kneighbors(vectors)
        # a query with no known n-gram has distance 1 to everything: no match, as in tf-idf
        return [names[r[0]] if d[0] < 1 else None for d, r in zip(distances, rows)]

    timed("sklearn_brute", brute)
    reference = top1["tfidf_2_threads"]
    for label, tops in top1.items():
        out[label].setdefault("queries", len(queries))
        out[label]["same_top1_as_tfidf"] = round(float(np.mean([a == b for a, b in zip(tops, reference)])), 4)
    out["peak_mib"] = peak_mib()
    return out


# ---- the driver ---------------------------------------------------------------------------


def run_stage(name: str, **options) -> dict:
    argv = [sys.executable, "-m", "bench.link", "--stage", name]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    before = load()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"stage {name} {options} failed")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load_before"] = before
    result["load_after"] = load()
    print(f"{name} {options.get('kind', '')} {options.get('index', options.get('out', ''))}: "
          f"{ {k: v for k, v in result.items() if k != 'top'} }", flush=True)
    return result


def make_dictionaries(work: Path, big_names: int, dense_names: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from linker.dictionary import SourceSpec, build_dictionary, read_concept_table

    default = work / "default.parquet"
    if not default.exists():
        build_dictionary([SourceSpec("default", ())], default)
    table = read_concept_table(default).table
    rows = table.to_pylist()
    variants = [(p + " {}") for p in PREFIXES] + [("{}, " + s) for s in SUFFIXES]
    big = []
    for j, pattern in enumerate(["{}", *variants]):
        for row in rows:
            big.append({**row, "name": pattern.format(row["name"]),
                        "concept_id": row["concept_id"] if j == 0 else f"{row['concept_id']}#{j}",
                        "preferred": row["preferred"] if j == 0 else True})
            if len(big) >= big_names:
                break
        if len(big) >= big_names:
            break
    big_path = work / "generated.parquet"
    pq.write_table(pa.Table.from_pylist(big, schema=table.schema), big_path)
    rng = np.random.default_rng(0)
    subset = np.sort(rng.choice(table.num_rows, size=min(dense_names, table.num_rows), replace=False))
    subset_path = work / "default_subset.parquet"
    pq.write_table(table.take(subset), subset_path)
    medic = work / "medic.parquet"
    if not medic.exists():
        build_dictionary([SourceSpec("tsv", (data.get("ncbi").path("medic"),))], medic)
    return {"default": default, "generated": big_path, "default_subset": subset_path, "medic": medic}


def agreement(tops: list[list[str]], reference: list[list[str]] | None) -> float | None:
    """Share of queries whose top-1 concept (or absence of one) is the reference's."""
    if reference is None:
        return None
    first = [t[0] if t else None for t in tops]
    return round(float(np.mean([a == (b[0] if b else None) for a, b in zip(first, reference)])), 4)


def acc_at_1(tops: list[list[str]], mentions) -> dict:
    from linker.eval.metrics import accuracy, mention_hits

    hits = mention_hits([m.gold for m in mentions], [[top] for top in tops], 1)
    result = accuracy(hits, 1)
    return {"n": result.n, "correct": result.correct, "acc": round(result.value, 4),
            "ci95": [round(result.low, 4), round(result.high, 4)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["build", "link", "baselines"])
    parser.add_argument("--dict", type=Path)
    parser.add_argument("--kind", default="tfidf")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--index", type=Path)
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--preset", default="", help="build: a tf-idf preset (default: the default setting)")
    parser.add_argument("--variant", default="", help="link: JSON of a tf-idf speed lever (see TFIDF_VARIANTS)")
    parser.add_argument("--latency-queries", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="link: timed batches per thread count (medians)")
    parser.add_argument("--baseline-queries", type=int, default=100)
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "bench")
    parser.add_argument("--report", type=Path, default=Path("eval/bench/bench_link"), help="the report's path stem")
    parser.add_argument("--big-names", type=int, default=1_000_000)
    parser.add_argument("--dense-names", type=int, default=5_000)
    parser.add_argument("--dense-latency-queries", type=int, default=50)
    parser.add_argument("--wratio-budget", type=int, default=3_000_000, help="names x queries for WRatio")
    parser.add_argument("--medic-dense", action="store_true", help="also dense/hybrid over MEDIC (slow on CPU)")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense and hybrid kinds")
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="run only this part (repeatable) and merge its rows into the existing --report JSON, "
                             "so that a full run can be split over several shorter sittings: " + ", ".join(PARTS))
    args = parser.parse_args()
    if args.stage:
        stage = {"build": stage_build, "link": stage_link, "baselines": stage_baselines}[args.stage]
        print(json.dumps(stage(args)))
        return

    from linker.datasets import load_dataset

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.perf_counter(), load()
    writer = Report(args.report.name, out=args.report.parent, title="Linking benchmark")
    report: dict = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "k": K,
        "dense_names": args.dense_names,
    }
    dictionaries = make_dictionaries(work, args.big_names, args.dense_names)
    mentions = load_dataset(data.get("ncbi").spec("test"))
    queries_path = work / "queries.json"
    queries_path.write_text(json.dumps([m.text for m in mentions]))
    report["queries"] = {"source": "NCBI-disease test mentions", "count": len(mentions)}

    parts = args.part or list(PARTS)
    runs = []
    # tf-idf at 150k and 1M names: the old default (now the medical-crossing preset) and the new one,
    # each searched with every speed lever, in one run; agreement is with the same index's exact search.
    report["tfidf_variants"] = {name: variant for name, variant in TFIDF_VARIANTS}
    for dict_name in ("default", "generated"):
        for setting, preset in TFIDF_SETTINGS:
            part = f"{dict_name}-{'old' if preset else 'new'}"
            if part not in parts:
                continue
            out = work / f"{dict_name}-tfidf-{preset or 'default'}"
            build = run_stage("build", dict=dictionaries[dict_name], kind="tfidf", out=out, preset=preset)
            exact_top = None
            for variant_name, variant in TFIDF_VARIANTS:
                link = run_stage("link", index=out, queries=queries_path, latency_queries=args.latency_queries,
                                 variant=json.dumps(variant), repeats=args.repeats)
                if variant_name == "exact":
                    exact_top = link["top"]
                row = {"part": part, "dictionary": dict_name, "kind": "tfidf", "setting": setting, "search": variant_name,
                       "build": build, "link": {k: v for k, v in link.items() if k != "top"},
                       "same_top1_as_exact": agreement(link["top"], exact_top),
                       "same_top5_as_exact": round(float(np.mean([a == b for a, b in zip(link["top"], exact_top)])), 4)}
                runs.append(row)
            if preset == "":
                runs[-1]["baselines"] = run_stage("baselines", index=out, queries=queries_path,
                                                  baseline_queries=args.baseline_queries,
                                                  wratio_budget=args.wratio_budget)
    others = "others" in parts
    plan = [("default_subset", "tfidf")] if others else []
    if not args.no_dense and others:
        plan += [("default_subset", "dense"), ("default_subset", "hybrid")]
    plan += [("medic", "tfidf")] if others else []
    plan += ([("medic", "dense"), ("medic", "hybrid")] if args.medic_dense and others else [])
    for dict_name, kind in plan:
        out = work / f"{dict_name}-{kind}"
        build = run_stage("build", dict=dictionaries[dict_name], kind=kind, out=out, encoder=args.encoder)
        latency = args.latency_queries if kind == "tfidf" else args.dense_latency_queries
        link = run_stage("link", index=out, queries=queries_path, latency_queries=latency, repeats=args.repeats)
        row = {"part": "others", "dictionary": dict_name, "kind": kind, "setting": "new default" if kind != "dense" else "",
               "search": "default", "build": build, "link": {k: v for k, v in link.items() if k != "top"}}
        if dict_name == "medic":
            row["acc_at_1"] = acc_at_1(link["top"], mentions)
        runs.append(row)
    report["runs"] = runs
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.part:  # merge into the report of the other parts
        done = {"command": writer.meta["command"], "date": writer.meta["date"], "load_at_start": load_at_start,
                "seconds": report["seconds"]}
        previous = json.loads(args.report.with_suffix(".json").read_text()) \
            if args.report.with_suffix(".json").exists() else {}
        if "parts" not in previous:  # a whole run's report (or none): the parts start afresh
            previous = {"runs": [], "parts": {}}
        kept = [r for r in previous["runs"] if r.get("part") not in args.part]
        report["runs"] = sorted(kept + runs, key=lambda r: PARTS.index(r.get("part", "others")))
        report["parts"] = {**previous.get("parts", {}), **{part: done for part in args.part}}
        report["parts"] = {part: report["parts"][part] for part in PARTS if part in report["parts"]}
    writer.write(report, markdown(report))


def default_search(names: int) -> str:
    """The variant the library picks for an index of `names` names with the default config."""
    from linker.index.tfidf import TfidfConfig

    config = TfidfConfig()
    return "exact" if names <= config.exact_max_names else MAXSCORE_DEFAULT


def markdown(report: dict) -> list[str]:
    origin = "One run"
    if report.get("parts"):  # `--part` runs merged into one report
        origin = "Run in parts, each merged into this report: " + "; ".join(
            f"`{p['command']}` on {p['date']} ({p['seconds']:.0f} s, load average at start {p['load_at_start']})"
            for p in report["parts"].values())
    lines = [
        f"{origin}; per-stage load in the tables and bench_link.json. k = {report['k']}. "
        f"Queries: {report['queries']['count']} {report['queries']['source']}. Every stage runs in its own "
        "process; peak memory is that process's maximum resident set size.",
        "",
        "## tf-idf at 150k and 1M names: settings and speed levers",
        "",
        "| dictionary | names | setting | search | build s | build CPU s | build peak MiB | matrix MiB | "
        "mentions/s (2 threads) | mentions/CPU-s (2 threads) | mentions/CPU-s (1 thread) | p50 ms | p99 ms | "
        "same top-1 as exact | same top-5 as exact | load |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tfidf_rows = [r for r in report["runs"] if "same_top1_as_exact" in r]
    for run in tfidf_rows:
        b, link = run["build"], run["link"]
        marker = " **(library default)**" if run["search"] == default_search(b["names"]) and \
            run["setting"].startswith("new") else ""
        lines.append(
            f"| {run['dictionary']} | {b['names']:,} | {run['setting']} | {run['search']}{marker} | {b['build_s']} | "
            f"{b['build_cpu_s']} | {b['peak_mib']:,} | {b['matrix_mib']} | {link['mentions_per_s']} | "
            f"{link.get('mentions_per_cpu_s_2_threads', '')} | {link['mentions_per_cpu_s']} | {link['p50_ms']} | {link['p99_ms']} | {run['same_top1_as_exact']:.3f} | "
            f"{run['same_top5_as_exact']:.3f} | "
            f"{link['load_before']}-{link['load_after']} |")
    lines += [
        "",
        "*build s / build CPU s*: wall and CPU seconds of `build_index` (CPU time is what the other jobs on the "
        "machine do not inflate, or far less). *matrix MiB*: the saved name matrix, the floor of the build's "
        "memory; *build peak MiB* includes the interpreter, the concept table and the names. *mentions/s*: one "
        "`Linker.link` call over all queries with the index's 2 threads, wall time (on cores shared with the load "
        "shown, so below what 2 free cores give); *mentions/CPU-s (2 threads)*: that call's mentions per CPU second "
        "of both threads (equal to the 1-thread figure when the threads add no work); *mentions/CPU-s (1 thread)*: "
        "the same call with 1 thread, per CPU second (two such workers is what 2 dedicated cores give). *p50/p99*: one mention "
        "per call. *same top-1 as exact*: share of queries whose top-1 concept (or absence of one) is that of the "
        "same index searched exactly; *same top-5*: the same 5 concepts in the same order. Levers: "
        "*sparse-dot-topn lower bound*: `threshold=0.2`, scores below it never "
        "collected; *approximate*: a query's n-grams held by more than `candidate_df` of the names select no "
        "candidates, the best 4k (>= 64) names of the rest are rescored exactly (`linker/index/tfidf.py`); "
        "*maxscore*: exact top-k with certified early termination (`linker/index/maxscore.py`: n-grams rarest "
        "first, reading stops once no unseen name can reach the k-th score); *names (first fetch 2/concept, "
        "widening)*: it returns the top 2k names and `linker.retrieve` collapses them to concepts, searching again "
        "with 4x as many for the queries left with fewer than k concepts (the previous default); *top-k concepts "
        "in one search*: given each name's concept, it certifies the k-th best concept directly (the library's "
        "default when no language mask applies). The library (`search auto`) searches exactly up to "
        "500,000 names and with maxscore above.",
        "",
    ]
    lines += [
        "## Other indexes",
        "",
        "| dictionary | kind | names | concepts | build s | build peak MiB | mentions/s (batch) | p50 ms | p99 ms | link peak MiB | Acc@1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        if run in tfidf_rows:
            continue
        b, link = run["build"], run["link"]
        acc = run.get("acc_at_1")
        acc_text = f"{acc['acc']:.3f} [{acc['ci95'][0]:.3f}, {acc['ci95'][1]:.3f}]" if acc else ""
        lines.append(
            f"| {run['dictionary']} | {run['kind']} | {b['names']:,} | {b['concepts']:,} | {b['build_s']} | "
            f"{b['peak_mib']:,} | {link['mentions_per_s']} | {link['p50_ms']} | {link['p99_ms']} | "
            f"{link['peak_mib']:,} | {acc_text} |"
        )
    medic_dense = any(r["dictionary"] == "medic" and r["kind"] != "tfidf" for r in report["runs"])
    lines += [
        "",
        "tf-idf here is the library default (char_wb 3-3, biosyn normalisation, exact at these sizes). mentions/s: "
        "one `Linker.link` call over all queries (top-5 distinct concepts); p50/p99: one mention "
        "per call (dense and hybrid: fewer calls, see latency_queries in the JSON). Dense and hybrid use the "
        "`minilm` encoder (one torch thread) with a flat (exact) FAISS index; `default_subset` is a seeded random "
        f"sample of {report['dense_names']:,} default names, because encoding all of them "
        "on two shared cores takes many minutes"
        + ("" if medic_dense else "; dense and hybrid over MEDIC are not in this run (`--medic-dense`)")
        + ". Acc@1 (MEDIC rows): NCBI-disease test mentions against MEDIC, composite mentions need every part, "
        "95% bootstrap interval; no training, no NCBI-specific preprocessing (see the eval reports for that).",
        "",
        "## Name search against rapidfuzz and scikit-learn (same names, same queries)",
        "",
        "| dictionary | names | method | queries | queries/s | tf-idf (2 threads) speed-up | same top-1 name as tf-idf |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        base = run.get("baselines")
        if not base:
            continue
        reference = base["tfidf_2_threads"]["queries_per_s"]
        for label in ("tfidf_2_threads", "tfidf_1_thread", "sklearn_brute", "rapidfuzz_ratio", "rapidfuzz_wratio"):
            m = base[label]
            lines.append(f"| {run['dictionary']} | {base['names']:,} | {label} | {m['queries']} | {m['queries_per_s']} | "
                         f"{reference / m['queries_per_s']:.1f}x | {m['same_top1_as_tfidf']:.3f} |")
    lines += [
        "",
        f"Top-{report['k']} names for the first queries (column `queries`). tf-idf: the library default setting "
        "and search (exact at 150k names, maxscore at 1M: both exact, see above); sklearn: "
        "`NearestNeighbors(metric='cosine', algorithm='brute')` on "
        "the same tf-idf vectors (exact: differences in the top-1 column are ties broken differently, or at 1M "
        "float rounding); "
        "rapidfuzz: `process.extract(scorer=fuzz.ratio | fuzz.WRatio, limit=5)` over the normalised names "
        "(a different similarity, so its top-1 agreement is not an error rate). sklearn and rapidfuzz use "
        "one thread.",
    ]
    return lines


if __name__ == "__main__":
    main()
