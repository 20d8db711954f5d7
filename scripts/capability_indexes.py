"""Build the concept tables and indexes the capability reports compare (git-ignored, under indexes/).

    .venv/bin/python scripts/capability_indexes.py [--data ../shared/data] [--work indexes] [--threads 2]
        [--part all|medic|hpo]

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
Steps whose index already exists are skipped (unless --rebuild).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from linker.dictionary import SourceSpec, build_dictionary, read_concept_table
from linker.fileio import atomic_file
from linker.encoders import load_encoder
from linker.index import build_index
from linker.index.dense import DenseConfig, encode_names, partial_dir
from linker.index.hybrid import HybridConfig
from linker.index.tfidf import TfidfConfig

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CONCEPTS, SAMPLE_SEED = 3000, 15
# The tf-idf of the committed reports: char 1-2 n-grams with the `words` normalisation (scripts/capability_fix.py);
# the hybrids' tf-idf part: char 1-2 with `default`, the library default when they were built.
TFIDF = TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="words")
HYBRID_TFIDF = TfidfConfig(analyzer="char", ngram_min=1, ngram_max=2, normalization="default")
log = logging.getLogger("capability_indexes")


def tables(data: Path, work: Path) -> dict[str, Path]:
    hpo = data / "hpo"
    sources = {
        "medic": [SourceSpec("tsv", (data / "ncbi_disease" / "medic_06Jul2012.txt",))],
        "hpo-multi": [SourceSpec("obo", (hpo / "hp.obo.2025-01-16.gz",
                                         *(hpo / f"hp-{lang}.babelon.tsv" for lang in ("es", "fr", "de", "nl"))))],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("all", "medic", "hpo"), default="all")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    paths = tables(args.data, args.work)
    for name in ("medic", "hpo-multi"):
        paths[f"{name}-3k"] = concept_sample(paths[name], args.work / f"{name}-3k.parquet", SAMPLE_CONCEPTS, SAMPLE_SEED)
    for name, path in paths.items():
        out = args.work / f"{name}-tfidf"
        if args.rebuild or not (out / "manifest.json").exists():
            build_index(path, kind="tfidf", out=out, config=TFIDF, overwrite=args.rebuild)
            log.info("built %s", out)
    if args.part in ("all", "medic"):
        dense_and_hybrid(paths["medic-3k"], "minilm", args.work / "medic-3k", threads=args.threads, rebuild=args.rebuild)
    if args.part in ("all", "hpo"):
        dense_and_hybrid(paths["hpo-multi-3k"], "e5-small", args.work / "hpo-multi-3k", threads=args.threads, rebuild=args.rebuild)


if __name__ == "__main__":
    main()
