"""Terminology scale: tf-idf, dense and hybrid indexes from the real union of the open terminologies to 5M names.

    python -m bench.scale tables                                  # work/scale/names-{union,1m,2m,5m}.parquet
    python -m bench.scale run --sizes union,1m --kinds tfidf,dense,hybrid
    python -m bench.scale ray --size 100k --workers 1,2           # `--engine ray` against the local build
    python -m bench.scale peer --size 100k --python PEER_PYTHON   # scispaCy's candidate generator, in its own venv
    python -m bench.scale render                                  # report.md again from report.json

Writes eval/scale/report.{md,json}; each command adds its rows to what earlier runs wrote (one build at a time
fills the 2 cores, so sizes run one after the other), replacing rows of the same size and kind.

**The names.** ``union``: every open terminology of `linker-multi`'s recipe in one concept table (ICD-10-CM from
simple-icd-10-cm, HPO with its es/fr/de/nl translations, MEDIC, Disease Ontology, Cantemist's ICD-O codes; 313,349
names of 140,271 concepts); ``100k``: its first 100,000 names (the Ray builds). ``1m``/``2m``/``5m``: the union, then generated variants of its names until the size
is reached: round r gives every union name a clinical qualifier before it and, for 11 of 12 rounds in turn, one
after it (`QUALIFIERS`, `SUFFIXES`, "chronic hair loss in remission"), under the name's own concept; the smaller
tables are prefixes of the larger. English qualifiers on names of every language: a harder haystack than a real
release (many near-duplicates per concept), not a model of one.

**Each build and each serving measurement runs in its own child process** (`python -m bench.scale _build` /
`_serve`): its peak RSS is that process's (`ru_maxrss`; Ray's worker processes are not in it), and the time to the
first answer runs from starting the child (Python, imports, checking the index, loading the encoder) until it has
printed the candidates of one mention ("hair loss"; the rows of 100,000 names, the tf-idf rows up to 2M names and
the peer's were measured when the child read the queries first, ~0.2 s more). Serving then links the queries (995 distinct real mentions: the lay development
slice and NCBI-disease's development set, never a test set) at k = 5 and reads its RSS (anonymous and file-backed)
from /proc. Recall of an approximate dense index is against exact search over the same stored vectors, ties counted
as hits: of the top-k name rows (`linker.index.dense.recall_against_exact`), and of the top-k concepts that linking
returns (`concept_recall`: `Linker.link`, whose widening fetches more names than k).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import data
from bench.report import Report, load, table

WORK = data.REPO / "work" / "scale"
OUT = data.REPO / "eval" / "scale"
SIZES = {"100k": 100_000, "union": 0, "1m": 1_000_000, "2m": 2_000_000, "5m": 5_000_000}
QUALIFIERS = ("acute", "chronic", "mild", "severe", "recurrent", "bilateral", "left", "right", "congenital",
              "familial", "early onset", "late onset", "drug induced", "postoperative", "intermittent", "persistent",
              "progressive", "transient", "secondary", "idiopathic")
SUFFIXES = ("", "unspecified", "in pregnancy", "in childhood", "of the left side", "of the right side",
            "with complications", "without complications", "in remission", "after surgery", "due to medication",
            "nos")
ENCODER = "minilm"
NOTES = [
    "- **Kinds.** tf-idf: the default settings (char_wb 3-grams, exact search up to 500,000 names, maxscore above). "
    "Dense: minilm, precision auto (bf16, compiled for the build; queries eager), `--faiss auto` (flat up to 200,000 "
    "names, ivf-pq with float16 vectors and exact re-scoring above). Hybrid: both, summed (weights 1 and 1).",
    "- **Choosing the FAISS kind and the short list** (development mentions only; the 5M union-padded index of an "
    "earlier build, ivf-pq, 4,096 lists; a fast-scan index built beside it from its stored vectors and coarse "
    "centroids in 81 s; an ad hoc script, not kept). Time to find the top 5 concepts of the 995 mentions "
    "(`linker.retrieve.top_concepts`, median of 3), concept recall@1 / @5 against exact search: ivf-pq, 64 probes, "
    "8 candidates per name 3.50 s, 0.995 / 0.983; fast scan, same settings 2.64 s, 0.996 / 0.986 (one FAISS pass "
    "at k = 321: 0.145 s against 0.89 s); fast scan with 32 probes 2.32 s, 0.992 / 0.975. Then through "
    "`Linker.link` (batches of 256), fast scan: 8 per name 300 mentions/s, 0.996 / 0.986; k + 320 candidates 414, "
    "0.996 / 0.986; k + 160 (the rule kept: k + 8 x min(k, 20)) 512, 0.995 / 0.980; 128 probes with k + 160 460, "
    "0.996 / 0.986, with k + 320 378, 0.997 / 0.991. On ivf-pq, 8 x 5 candidates whatever the fetch fell to 0.911 at @5: "
    "the top concepts' best names lie deep in lists crowded with near-duplicates.",
    "- **Build memory.** oneDNN (torch's bf16 kernels) caches a compiled kernel per operator shape, 1,024 by "
    "default; encoding batches of every length fills it: 9 calls of 2,048 names, compiled minilm bf16, grew the "
    "process by 239 MB at 1,024 entries, 95 MB at 256 in the same time, 68 MB at 64 (5% slower). linker now sets "
    "`ONEDNN_PRIMITIVE_CACHE_CAPACITY=256` unless it is set. An earlier 5M build at 1,024 held 3.7 GB of anonymous "
    "memory from chunk ~340 of 610 on; the one above, at 256, was resident at 3.6 GB by chunk 539: the cap does not "
    "bound that plateau, whose cause is not traced. The FAISS stage after it is traced at 1M names in "
    "[build_peak.md](build_peak.md): it added ~1.3 GB (the training sample's copies, rows of the recall check read "
    "through the memory map), ~0.65 GB since; the rest of the 5M peak is held before it starts.",
    "- **tf-idf at 5M: maxscore's postings stored at build time** (table above). *before*: the first run, on a quiet "
    "machine; *before, again* and *after*: the code before and after, served one after the other (after, before, "
    "after) at loads of 5-6 on the 2 cores, built at loads of 9 and 6: their wall times are 2-8x a quiet run's, so "
    "compare CPU seconds. Before, every load copied the rows by length and transposed them; after, the build writes "
    "the postings and bounds as .npy files (one pass over the rows per 256 MiB of postings: ~31 CPU-s of the build's "
    "278; held whole they took the build's peak to 5,946 MiB) and a load maps them and checks them in one pass. "
    "Load peak 7,365 -> 3,385 / 3,598 MiB (anonymous 3,273 -> 1,113 / 1,117), first answer 34.2 -> 15.2 / 14.5 "
    "CPU-s (69 -> 23 / 22 s wall), CPU a pass of the mentions 14.7 -> 13.7 / 12.9 s; the folder grows from 2.0 to "
    "4.0 GB (8 bytes a posting, as the rows). A first serve on a cold numba cache adds ~20 CPU-s of compiling.",
    "- **Where maxscore's time goes at 5M** (ad hoc scripts, not kept: one thread, the 995 mentions, top 5 concepts). "
    "A mention reads 0.87M of the 8.4M postings of its n-grams, sees 250k names and scores 1.8k from their rows; "
    "the slowest quarter of the mentions takes half the time: long ones (30-50 n-grams) whose 5th concept scores "
    "~0.45, where the bound on unseen names is the norm of the query's unread part (each block's largest weights sum "
    "to 1.1-2.5), so every block reads the rarest 20 of 37 lists. perf, by address in the compiled code: 76% in the "
    "kernel, of it ~28% on two random loads of the filter of seen names (`acc`, `name_scale`) and ~10% on reading "
    "lists; 18% in `_kth_exact` (np.partition, argsort). Measured against the kernel before (alternated, CPU "
    "seconds for the 995 mentions, identical rows, scores and work): each seen name's `name_scale` read once into an "
    "array beside it, kept (15.9 -> 13.0, median of 4); blocks visited nearest the mention's length first, or by "
    "their bound (0.4% fewer postings, no faster); blocks of 32,768 or 65,536 names (5% / 2% fewer postings, 18.1 / "
    "16.2 against 15.8); a heap instead of np.partition (13.6 against 14.7, within the noise: not kept); a bound "
    "from each block's largest `name_scale` (looser than its largest weights). Exact search on this haystack stays "
    "far from 2,000 mentions/s.",
    "- **Approximate maxscore at 5M** (the index above, the 995 mentions, one thread, top 5 concepts, CPU seconds "
    "median of 2-3 alternated runs, load 0.8-1.3; agreement with the exact search of the same run: the same top-1 "
    "concept, and the share of the exact top 5 concepts found). A sound bound first: a name holds at most as many "
    "n-grams as the longest of its block, so it shares at most that many of the unread ones (the sum of their "
    "largest gains, and the root of their largest squares): identical answers, 8.59 against 8.64 s, no gain (the "
    "blocks' names hold 20-216 n-grams, more than most mentions). Then two approximations. (a) The bound on unseen "
    "names scaled by 0.8 / 0.6 / 0.5 / 0.4 (aggressive WAND): 116 -> 168 / 510 / 1,253 / 3,291 mentions per "
    "CPU-s, top-1 0.947 / 0.702 / 0.602 / 0.537, top-5 0.927 / 0.662 / 0.567 / 0.495: the right name of a long "
    "mention often shares few of its rarest n-grams. (b) Lists held by more than 2% / 1% / 0.5% of the names "
    "select no new names (the rarest 3 always do), as tf-idf's `approximate` search does: 118 / 132 / 147 "
    "mentions per CPU-s, top-1 0.999 / 0.997 / 0.993, top-5 0.994 / 0.983 / 0.962: the names already seen still "
    "need those lists. Neither approaches 2,000 mentions/s at a usable agreement (ad hoc scripts, not kept); at 5M "
    "names the dense fast-scan index above serves 528 mentions/s at concept recall 0.995 / 0.980.",
    "- **Serving memory.** Re-scoring reads the short list's vectors with pread, not through the memory map: the "
    "kernel maps 16 pages around each page touched, and 3 passes of 995 queries over the 1M index mapped the whole "
    "768 MB vector file into the server (RssFile +744 MB) where pread left it at +56 MB for the same searches.",
]


def table_path(size: str) -> Path:
    return WORK / f"names-{size}.parquet"


def make_tables(sizes: list[str]) -> dict:
    """The union, and each padded size as the union plus generated variants (a prefix of the next size's)."""
    from linker.dictionary import SourceSpec, build_dictionary
    from linker.train.release import RECIPES, data_root
    from linker.sources import SourceOptions

    WORK.mkdir(parents=True, exist_ok=True)
    root = data_root()
    specs = [SourceSpec(s, tuple(root / p for p in paths)) for s, paths in RECIPES["linker-multi"].sources]
    build_dictionary(specs, table_path("union"), options=SourceOptions(), overwrite=True)
    union = pq.read_table(table_path("union"))
    meta = pq.read_metadata(table_path("union")).metadata
    largest = max(SIZES[s] for s in sizes)
    parts, rows = [union], union.num_rows
    for r in range((max(largest - rows, 0) + union.num_rows - 1) // union.num_rows):
        take = min(union.num_rows, largest - rows)
        base = union.slice(0, take)
        names = pc.utf8_trim_whitespace(pc.binary_join_element_wise(
            QUALIFIERS[r % len(QUALIFIERS)], base.column("name"), SUFFIXES[r % len(SUFFIXES)], " "))
        columns = {"name": names, "term_id": pc.binary_join_element_wise(f"gen{r}", base.column("term_id"), ":"),
                   "source": ["generated"] * take, "term_type": ["generated"] * take, "preferred": [False] * take}
        variant = base
        for field, values in columns.items():
            spec = union.schema.field(field)  # with its nullability: concat_tables wants equal schemas
            variant = variant.set_column(union.schema.get_field_index(field), spec, pa.array(values, type=spec.type)
                                         if isinstance(values, list) else values)
        parts.append(variant)
        rows += take
    padded = pa.concat_tables(parts)
    counts = {"union": union.num_rows}
    for size in sizes:
        if SIZES[size]:
            pq.write_table(padded.slice(0, SIZES[size]).replace_schema_metadata(meta), table_path(size),
                           compression="zstd")
            counts[size] = SIZES[size]
    counts["union_concepts"] = len(pc.unique(union.column("concept_id")))
    return counts


def queries() -> list[str]:
    """Distinct real mentions: the lay development slice and NCBI-disease's development set."""
    from linker.datasets import load_dataset

    texts = [line.split("\t")[0] for line in (data.REPO / "linker/data/lay/lay_dev.tsv").read_text().splitlines()[1:]]
    if data.skip_reason("ncbi") is None:
        texts += [m.text for m in load_dataset(data.get("ncbi").spec("dev"))]
    return list(dict.fromkeys(t for t in texts if t.strip()))


def rss() -> dict:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024)
    return fields


def child_build(size: str, kind: str, out: Path, options: dict) -> None:
    from linker.index import build_index, get_kind
    from linker.index.dense import DenseConfig

    dense = DenseConfig(encoder=ENCODER, **options)
    config = {"tfidf": None, "dense": dense}.get(kind)
    if kind == "hybrid":
        config = get_kind("hybrid").config_type(dense=dense)
    started = time.perf_counter()
    manifest = build_index(table_path(size), kind=kind, out=out, config=config, overwrite=True)
    dense_part = manifest.get("dense", {})
    print(json.dumps({"build_seconds": round(time.perf_counter() - started, 1),
                      "build_cpu_seconds": round(time.process_time(), 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "faiss_kind": dense_part.get("faiss_kind"), "storage": dense_part.get("storage"),
                      "encode_seconds": dense_part.get("encode_seconds"), "recall_at_build": dense_part.get("recall"),
                      "names_per_second": dense_part.get("encoding", {}).get("names_per_second"),
                      "resumed_at": dense_part.get("encoding", {}).get("resumed_at")}))


def child_serve(index: Path, recall: bool) -> None:
    from linker.link import Linker

    linker = Linker.load(index)
    first = linker.link(["hair loss"], k=5)  # before the queries are read: their files are not the index's start-up
    print("FIRST " + json.dumps(first[0].candidates[0].concept_id if first[0].candidates else None), flush=True)
    # CPU seconds (all threads) beside the wall clock: on a shared machine under load they are what stays comparable
    first_cpu = time.process_time()
    after_load = rss()
    texts = queries()
    times, cpu = [], []
    for _ in range(3):  # the first pass also warms the pages it touches; the median of three is reported
        started, started_cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(texts), 256):
            linker.link(texts[start : start + 256], k=5)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    result = {"queries": len(texts), "mentions_per_second": round(len(texts) / float(np.median(times)), 1),
              "pass_seconds": [round(t, 2) for t in times], "pass_cpu_seconds": [round(t, 2) for t in cpu],
              "first_answer_cpu_seconds": round(first_cpu, 2), "rss_after_load_mib": after_load, "rss_mib": rss()}
    dense = getattr(linker.index.names, "dense", linker.index.names)
    if recall and dense.kind == "dense" and dense.config.faiss_kind != "flat":
        from linker.index.dense import recall_against_exact

        started = time.perf_counter()
        result["recall"] = recall_against_exact(dense, dense.encode_queries(texts), ks=(1, 5))
        if dense is linker.index.names:
            result["recall"]["concepts"] = concept_recall(linker, texts)
        result["recall"]["seconds"] = round(time.perf_counter() - started, 1)
    print("RESULT " + json.dumps(result), flush=True)


def concept_recall(linker, texts: list[str], k: int = 5, exact_names: int = 1000) -> dict:
    """What linking returns (`Linker.link`: the top-k concepts, each by its best name, widening included) against the
    top-k concepts of exact search over the same stored vectors (its best `exact_names` names, each concept scored by
    its best); ties count as hits, as in `recall_against_exact`."""
    from linker.index.dense import exact_scores, exact_topk

    dense = linker.index.names
    vectors = np.ascontiguousarray(dense.encode_queries(texts), dtype=np.float32)
    _, rows = exact_topk(vectors, dense.embeddings, exact_names)
    concept_ids = linker.concepts.table.column("concept_id")
    hits: dict[int, list[float]] = {1: [], k: []}
    for result, scores, names in zip(linker.link(texts, k=k), exact_scores(vectors, dense.embeddings, rows), rows):
        best: dict[str, float] = {}
        for score, concept in zip(scores.tolist(), concept_ids.take(pa.array(names)).to_pylist()):
            best[concept] = max(score, best.get(concept, -np.inf))
        truth = sorted(best.values(), reverse=True)
        found = np.array([c.score for c in result.candidates])
        for c in hits:
            hits[c].append(min(int(np.sum(found[:c] >= truth[min(c, len(truth)) - 1] - 1e-5)), c) / c)
    return {f"recall_at_{c}": round(float(np.mean(h)), 4) for c, h in hits.items()}


def spawn(args: list[str], program: list[str] | None = None, kill: tuple[float, str] | None = None
          ) -> tuple[dict, float | None, float]:
    """Run a child (`python -m bench.scale ARGS`, or `program` ARGS); its RESULT/last JSON line, the seconds until it
    printed FIRST, and its wall time. `kill` = (seconds, "driver" | "worker"): SIGKILL the child, or one Ray encoding
    actor, that long after the start (the child's failure is then expected: {} is returned)."""
    started, first = time.perf_counter(), None
    program = program or [sys.executable, "-m", "bench.scale"]
    proc = subprocess.Popen([*program, *args], cwd=data.REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if kill is not None:
        def killer() -> None:
            time.sleep(kill[0])
            if kill[1] == "driver":
                # once a few chunks are done (the driver's start-up and Ray's vary), so the rerun has some to skip
                while proc.poll() is None and sum(len(json.loads(f.read_text()).get("done", []))
                                                  for f in WORK.glob(".dense-partial-*/progress.json")) < 3:
                    time.sleep(0.5)
                proc.kill()
            else:  # Ray names an actor's process after its class
                actors = subprocess.run(["pgrep", "-f", "ray::_EncodeWorker"], capture_output=True, text=True).stdout.split()
                if actors:
                    os.kill(int(actors[0]), 9)
                    print(f"killed Ray actor process {actors[0]}", file=sys.stderr)
        threading.Thread(target=killer, daemon=True).start()
    result = {}
    for line in proc.stdout:
        if line.startswith("FIRST ") and first is None:
            first = time.perf_counter() - started
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
        elif line.startswith("{"):
            result = json.loads(line)
    if proc.wait() and not (kill and kill[1] == "driver"):
        raise SystemExit(f"bench.scale {' '.join(args)} failed with exit code {proc.returncode}")
    return result, first, time.perf_counter() - started


def disk_mib(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 1)


def run(sizes: list[str], kinds: list[str], recall: bool, serve_only: bool = False, label: str = "") -> list[dict]:
    """Build and serve each (size, kind); with `serve_only`, serve the index an earlier run built and keep that
    run's build figures (marked ``"served_again"``). `label` names a variant ("before", "after"): its rows sit beside
    the unlabelled ones, and its indexes in folders of their own."""
    saved = json.loads((OUT / "report.json").read_text()).get("rows", []) if (OUT / "report.json").is_file() else []
    rows = []
    for size in sizes:
        for kind in kinds:
            out = WORK / f"index-{size}-{kind}{'-' + label if label else ''}"
            before = load()
            if serve_only:
                old = next(r for r in saved if (r["size"], r["kind"], r.get("label", "")) == (size, kind, label))
                built = {key: old[key] for key in ("build_seconds", "build_cpu_seconds", "peak_rss_mib", "faiss_kind",
                                                   "storage", "encode_seconds", "recall_at_build", "names_per_second")
                         if key in old} | {"served_again": True}
            else:
                built, _, _ = spawn(["_build", size, kind, str(out)])
            served, first, _ = spawn(["_serve", str(out), *(["--recall"] if recall else [])])
            rows.append({"size": size, "kind": kind, **({"label": label} if label else {}), "names": json.loads((out / "manifest.json").read_text())
                         ["counts"]["names"], **built, "disk_mib": disk_mib(out), "first_answer_seconds":
                         round(first, 2), **served, "load_before": before, "load_after": load()})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def ray_build(size: str, workers: list[int]) -> dict:
    """Dense builds of `size`: in one process, then `--engine ray` with each worker count, then with one actor killed
    and with the driver killed and the command run again; time, and identity with the local build."""
    from linker.index import load_index

    ray = {"engine": "ray", "workers": max(workers)}
    w = max(workers)
    plan = [("local", "local", {}, None), *((f"ray-{n}", f"ray-{n}", {"engine": "ray", "workers": n}, None)
                                            for n in workers),
            # a lost worker: one actor process killed 30 s in; Ray restarts it and its chunk is encoded again
            (f"ray-{w}, a worker killed at 30 s", "worker-killed", ray, (30.0, "worker")),
            # a killed driver: the build killed once 3 chunks are done (its Ray stopped after), then the same command
            ("driver killed after 3 chunks", "driver-killed", ray, (0.0, "driver")),
            (f"ray-{w}, rerun after the driver was killed", "driver-killed", ray, None)]
    runs, folders = {}, {}
    for label, name, options, kill in plan:
        out = WORK / f"ray-{size}-{name}"
        before = load()
        built, _, wall = spawn(["_build", size, "dense", str(out), json.dumps(options)], kill=kill)
        if kill and kill[1] == "driver":
            subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True)
            continue  # the rerun reports what was left to do
        runs[label], folders[label] = {**built, "wall_seconds": round(wall, 1), "load_before": before,
                                       "load_after": load()}, out
    reference = load_index(folders["local"]).names
    sample = np.sort(np.random.default_rng(0).choice(reference.size, size=min(2000, reference.size), replace=False))
    vectors = reference.encode_queries(queries()[:1000])
    _, want = reference.search_vectors(vectors, 5)
    a = np.asarray(reference.embeddings[sample], dtype=np.float32)
    first_ray = np.asarray(load_index(folders[f"ray-{workers[0]}"]).names.embeddings[sample], dtype=np.float32)
    for label, folder in folders.items():
        if label == "local":
            continue
        other = load_index(folder).names
        b = np.asarray(other.embeddings[sample], dtype=np.float32)
        runs[label]["bit_identical_to_first_ray_build"] = bool(np.array_equal(first_ray, b))
        _, got = other.search_vectors(vectors, 5)
        runs[label]["identity"] = {"vectors_sampled": len(sample), "bit_identical_share": float(np.mean(np.all(a == b, 1))),
                                   "max_abs_difference": float(np.abs(a - b).max()),
                                   "same_top5_share": float(np.mean(np.all(got == want, 1))),
                                   "same_top1_share": float(np.mean(got[:, 0] == want[:, 0])), "queries": len(vectors)}
    return runs


def peer(size: str, python: str) -> dict:
    """scispaCy's candidate generator over the same names (`bench/peer_scispacy.py`, run by `python`)."""
    concepts = pq.read_table(table_path(size), columns=["concept_id", "name", "preferred"])
    kb, out, texts = WORK / f"kb-{size}.jsonl", WORK / f"scispacy-{size}", WORK / "queries.txt"
    grouped: dict[str, list[str]] = {}
    for cid, name in zip(concepts.column("concept_id").to_pylist(), concepts.column("name").to_pylist()):
        grouped.setdefault(cid, []).append(name)
    with kb.open("w", encoding="utf-8") as handle:
        for cid, names in grouped.items():
            handle.write(json.dumps({"concept_id": cid, "canonical_name": names[0], "aliases": names[1:]}) + "\n")
    texts.write_text("\n".join(queries()) + "\n", encoding="utf-8")
    script = [python, str(data.REPO / "bench" / "peer_scispacy.py")]
    before = load()
    built, _, _ = spawn(["build", str(kb), str(out)], script)
    served, first, _ = spawn(["serve", str(kb), str(out), str(texts)], script)
    return {"size": size, "names": concepts.num_rows, "peer": "scispacy 0.6.2 CandidateGenerator", **built,
            "disk_mib": disk_mib(out), "first_answer_seconds": round(first, 2), **served, "load_before": before,
            "load_after": load()}


def write(report: Report, part: str, value) -> None:
    path = OUT / "report.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if part == "rows":
        keep = {(r["size"], r["kind"], r.get("label", "")) for r in value}
        value = [r for r in saved.get("rows", []) if (r["size"], r["kind"], r.get("label", "")) not in keep] + value
        value.sort(key=lambda r: (list(SIZES).index(r["size"]), r["kind"], r.get("label", "")))
    saved = {k: v for k, v in saved.items() if k not in ("command", "date", "cpus", "load_before", "load_after", "commit")}
    saved[part] = value
    report.write(saved, render(saved))


def render(saved: dict) -> list[str]:
    lines = [line for part in (__doc__ or "").split("\n\n") if part.startswith("**")
             for line in (part.replace("\n", " "), "")]
    if "tables" in saved:
        lines += ["Tables: " + ", ".join(f"{k} {v:,}" for k, v in saved["tables"].items()) + ".", ""]
    if saved.get("rows"):
        lines += ["## Build and serve (2 cores, one process at a time)", ""]
        lines += table(["names", "kind", "FAISS / storage", "build s", "build peak RSS MiB", "disk MiB",
                        "first answer s", "serving RSS MiB (anon + file)", "mentions/s, k=5", "recall@1 / @5 (names)",
                        "recall@1 / @5 (concepts linked)"],
                       [[f"{r['names']:,}", r["kind"] + (f", {r['label']}" if r.get("label") else "")
                         + (" (served again)" if r.get("served_again") else ""),
                         f"{r.get('faiss_kind') or '-'} / {r.get('storage') or '-'}",
                         r["build_seconds"], f"{r['peak_rss_mib']:,}", f"{r['disk_mib']:,}", r["first_answer_seconds"],
                         f"{r['rss_mib']['VmRSS']:,} ({r['rss_mib']['RssAnon']:,} + {r['rss_mib']['RssFile']:,})",
                         f"{r['mentions_per_second']:,}",
                         (f"{r['recall']['recall_at_1']} / {r['recall']['recall_at_5']}" if "recall" in r else
                          "exact"),
                         (f"{r['recall']['concepts']['recall_at_1']} / {r['recall']['concepts']['recall_at_5']}"
                          if "concepts" in r.get("recall", {}) else "-")] for r in saved["rows"]],
                        align="r  rrrrrrrr")
        lines += ["", "Load average (1 min) before each build: " + ", ".join(
            f"{r['size']} {r['kind']}{' ' + r['label'] if r.get('label') else ''} {r['load_before'][0]}"
            for r in saved["rows"]) + "."]
    labelled = [r for r in saved.get("rows", []) if r["kind"] == "tfidf" and r.get("label")]
    if labelled:
        def cpu(r: dict, key: str) -> str:  # beside the wall clock: these runs met loads of 5-13 on 2 cores (NOTES)
            return f" ({r[key]} CPU)" if key in r else ""

        lines += ["", "## tf-idf: maxscore's postings computed at load (before) and stored at build time (after)", "",
                  *table(["names", "run", "load (1 min)", "build s", "build peak RSS MiB", "disk MiB", "first answer s",
                          "load peak RSS MiB (anon after load)", "mentions/s, k=5", "CPU s a pass (median)"],
                         [[f"{r['names']:,}", r["label"], r["load_before"][0], f"{r['build_seconds']}"
                           + cpu(r, "build_cpu_seconds"), f"{r['peak_rss_mib']:,}", f"{r['disk_mib']:,}",
                           f"{r['first_answer_seconds']}" + cpu(r, "first_answer_cpu_seconds"),
                           f"{r['rss_after_load_mib']['VmHWM']:,} ({r['rss_after_load_mib']['RssAnon']:,})",
                           f"{r['mentions_per_second']:,}",
                           float(np.median(r["pass_cpu_seconds"])) if "pass_cpu_seconds" in r else "-"]
                          for r in labelled], align="r rrrrrrrr")]
    if saved.get("ray"):
        lines += ["", "## Dense build on Ray (local Ray, one CPU per actor)", ""]
        runs = saved["ray"]["runs"]
        local = runs["local"]["build_seconds"]
        lines += table(["build", "seconds", "speed-up", "names encoded by this run", "identity with the local build"],
                       [[label, r["build_seconds"], f"{local / r['build_seconds']:.2f}x",
                         f"{saved['ray']['names'] - (r.get('resumed_at') or 0):,}"
                         + (" (sampled vectors bit-identical to the first Ray build)"
                            if r.get("bit_identical_to_first_ray_build") else ""),
                         "-" if "identity" not in r else
                         (f"{r['identity']['bit_identical_share']:.1%} of {r['identity']['vectors_sampled']:,} sampled "
                          f"vectors bit-identical (max diff {r['identity']['max_abs_difference']:.1e}); top-5 "
                          f"identical for {r['identity']['same_top5_share']:.1%}, top-1 for "
                          f"{r['identity']['same_top1_share']:.1%} of {r['identity']['queries']:,} queries")]
                        for label, r in runs.items()], align="rrr")
    if saved.get("peer"):
        r = saved["peer"]
        lines += ["", "## Peer: scispaCy's candidate generator on the same names", "",
                  *table(["names", "peer", "build s", "build peak RSS MiB", "disk MiB", "first answer s",
                          "serving RSS MiB (anon + file)", "mentions/s, k=5"],
                         [[f"{r['names']:,}", r["peer"], r["build_seconds"], f"{r['peak_rss_mib']:,}",
                           f"{r['disk_mib']:,}", r["first_answer_seconds"],
                           f"{r['rss_mib']['VmRSS']:,} ({r['rss_mib']['RssAnon']:,} + {r['rss_mib']['RssFile']:,})",
                           f"{r['mentions_per_second']:,}"]], align="rrrrrrr")]
    lines += ["", *plan(saved.get("rows", [])), "## Notes", "", *NOTES]
    return lines


def plan(rows: list[dict], target: int = 50_000_000, cores: int = 16) -> list[str]:
    """A capacity plan for `target` names, scaled from the measured dense builds (the 5M one, and the smallest for the
    part of the serving memory that does not grow with names); what each line assumes is said in it."""
    # Unlabelled rows only: a labelled one (before, after) is a variant's, its wall time not always a quiet machine's.
    dense = sorted((r for r in rows if r["kind"] == "dense" and not r.get("label")), key=lambda r: r["names"])
    if len(dense) < 2 or dense[-1]["names"] < 1_000_000:
        return []
    big, small = dense[-1], dense[0]
    scale, dim = target / big["names"], 384
    per_core = big["names_per_second"] / 2
    core_hours = target / per_core / 3600
    after_encoding = (big["build_seconds"] - big["encode_seconds"]) * scale
    grows = (big["rss_mib"]["RssAnon"] - small["rss_mib"]["RssAnon"]) / (big["names"] - small["names"])
    anon = small["rss_mib"]["RssAnon"] + grows * (target - small["names"])
    vectors_mib = dim * 2 / 2**20  # float16, per name
    fits = (24 * 1024 - small["rss_mib"]["RssAnon"]) / (vectors_mib + grows) + small["names"]
    lines = [f"## Capacity plan: {target / 1e6:.0f}M names", "",
             f"Scaled from the {big['names'] / 1e6:.0f}M dense build above, linearly in the number of names; none of it "
             f"was run at {target / 1e6:.0f}M.", "",
             f"- **Encoding** ({big['names_per_second']:,} names/s on 2 cores, {per_core:,.0f} per core): "
             f"{core_hours:,.1f} core-hours. `--engine ray` with one actor per core: "
             + ", ".join(f"{n} machine{'s' if n > 1 else ''} of {cores} cores {core_hours / (n * cores) * 60:,.0f} min"
                         for n in (1, 4, 16))
             + ". This assumes actors scale per core across machines as they did on one (2 actors on 2 cores: "
             "1.03x one process, above); across machines it was not measured, and the driver writes every chunk "
             f"({target * dim * 4 / 1e9:,.0f} GB of float32 at {per_core * cores * 16 * dim * 4 / 1e6:,.0f} MB/s "
             "from 16 machines, within one disk's bandwidth).",
             f"- **After encoding, on the driver alone** (FAISS training and filling, the recall check, saving): "
             f"{big['build_seconds'] - big['encode_seconds']:,.0f} s at {big['names'] / 1e6:.0f}M, so "
             f"~{after_encoding / 60:,.0f} min on 2 cores whatever the number of machines; "
             f"disk: {target * dim * 6 / 1e9:,.0f} GB of work files (float32 and float16) and the index, "
             f"~{big['disk_mib'] * scale / 1024:,.0f} GB.",
             f"- **IVF lists.** The build caps the lists at {4096:,}; at {target / 1e6:.0f}M each holds "
             f"~{target / 4096:,.0f} names and a search scans {scale:.0f}x the codes it scans at "
             f"{big['names'] / 1e6:.0f}M. Keep the scan by raising `DenseConfig(ivf_nlist=...)` to ~{int(4 * target ** 0.5):,} "
             "(4 sqrt(n)); k-means over that many lists is hours on 2 cores (not measured): train on a GPU or a large "
             "machine.",
             f"- **Serving.** Re-scoring reads ~200 random rows per mention from the {target * dim * 2 / 1e9:,.0f} GB "
             "vector file, at the measured speed only from the page cache: a serving machine needs that much free RAM "
             f"beside the process's own ~{anon / 1024:,.0f} GB (anonymous memory: {small['rss_mib']['RssAnon']:,} MiB at "
             f"{small['names']:,} names plus {grows * 1e6:,.0f} MiB per million names, as measured between the two "
             f"builds). By the same figures a 24 GiB machine like this one holds ~{fits / 1e6:,.0f}M names; more needs a "
             "larger machine, or the names split across machines and their top-k merged, which linker does not do "
             "yet.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tables").add_argument("--sizes", default="1m,2m,5m")
    p = sub.add_parser("run")
    p.add_argument("--sizes", default="union,1m")
    p.add_argument("--kinds", default="tfidf,dense,hybrid")
    p.add_argument("--no-recall", action="store_true")
    p.add_argument("--serve-only", action="store_true", help="serve the indexes an earlier run built")
    p.add_argument("--label", default="", help="a variant's name (before, after): rows beside the unlabelled ones")
    p = sub.add_parser("ray")
    p.add_argument("--size", default="union")
    p.add_argument("--workers", default="1,2")
    p = sub.add_parser("peer")
    p.add_argument("--size", default="union")
    p.add_argument("--python", required=True, help="the Python of an environment with scispacy installed")
    sub.add_parser("render", help="report.md again from report.json (notes or layout changed; figures and header kept)")
    p = sub.add_parser("_build")
    p.add_argument("size")
    p.add_argument("kind")
    p.add_argument("out", type=Path)
    p.add_argument("options", nargs="?", default="{}")
    p = sub.add_parser("_serve")
    p.add_argument("index", type=Path)
    p.add_argument("--recall", action="store_true")
    args = parser.parse_args()
    # Made before the work, so that its load average "before" is the one the runs met.
    report = Report("report", out=OUT, title="Terminology scale: tf-idf, dense and hybrid indexes up to 5M names")
    if args.command == "peer":  # the peer's Python lives outside the repository: the report names it by role
        report.meta["command"] = report.meta["command"].replace(args.python, "PEER_PYTHON")
    if args.command == "tables":
        saved = json.loads((OUT / "report.json").read_text()).get("tables", {}) if (OUT / "report.json").is_file() else {}
        write(report, "tables", {**saved, **make_tables(["union", *args.sizes.split(",")])})
    elif args.command == "run":
        write(report, "rows", run(args.sizes.split(","), args.kinds.split(","), not args.no_recall, args.serve_only,
                                  args.label))
    elif args.command == "ray":
        write(report, "ray", {"size": args.size, "names": pq.read_metadata(table_path(args.size)).num_rows,
                      "runs": ray_build(args.size, [int(w) for w in args.workers.split(",")])})
    elif args.command == "peer":
        write(report, "peer", peer(args.size, args.python))
    elif args.command == "render":
        saved = json.loads((OUT / "report.json").read_text())
        report.meta = {key: saved[key] for key in ("command", "date", "cpus", "load_before", "load_after", "commit")}
        (OUT / "report.md").write_text("\n".join([f"# {report.title}", "", report.header(), "", *render(saved)]).rstrip()
                                       + "\n", encoding="utf-8")
    elif args.command == "_build":
        child_build(args.size, args.kind, args.out, json.loads(args.options))
    else:
        child_serve(args.index, args.recall)


if __name__ == "__main__":
    main()
