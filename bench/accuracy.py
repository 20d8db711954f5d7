"""Regenerate every evaluation report under eval/accuracy/ from the real data in ../shared/data.

    python -m bench.accuracy [--out eval/accuracy] [--dense minilm] [--rebuild] [--only GROUPS]

Builds what it needs with linker's library (concept tables and tf-idf indexes under indexes/,
git-ignored), then runs `linker.eval.report.evaluate` on:

- NCBI-disease test (960 mentions) against MEDIC, and against MEDIC plus the train+dev
  mentions as names of their gold ids (BioSyn's protocol; only single-concept mentions are
  added, a composite mention's text names no single concept); both composite rules;
- Cantemist test against the ICD-O names of valid-codes.tsv, dictionary and training filters,
  and against those names plus the training mentions;
- CodiEsp-D test against the English ICD-10-CM names (a cross-lingual setting), idem;
- Mantra GSC per language against HPO (with its es/fr/nl/de translations) + Disease Ontology,
  predictions mapped to UMLS CUIs through the terms' xrefs.

Cantemist and Mantra are scored twice: as annotated, and with the abbreviations each document
defines expanded in its mentions (dataset option ``abbrev``, Schwartz & Hearst as for NCBI-disease).
``--only cantemist,mantra`` runs those groups alone (summary.md is then left as it is).

Writes one report per evaluation (``eval/accuracy/<name>.md|json|png``) and ``eval/accuracy/summary.md|json`` with
the paper-style table, the published reference rows, the seconds per evaluation and the load
of the (shared) machine while it ran.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from bench import data
from bench.data import dictionary as table
from bench.data import mention_names
from bench.report import Report
from linker.dictionary import SourceSpec, merge_tables
from linker.eval.report import EvalReport, evaluate, markdown_table
from linker.index import build_index
from linker.index.tfidf import PRESETS
from linker.text import icd10cm_code

log = logging.getLogger("bench.accuracy")

# Published numbers quoted beside ours (Acc@1 / Acc@5 in %, full test set).
PUBLISHED = {
    "ncbi": [("BioSyn (Sung et al. 2020)", 91.1, 93.9), ("SapBERT (Liu et al. 2021)", 92.0, 95.6)],
    "cantemist": [("tf-idf, Medical Crossing paper", 27.02, 47.92)],
    "codiesp_d": [("tf-idf, Medical Crossing paper", 20.55, 39.24)],
}


# The tf-idf reports reproduce the Medical Crossing paper's baseline, so they keep its setting (char
# 1-2-grams), the library's default until the tfidf_defaults study measured a better one; that
# report has the default's figures on the same benchmarks.
PAPER_TFIDF = PRESETS["medical-crossing"]


def index(dict_path: Path, out: Path, *, rebuild: bool, kind: str = "tfidf", config=None) -> Path:
    config = PAPER_TFIDF if kind == "tfidf" and config is None else config
    if rebuild or not (out / "manifest.json").exists():
        build_index(dict_path, kind=kind, out=out, config=config, overwrite=rebuild)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("eval/accuracy"))
    parser.add_argument("--indexes", type=Path, default=Path("indexes/eval"))
    parser.add_argument("--dense", default=None, help="also evaluate NCBI with a dense index of this encoder (e.g. minilm)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild dictionaries and indexes that exist")
    parser.add_argument("--only", default=None,
                        help="comma-separated groups to run (ncbi, cantemist, codiesp_d, mantra); summary.md is "
                             "written only by a run of every group")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out, idx, rebuild = args.out, args.indexes, args.rebuild
    report = Report("summary", out=out, title="Evaluation summary")
    started = time.perf_counter()
    results: list[tuple[str, str, EvalReport]] = []  # (group, label, report)
    only = None if args.only is None else set(args.only.split(","))

    def want(group: str) -> bool:
        return only is None or group in only

    def run(group: str, label: str, name: str, index_dir: Path, dataset: str, **kw) -> None:
        report = evaluate(index_dir, dataset, ks=(1, 5), report_dir=out, name=name, overwrite=True, **kw)  # regenerates its reports
        results.append((group, label, report))
        full = report.row("full")
        log.info("%s: Acc@1 %.2f Acc@5 %.2f (n=%d) in %.1fs", name, 100 * full.acc(1).value,
                 100 * full.acc(5).value, full.n, report.seconds["total"])

    # --- NCBI-disease ---------------------------------------------------------------------
    if want("ncbi"):
        ncbi = data.get("ncbi").check()
        medic = table(idx / "medic.parquet", [SourceSpec("tsv", (ncbi.path("medic"),))], rebuild=rebuild)
        extra = data.ncbi_train_dev_names(idx / "ncbi_train_dev_names.tsv")
        medic_td = table(idx / "medic_train_dev.parquet", [SourceSpec("tsv", (ncbi.path("medic"), extra))],
                         rebuild=rebuild)
        test = ncbi.spec("test")
        # MEDIC lines join a MeSH id and its OMIM alternatives (the concept table's xrefs); the corpus uses
        # either, and evaluation counts a predicted id as its xrefs (BioSyn's "D…|OMIM:…" labels do the same).
        train = [ncbi.spec("train"), ncbi.spec("dev")]
        i_medic = index(medic, idx / "medic_tfidf", rebuild=rebuild)
        i_medic_td = index(medic_td, idx / "medic_train_dev_tfidf", rebuild=rebuild)
        run("ncbi", "tf-idf, MEDIC, composite=all", "ncbi_tfidf_medic", i_medic, test, train_spec=train, filters=("all",))
        run("ncbi", "tf-idf, MEDIC+train+dev, composite=all", "ncbi_tfidf_medic_train_dev", i_medic_td, test,
            train_spec=train, filters=("all",))
        run("ncbi", "tf-idf, MEDIC+train+dev, composite=any (BioSyn's rule)", "ncbi_tfidf_medic_train_dev_any", i_medic_td,
            test, train_spec=train, filters=("all",), composite="any")
        if args.dense:
            from linker.encoders import load_encoder
            from linker.index.dense import DenseConfig

            encoder_name = args.dense
            load_encoder(encoder_name)  # fail early if it is not available offline
            i_dense = index(medic_td, idx / f"medic_train_dev_{encoder_name}", rebuild=rebuild, kind="dense",
                            config=DenseConfig(encoder=encoder_name))
            run("ncbi", f"dense {encoder_name}, MEDIC+train+dev, composite=all", f"ncbi_{encoder_name}_medic_train_dev",
                i_dense, test, train_spec=train, filters=("all",))

    # --- Cantemist ------------------------------------------------------------------------
    if want("cantemist"):
        cantemist = data.get("cantemist").check()
        icdo = table(idx / "icdo.parquet", [SourceSpec("icdo", (cantemist.path("codes"),))], rebuild=rebuild)
        c_test, c_train = cantemist.spec("test"), f"brat:{cantemist.path('train')}"
        run("cantemist", "tf-idf, ICD-O names (es)", "cantemist_tfidf", index(icdo, idx / "icdo_tfidf", rebuild=rebuild),
            c_test, train_spec=c_train, filters=("all",))
        c_names = mention_names([c_train], idx / "cantemist_train_names.tsv", lang="es")
        icdo_train = table(idx / "icdo_train.parquet", [SourceSpec("icdo", (cantemist.path("codes"),)),
                                                        SourceSpec("tsv", (c_names,))], rebuild=rebuild)
        run("cantemist", "tf-idf, ICD-O names + train mentions", "cantemist_tfidf_train",
            index(icdo_train, idx / "icdo_train_tfidf", rebuild=rebuild), c_test, train_spec=c_train, filters=("all",))
        # Abbreviations defined in the same clinical case expanded in test and train mentions (dataset option abbrev).
        run("cantemist", "tf-idf, ICD-O names (es), abbreviations expanded", "cantemist_tfidf_abbrev",
            idx / "icdo_tfidf", c_test + "&abbrev", train_spec=c_train + "#abbrev", filters=("all",))
        run("cantemist", "tf-idf, ICD-O names + train mentions, abbreviations expanded", "cantemist_tfidf_train_abbrev",
            idx / "icdo_train_tfidf", c_test + "&abbrev", train_spec=c_train + "#abbrev", filters=("all",))

    # --- CodiEsp-D ------------------------------------------------------------------------
    if want("codiesp_d"):
        codiesp = data.get("codiesp").check()
        icd10 = table(idx / "icd10cm.parquet", [SourceSpec("icd10", ())], rebuild=rebuild)
        x_test, x_train = codiesp.spec("test"), codiesp.spec("train")
        run("codiesp_d", "tf-idf, ICD-10-CM names (en), es mentions", "codiesp_d_tfidf",
            index(icd10, idx / "icd10cm_tfidf", rebuild=rebuild), x_test, train_spec=x_train, filters=("all",))
        x_names = mention_names([x_train], idx / "codiesp_d_train_names.tsv", lang="es", canonical=icd10cm_code)
        icd10_train = table(idx / "icd10cm_train.parquet", [SourceSpec("icd10", ()), SourceSpec("tsv", (x_names,))],
                            rebuild=rebuild)
        run("codiesp_d", "tf-idf, ICD-10-CM names (en) + train mentions (es)", "codiesp_d_tfidf_train",
            index(icd10_train, idx / "icd10cm_train_tfidf", rebuild=rebuild), x_test, train_spec=x_train, filters=("all",))

    # --- Mantra GSC -----------------------------------------------------------------------
    if want("mantra"):
        hp = table(idx / "hpo_translations.parquet", [SourceSpec("obo", tuple(data.hpo_files()))], rebuild=rebuild)
        doid = table(idx / "doid.parquet", [SourceSpec("obo", tuple(data.get("doid").paths("obo")))], rebuild=rebuild)
        merged = idx / "hpo_doid.parquet"
        if rebuild or not merged.exists():
            merge_tables([hp, doid], merged, overwrite=rebuild)
        mantra = data.get("mantra").check().spec("test")
        run("mantra", "tf-idf, HPO (+translations) + DOID, gold via UMLS xrefs", "mantra_tfidf",
            index(merged, idx / "hpo_doid_tfidf", rebuild=rebuild), mantra,
            filters=("full", "dict", "dict0.2"), gold_via_xref="UMLS")
        run("mantra", "tf-idf, HPO (+translations) + DOID, abbreviations expanded", "mantra_tfidf_abbrev",
            idx / "hpo_doid_tfidf", mantra + "#abbrev", filters=("full", "dict", "dict0.2"), gold_via_xref="UMLS")

    if only is None:
        write_summary(report, results, time.perf_counter() - started)
    else:
        log.info("--only %s: summary.md not rewritten (a run of every group writes it)", args.only)


def write_summary(report: Report, results, seconds: float) -> None:
    lines = ["Acc@k in %; n = mentions in the subset. Filters as in the "
             "Medical Crossing paper (faithful `lower().strip()`; Filtered drops exact matches of the reference "
             "strings, Filtered0.2 also those with normalised Levenshtein < 0.2); *dict* = the index's names, "
             "*train* = the training mentions; *in dict %*: mentions whose gold id the dictionary holds at all. "
             "Composite rule *all*: a composite mention is right only if every "
             "part's id is in the top k; *any*: one part suffices (BioSyn's check). 95% bootstrap intervals are in "
             "the per-evaluation reports.", ""]
    groups = list(dict.fromkeys(g for g, _, _ in results))
    titles = {"ncbi": "NCBI-disease test", "cantemist": "Cantemist test", "codiesp_d": "CodiEsp-D test",
              "mantra": "Mantra GSC (per language)"}
    for group in groups:
        labelled = [(label, rep) for g, label, rep in results if g == group]
        lines += [f"## {titles.get(group, group)}", "", markdown_table(labelled, reach=True), ""]
        if group in PUBLISHED:
            lines += ["Published (full test set): " + "; ".join(f"{name} {a1:.2f} / {a5:.2f}" for name, a1, a5 in PUBLISHED[group]),
                      ""]
    lines += ["## Time per evaluation", "", "| evaluation | mentions | load index s | filter s | link s | total s |",
              "|---|---|---|---|---|---|"]
    for _, label, rep in results:
        s = rep.seconds
        lines.append(f"| {Path(rep.files[0]).stem} ({label}) | {rep.config['mentions']:,} | {s['load_index']:.2f} | "
                     f"{s['filter']:.2f} | {s['link']:.2f} | {s['total']:.2f} |")
    lines += ["", f"Whole run {seconds:.0f}s including dictionary and index builds."]
    report.write({"seconds": seconds, "published": PUBLISHED,
                  "evaluations": [{"group": g, "label": label, **rep.to_dict()} for g, label, rep in results]}, lines)


if __name__ == "__main__":
    main()
