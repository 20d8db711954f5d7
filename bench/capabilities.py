"""Capability-suite reports under eval/capabilities/: the default index, MEDIC and HPO, several systems side by side.

    python -m bench.capabilities [--part all|default|medic|hpo] [--sample 200] [--seed 15] [--work indexes]

Writes ``eval/capabilities/capabilities_{default,medic,hpo}`` (.md, .json, .png) with `linker.eval.capabilities`,
the library behind ``linker capabilities``, after building the concept tables and indexes it compares (git-ignored,
under --work; a step whose index exists is skipped unless --rebuild):

- default: the embedded default dictionary with a tf-idf index;
- MEDIC (NCBI-disease's 2012 vocabulary: 11,915 concepts, 76,237 names, English): tf-idf over all of it;
- HPO 2025-01-16 with its es/fr/de/nl Babelon translations (19,034 concepts, 87,818 names): tf-idf over all;
- for each, a sample of 3,000 of its concepts (seed 15, every name of a sampled concept kept):
  tf-idf, dense and hybrid (tf-idf + dense) with MiniLM for MEDIC and e5-small for HPO.

Why samples: on the 2 cores shared by seven jobs MiniLM encoded 15-28 names/s (so all of MEDIC would
have taken about an hour) and e5-small fewer; the tf-idf index over both the whole table and the
sample shows how much the smaller dictionary eases each capability.

Each dense encoding is done once: the names are encoded into the resumable work folder that
`linker.index.dense` keys by (names, encoder); a copy of it is put back before the hybrid build, which
then resumes with nothing left to encode instead of encoding every name a second time.
The re-ranked index (issue 14) is not compared: it was not on main when these reports were made.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import data
from bench.report import REPO, Report
from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.encoders import load_encoder
from linker.eval.capabilities import evaluate_capabilities, write_capability_report
from linker.fileio import atomic_file
from linker.index import build_index
from linker.index.dense import DenseConfig, encode_names, partial_dir
from linker.index.hybrid import HybridConfig
from linker.index.tfidf import TfidfConfig

SAMPLE_CONCEPTS, SAMPLE_SEED = 3000, 15
# The tf-idf of the committed reports: char 1-2 n-grams with the `words` normalisation (eval/capabilities/capabilities_fix.md);
# the hybrids' tf-idf part: char 1-2 with `default`, the library default when they were built.
TFIDF = TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="words")
HYBRID_TFIDF = TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="default")
log = logging.getLogger("bench.capabilities")


def tables(work: Path) -> dict[str, Path]:
    hpo = data.get("hpo").check()
    sources = {
        "medic": [SourceSpec("tsv", (data.get("ncbi").path("medic"),))],
        "hpo-multi": [SourceSpec("obo", (hpo.path("obo"),
                                         *(hpo.dir / f"hp-{lang}.babelon.tsv" for lang in ("es", "fr", "de", "nl"))))],
    }
    out = {}
    for name, specs in sources.items():
        out[name] = work / f"{name}.parquet"
        if not out[name].exists():
            summary = build_dictionary(specs, out[name])
            log.info("%s: %d names of %d concepts", out[name], summary.rows, summary.concepts)
    return out


def default_index(work: Path) -> Path:
    """The embedded default dictionary and its tf-idf index, as `make indexes/default` builds them."""
    table, out = work / "default.parquet", work / "default"
    if not table.exists():
        build_dictionary([SourceSpec("default", ())], table)
    if not (out / "manifest.json").exists():
        build_index(table, kind="tfidf", out=out, config=TFIDF)
    return out


def concept_sample(dict_path: Path, out: Path, concepts: int, seed: int) -> Path:
    """The rows of `concepts` concepts drawn at random (fixed seed) from the table at `dict_path`."""
    if not out.exists():
        table = read_concept_table(dict_path).table
        ids = sorted(set(table.column("concept_id").to_pylist()))
        keep = np.random.default_rng(seed).choice(len(ids), size=min(concepts, len(ids)), replace=False)
        sample = table.filter(pc.is_in(table.column("concept_id"), value_set=pa.array([ids[i] for i in keep])))
        with atomic_file(out) as tmp:
            pq.write_table(sample, tmp)
        log.info("%s: %d names of %d concepts", out, sample.num_rows, len(keep))
    return out


def dense_and_hybrid(dict_path: Path, encoder_name: str, stem: Path, *, threads: int, rebuild: bool) -> None:
    dense_out, hybrid_out = stem.with_name(stem.name + "-dense"), stem.with_name(stem.name + "-hybrid")
    dense_config = DenseConfig(encoder=encoder_name, threads=threads)
    if not rebuild and (dense_out / "manifest.json").exists() and (hybrid_out / "manifest.json").exists():
        return
    names = read_concept_table(dict_path).table.column("name").to_pylist()
    encoder = load_encoder(encoder_name, threads=threads)
    work = partial_dir(stem.parent, names, encoder)
    started = time.perf_counter()
    encode_names(names, encoder, work, batch_size=dense_config.batch_size, chunk_rows=dense_config.chunk_rows)
    log.info("encoded %d names with %s in %.0f s", len(names), encoder_name, time.perf_counter() - started)
    keep = work.with_name(work.name + "-copy")
    shutil.rmtree(keep, ignore_errors=True)
    shutil.copytree(work, keep)
    for kind, out, config in (("dense", dense_out, dense_config), ("hybrid", hybrid_out, HybridConfig(tfidf=HYBRID_TFIDF, dense=dense_config))):
        if rebuild or not (out / "manifest.json").exists():
            if not work.exists():
                shutil.copytree(keep, work)
            build_index(dict_path, kind=kind, out=out, config=config, overwrite=rebuild)
            log.info("built %s", out)
    shutil.rmtree(keep, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def build_indexes(work: Path, *, part: str, threads: int, rebuild: bool) -> None:
    work.mkdir(parents=True, exist_ok=True)
    paths = tables(work)
    for name in ("medic", "hpo-multi"):
        paths[f"{name}-3k"] = concept_sample(paths[name], work / f"{name}-3k.parquet", SAMPLE_CONCEPTS, SAMPLE_SEED)
    for name, path in paths.items():
        out = work / f"{name}-tfidf"
        if rebuild or not (out / "manifest.json").exists():
            build_index(path, kind="tfidf", out=out, config=TFIDF, overwrite=rebuild)
            log.info("built %s", out)
    if part in ("all", "medic"):
        dense_and_hybrid(paths["medic-3k"], "minilm", work / "medic-3k", threads=threads, rebuild=rebuild)
    if part in ("all", "hpo"):
        dense_and_hybrid(paths["hpo-multi-3k"], "e5-small", work / "hpo-multi-3k", threads=threads, rebuild=rebuild)


def run(name: str, indexes: list[tuple[str, Path]], out: Path, *, sample: int, seed: int, intro: str,
        hierarchy: Path | None = None) -> None:
    os.chdir(REPO)  # index paths in the reports stay relative to the repository
    writer = Report(f"capabilities_{name}", out=out, title="")  # the header: load before and after the suite
    reports = evaluate_capabilities([os.path.relpath(path, REPO) for _, path in indexes],
                                    labels=[label for label, _ in indexes], sample=sample, seed=seed, hierarchy=hierarchy)
    for report in reports:
        if hierarchy is not None:  # name shared data as ../shared/data/..., never by its machine path
            report.config["hierarchy"] = f"../shared/data/{hierarchy.relative_to(data.root()).as_posix()}"
    write_capability_report(reports, out, name=f"capabilities_{name}", intro=f"{intro}\n\n{writer.header()}",
                            overwrite=True)  # regenerates its own reports
    log.info("wrote %s", out / f"capabilities_{name}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("eval/capabilities"))
    parser.add_argument("--work", type=Path, default=Path("indexes"))
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("all", "default", "medic", "hpo"), default="all")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out, work = args.out.resolve(), args.work.resolve()
    common = {"sample": args.sample, "seed": args.seed}
    if args.part in ("all", "default"):
        run("default", [("default tf-idf", default_index(work))], out, **common,
            intro="The embedded default dictionary (ICD-10-CM and HPO, English) with its tf-idf index.")
    if args.part == "default":
        return
    build_indexes(work, part=args.part, threads=args.threads, rebuild=args.rebuild)
    if args.part in ("all", "medic"):
        run("medic", [("tf-idf (all)", work / "medic-tfidf"), ("tf-idf (3k)", work / "medic-3k-tfidf"),
                      ("dense MiniLM (3k)", work / "medic-3k-dense"), ("hybrid MiniLM (3k)", work / "medic-3k-hybrid")],
            out, **common,
            intro="MEDIC (CTD, 06 Jul 2012, the NCBI-disease vocabulary), English. `tf-idf (all)`: all 11,915 concepts, "
                  "76,237 names. The three `(3k)` systems share a sample of 3,000 of its concepts (seed 15, 18,662 "
                  "names), because encoding every name with MiniLM on the shared 2 cores would have taken about an "
                  "hour; their cases are drawn from the sample, so compare the two tf-idf columns to see how much "
                  "the smaller dictionary eases each capability. MEDIC gives no hierarchy, so there are no DIR cases.")
    if args.part in ("all", "hpo"):
        run("hpo", [("tf-idf (all)", work / "hpo-multi-tfidf"), ("tf-idf (3k)", work / "hpo-multi-3k-tfidf"),
                    ("dense e5-small (3k)", work / "hpo-multi-3k-dense"),
                    ("hybrid e5-small (3k)", work / "hpo-multi-3k-hybrid")], out, **common,
            hierarchy=data.get("hpo").path("obo"),
            intro="HPO 2025-01-16 with its Babelon translations (es, fr official; de, nl candidate). `tf-idf (all)`: "
                  "the whole table, 19,034 concepts, 87,818 names. The three `(3k)` systems share a sample of 3,000 "
                  "of its concepts (seed 15, 13,750 names), because encoding every name with e5-small on the shared "
                  "2 cores was impractical; their cases are drawn from the sample, so compare the two tf-idf columns "
                  "to see how much the smaller dictionary eases each capability. DIR cases use HPO's is_a.")


if __name__ == "__main__":
    main()
