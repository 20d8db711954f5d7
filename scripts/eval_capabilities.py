"""Capability-suite reports under eval/capabilities/: the default index, MEDIC and HPO, several systems side by side.

    .venv/bin/python scripts/capability_indexes.py --data ../shared/data          # builds indexes/ (once)
    .venv/bin/python scripts/eval_capabilities.py [--data ../shared/data] [--out eval] [--sample 200] [--seed 15]
        [--part all|default|medic|hpo]

Writes ``eval/capabilities/capabilities_default``, ``capabilities_medic`` and ``capabilities_hpo`` (.md, .json,
.png) with `linker.eval.capabilities`, the library behind ``linker eval --suite capabilities``:

- default: the embedded default tf-idf index (``indexes/default``, ``make demo`` builds it);
- MEDIC: tf-idf over all 76,237 names, and tf-idf, dense MiniLM and hybrid (tf-idf + MiniLM) over a
  3,000-concept sample (18,662 names; capability_indexes.py says why);
- HPO with its es/fr/de/nl translations: tf-idf over the whole table (87,818 names), and tf-idf, dense
  e5-small and hybrid over a 3,000-concept sample of it (13,750 names), with HPO's is_a for the DIR cases.

The re-ranked index (issue 14) is not compared: it was not on main when these reports were made.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from capability_indexes import default_index
from linker.eval.capabilities import evaluate_capabilities, write_capability_report

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("eval_capabilities")
HPO_OBO = "hpo/hp.obo.2025-01-16.gz"


def run(name: str, indexes: list[tuple[str, str]], out: Path, *, sample: int, seed: int, intro: str,
        hierarchy: Path | None = None, data: Path | None = None) -> None:
    missing = [path for _, path in indexes if not (ROOT / path / "manifest.json").exists()]
    if missing:
        sys.exit(f"missing index folder(s) {', '.join(missing)}: run scripts/capability_indexes.py first")
    os.chdir(ROOT)  # index paths in the reports stay relative to the repository
    reports = evaluate_capabilities([path for _, path in indexes], labels=[label for label, _ in indexes],
                                    sample=sample, seed=seed, hierarchy=hierarchy)
    for report in reports:
        if hierarchy is not None:  # name shared data as ../shared/data/..., never by its machine path
            report.config["hierarchy"] = f"../shared/data/{hierarchy.relative_to(data).as_posix()}"
    command = f"scripts/eval_capabilities.py --sample {sample} --seed {seed} --part {name}"
    write_capability_report(reports, out, name=f"capabilities_{name}", intro=intro + f"\n\nCommand: `{command}`.",
                            overwrite=True)  # regenerates its own reports
    log.info("wrote %s", out / f"capabilities_{name}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "capabilities")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--part", choices=("all", "default", "medic", "hpo"), default="all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data, out = args.data.resolve(), args.out.resolve()
    common = {"sample": args.sample, "seed": args.seed}
    if args.part in ("all", "default"):
        default_index(ROOT / "indexes")
        run("default", [("default tf-idf", "indexes/default")], out, **common,
            intro="The embedded default dictionary (ICD-10-CM and HPO, English) with its tf-idf index, as `make demo` builds it.")
    if args.part in ("all", "medic"):
        run("medic", [("tf-idf (all)", "indexes/medic-tfidf"), ("tf-idf (3k)", "indexes/medic-3k-tfidf"),
                      ("dense MiniLM (3k)", "indexes/medic-3k-dense"), ("hybrid MiniLM (3k)", "indexes/medic-3k-hybrid")],
            out, **common,
            intro="MEDIC (CTD, 06 Jul 2012, the NCBI-disease vocabulary), English. `tf-idf (all)`: all 11,915 concepts, "
                  "76,237 names. The three `(3k)` systems share a sample of 3,000 of its concepts (seed 15, 18,662 "
                  "names), because encoding every name with MiniLM on the shared 2 cores would have taken about an "
                  "hour; their cases are drawn from the sample, so compare the two tf-idf columns to see how much "
                  "the smaller dictionary eases each capability. MEDIC gives no hierarchy, so there are no DIR cases.")
    if args.part in ("all", "hpo"):
        run("hpo", [("tf-idf (all)", "indexes/hpo-multi-tfidf"), ("tf-idf (3k)", "indexes/hpo-multi-3k-tfidf"),
                    ("dense e5-small (3k)", "indexes/hpo-multi-3k-dense"),
                    ("hybrid e5-small (3k)", "indexes/hpo-multi-3k-hybrid")], out, **common,
            hierarchy=data / HPO_OBO, data=data,
            intro="HPO 2025-01-16 with its Babelon translations (es, fr official; de, nl candidate). `tf-idf (all)`: "
                  "the whole table, 19,034 concepts, 87,818 names. The three `(3k)` systems share a sample of 3,000 "
                  "of its concepts (seed 15, 13,750 names), because encoding every name with e5-small on the shared "
                  "2 cores was impractical; their cases are drawn from the sample, so compare the two tf-idf columns "
                  "to see how much the smaller dictionary eases each capability. DIR cases use HPO's is_a.")


if __name__ == "__main__":
    main()
