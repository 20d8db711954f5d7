"""The three decisions (auto, review, no link) on held-in benchmark data: eval/decisions/report.md and report.json.

    python -m bench.decisions [--out eval/decisions] [--scratch /tmp/linker-decisions]

Each system is calibrated as `make demo` calibrates the default index (`linker calibrate --dictionary-names 1000`)
on held-in mentions, then `linker eval` scores its decisions on other held-in mentions; no test set is read:

- NCBI-disease: MEDIC, dense `linker-en` (the shipped encoder, as `recipes/ncbi-disease-linker-en.toml` without the
  training mentions as names); calibrated on the training split's mentions, scored on the development split.
- TAC 2017: the closed-world MedDRA dictionary of the training split's labels (`bench.extract.closed_world_meddra`,
  the split of `linker/models/linker-ae`'s manifest), tf-idf; calibrated on the training labels' reaction strings
  with their PTs, scored on the development labels' (the gold mentions, as "gold mentions linked" in
  eval/extract/report.md).

Each index is also scored with the shipped re-ranker as `make demo` binds it to the default index (`RERANKER` over
the top `RERANK_K`), calibrated alike on a copy of the index folder (a folder holds one calibration).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from bench import data
from bench.report import REPO, Report, table

DICTIONARY_NAMES = "1000"  # as the Makefile's default calibration
RERANKER, RERANK_K = "linker-rerank-en", "4"  # as the Makefile binds and calibrates the default index's


def linker_cli(*args: str) -> str:
    return subprocess.run([str(Path(sys.executable).parent / "linker"), "-q", *args], check=True,
                          capture_output=True, text=True).stdout


def reaction_rows(files: list[Path]) -> list[tuple[str, str]]:
    """(PT id, reaction string) of every Reaction of the labels with a MedDRA PT (its first Normalization's)."""
    from linker.formats.ade_xml import read_ade_xml

    rows = []
    for file in files:
        for reaction in read_ade_xml(file).root.iter("Reaction"):
            pts = [n.get("meddra_pt_id") for n in reaction.iter("Normalization") if n.get("meddra_pt_id")]
            if pts and reaction.get("str", "").strip():
                rows.append((pts[0], " ".join(reaction.get("str").split())))
    return rows


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{cid}\t{text}\n" for cid, text in rows), encoding="utf-8")
    return path


def calibrate_and_score(index: Path, heldin: str, scored: str, rerank: str | None = None) -> dict:
    """`index` calibrated on `heldin` and scored on `scored`; with `rerank`, a copy of it beside it, re-ranked."""
    options = []
    if rerank is not None:
        copy = index.with_name(f"{index.name}-{rerank}")
        if not copy.is_dir():
            shutil.copytree(index, copy)
        index, options = copy, ["--rerank", rerank, "--rerank-k", RERANK_K]
    calibration = json.loads(linker_cli("calibrate", "--index", str(index), "--dataset", heldin,
                                        "--dictionary-names", DICTIONARY_NAMES, *options))
    from linker.eval.report import evaluate

    report = evaluate(index, scored, ks=(1,), progress=False, rerank=rerank)
    cal = report.calibration
    return {"calibrated_on": heldin, "scored_on": scored, "mentions": cal["mentions"],
            "accuracy_at_1": cal["accuracy_at_1"], "ece_calibrated": cal["ece_calibrated"],
            "decisions": cal["decisions"], "margin_weight": calibration["margin_weight"],
            "retriever_weight": calibration.get("mixing", {}).get("retriever_weight"),
            "reranker_helps": calibration.get("mixing", {}).get("reranker_helps"),
            "decisions_held_in_out_of_fold": calibration["decisions_out_of_fold"]}


def ncbi(scratch: Path, rerank: str | None = None) -> dict:
    ncbi_dir = data.root() / "ncbi_disease"
    table_path = scratch / "medic.parquet"
    if not table_path.is_file():
        linker_cli("dict", "build", "--source", "tsv", str(ncbi_dir / "medic_06Jul2012.txt"), "--out", str(table_path))
    index = scratch / "ncbi-linker-en"
    if not (index / "manifest.json").is_file():
        linker_cli("index", "build", "--dict", str(table_path), "--kind", "dense", "--encoder", "linker-en",
                   "--precision", "fp32", "--out", str(index), "--overwrite")
    return calibrate_and_score(index, f"pubtator:{ncbi_dir / 'NCBItrainset_corpus.txt'}",
                               f"pubtator:{ncbi_dir / 'NCBIdevelopset_corpus.txt'}", rerank)


def tac(scratch: Path, rerank: str | None = None) -> dict:
    from bench.extract import closed_world_meddra

    folder = data.root() / "tac2017" / "train_xml"
    manifest = json.loads((REPO / "linker" / "models" / "linker-ae" / "manifest.json").read_text())
    dev = [folder / f"{stem}.xml" for stem in manifest["training"]["tac_dev_labels"]]
    train = [folder / f"{stem}.xml" for stem in manifest["training"]["tac_train_labels"]]
    index = scratch / "tac-closed"
    if not (index / "manifest.json").is_file():
        meddra = closed_world_meddra(train, scratch / "tac-meddra")
        table_path = scratch / "tac-closed.parquet"
        linker_cli("dict", "build", "--source", "meddra", str(meddra["folder"]), "--out", str(table_path), "--overwrite")
        linker_cli("index", "build", "--dict", str(table_path), "--kind", "tfidf", "--out", str(index), "--overwrite")
    heldin = write_tsv(scratch / "tac_train_reactions.tsv", reaction_rows(train))
    scored = write_tsv(scratch / "tac_dev_reactions.tsv", reaction_rows(dev))
    return calibrate_and_score(index, f"tsv:{heldin}", f"tsv:{scored}", rerank)


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(results: dict) -> list[str]:
    rows = []
    for name, r in results.items():
        cells = [name, f"{r['mentions']:,}", pct(r["accuracy_at_1"])]
        for d in ("auto", "review", "no link"):
            cells += [pct(r["decisions"][d]["share"]), pct(r["decisions"][d]["precision"])]
        rows.append(cells + [f"{r['ece_calibrated']:.3f}", str(r["margin_weight"])])
    return [
        "Decisions of `linker calibrate` (`linker.confidence`): `auto` at confidence >= 0.95, `no link` below 0.2, "
        "`review` between; share of the mentions and precision (the share of the band's best candidates that are "
        "right). Calibrated on the first held-in set with 1,000 of the index's own names, scored on the second; no "
        "test set read.", "",
        *table(["data (scored on)", "n", "Acc@1", "auto share", "auto precision", "review share", "review precision",
                "no link share", "no link precision", "ECE", "margin weight"], rows, "lrrrrrrrrrr"),
        "", *[f"- **{name}**: calibrated on `{r['calibrated_on']}`, scored on `{r['scored_on']}`."
              for name, r in results.items()],
        "", f"Rows with `{RERANKER}`: the shipped re-ranker re-scores the retriever's top {RERANK_K} concepts (5 with the "
        "margin) as `make demo` binds it to the default index; `linker calibrate --rerank` chose the retriever's "
        "weight in the mixed score on the held-in set (" + "; ".join(
            f"{name.split(' (')[0]}: {r['retriever_weight']:.1f}"
            + ("" if r.get("reranker_helps") else ", where no weight beat the retriever's own order, so the largest "
               "tried keeps it and the re-ranker only breaks its ties")
            for name, r in results.items() if r.get("retriever_weight") is not None and RERANKER in name) + ").",
        "", "The TAC files under <scratch> are written by this script from the labels (`reaction_rows`: PT id, "
        "reaction string).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "eval" / "decisions")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/linker-decisions"))
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    report = Report("report", out=args.out, title="Decisions on held-in benchmark data: auto, review, no link")
    ncbi_name, tac_name = "NCBI-disease dev (MEDIC, dense linker-en", "TAC 2017 dev split, gold mentions (closed-world MedDRA, tf-idf"
    results = {f"{ncbi_name})": ncbi(args.scratch), f"{ncbi_name} + {RERANKER})": ncbi(args.scratch, RERANKER),
               f"{tac_name})": tac(args.scratch), f"{tac_name} + {RERANKER})": tac(args.scratch, RERANKER)}
    report.write(results, markdown(results), scratch=args.scratch)


if __name__ == "__main__":
    main()
