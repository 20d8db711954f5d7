"""Evaluate the adverse-event extractor (linker-ae): writes eval/extract/report.md and report.json.

- TAC 2017 development split (the labels the release's manifest lists as held out): AdverseReaction mention F1,
  exact and relaxed (all mentions, as TAC's task 1; and positive ones against positive predictions); then
  end-to-end coding with `linker.extract.annotate_spans` and a closed-world MedDRA-format dictionary built from the
  Normalization elements of the training-split labels only, scored with the ADE Eval use cases
  (`linker.eval.ade_eval`), beside the same dictionary coding the gold mentions (`linker normalize`'s ade-xml path).
- PHEE test: Effect EM_F1 / Token_F1 (`linker.extract.metrics`) beside the PHEE paper's rows. The test set is
  scored once per release: the count is kept in report.json and a second scoring needs --rescore-test.

    .venv/bin/python scripts/extract_eval.py [--data ../shared/data] [--model linker-ae] [--out eval/extract]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STYLES = ("terms", "auto")  # TAC's convention, and the default of `linker extract` / `annotate`
PAPER_ROWS = [("PHEE paper: sequence labelling", 70.75, 79.72), ("PHEE paper: extractive QA", 71.21, 80.26),
              ("PHEE paper: generative QA", 74.00, 83.63)]
TAC_PUBLISHED = ("Belousov et al. 2019, 'Extracting adverse drug reactions and their context using sequence labelling "
                 "ensembles in TAC2017' (arXiv:1905.11716): TAC 2017 task 1 test-set F1 76.00 and 75.61 (their two "
                 "runs; the official test set, not this development split). Track overview: Roberts, Demner-Fushman, "
                 "Tonning, 'Overview of the TAC 2017 Adverse Reaction Extraction from Drug Labels Track', TAC 2017.")


def rel(path: Path) -> str:
    path = Path(path).resolve()
    for base, shown in ((ROOT, ""), (ROOT.parent / "shared", "../shared/")):
        try:
            return shown + str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def closed_world_meddra(label_files: list[Path], folder: Path) -> dict:
    """MedDRA ASCII files (pt.asc, llt.asc) with the PTs and LLTs that the labels' Normalization elements name."""
    from linker.formats.ade_xml import read_ade_xml

    pts, llts = {}, {}
    for file in label_files:
        for norm in read_ade_xml(file).root.iter("Normalization"):
            pt_id, pt = norm.get("meddra_pt_id"), norm.get("meddra_pt")
            if not pt_id or not pt:
                continue
            pts.setdefault(pt_id, pt)
            if norm.get("meddra_llt_id") and norm.get("meddra_llt"):
                llts.setdefault(norm.get("meddra_llt_id"), (norm.get("meddra_llt"), pt_id))
    ascii_dir = folder / "MedDRA_closed_English" / "MedAscii"
    ascii_dir.mkdir(parents=True)
    (ascii_dir / "pt.asc").write_text("".join(f"{c}${n}$$$$$$$$$$\n" for c, n in sorted(pts.items())), encoding="utf-8")
    rows = {c: (n, c) for c, n in pts.items()}  # every PT is also an LLT of itself
    rows.update(llts)
    (ascii_dir / "llt.asc").write_text("".join(f"{c}${n}${p}$$$$$$$Y$$\n" for c, (n, p) in sorted(rows.items())),
                                       encoding="utf-8")
    return {"pts": len(pts), "llts": len(llts), "folder": ascii_dir.parent}


def linker_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "linker", "-q", *args], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--model", default="linker-ae")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "extract")
    parser.add_argument("--rescore-test", action="store_true", help="Score PHEE test again (counted in the report).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--render-only", action="store_true", help="Rewrite report.md from report.json; score nothing.")
    args = parser.parse_args()
    if args.render_only:
        from linker.extract.extractor import release_path
        from linker.models import read_release

        report = json.loads((args.out / "report.json").read_text(encoding="utf-8"))
        (args.out / "report.md").write_text(render(report, read_release(release_path(args.model)).manifest),
                                            encoding="utf-8")
        return

    from linker.eval.ade_eval import score_paths
    from linker.extract import annotate_spans, load_extractor
    from linker.extract.data import AE, BENEFIT, read_phee, read_tac
    from linker.extract.io import read_inputs, write_output
    from linker.extract.metrics import mention_scores, phee_scores
    from linker.extract.train import effect_strings
    from linker.link import Linker
    from linker.normalize import normalize_path

    started, cpu0 = time.perf_counter(), cpu_seconds()
    previous = {}
    if (args.out / "report.json").is_file():
        previous = json.loads((args.out / "report.json").read_text(encoding="utf-8"))
    extractor = load_extractor(args.model, threads=args.threads)
    manifest = __import__("linker.models", fromlist=["read_release"]).read_release(
        __import__("linker.extract.extractor", fromlist=["release_path"]).release_path(args.model)).manifest
    tac_folder = args.data / "tac2017" / "train_xml"
    dev_files = [tac_folder / f"{stem}.xml" for stem in manifest["training"]["tac_dev_labels"]]
    train_files = [tac_folder / f"{stem}.xml" for stem in manifest["training"]["tac_train_labels"]]
    report: dict = {"model": extractor.revision, "threshold": extractor.thresholds(),
                    "data": rel(args.data), "tac_dev_labels": len(dev_files)}

    # ---- TAC 2017 dev split: mentions, for the terms style (TAC's convention) and auto (the default)
    sections = [doc for file in dev_files for doc in read_tac(file)]
    gold_all = [[g[0] for g in d.groups] for d in sections]
    gold_pos = [[g[0] for g in d.groups if g[2] == "positive"] for d in sections]
    report["tac_dev_mentions"] = {"discontinuous_gold": sum(1 for d in sections for g in d.groups if len(g[0]) > 1),
                                  "sections": len(sections), "characters": sum(len(d.text) for d in sections)}
    extract_seconds = {}
    for style in STYLES:
        t0 = time.perf_counter()
        predicted = extractor.extract([d.text for d in sections], style=style)
        extract_seconds[style] = time.perf_counter() - t0
        pred_all = [[(s.start, s.end) for s in spans if s.label == AE] for spans in predicted]
        pred_pos = [[(s.start, s.end) for s in spans if s.label == AE and s.status == "positive"] for spans in predicted]
        report["tac_dev_mentions"][style] = {"all": mention_scores(gold_all, pred_all),
                                             "positive": mention_scores(gold_pos, pred_pos)}

    # ---- TAC 2017 dev split: end to end with the closed-world dictionary (training-split Normalizations only)
    end_to_end, throughput = {}, {}
    with tempfile.TemporaryDirectory(prefix="extract-eval-") as tmp:
        tmp = Path(tmp)
        meddra = closed_world_meddra(train_files, tmp)
        linker_cli("dict", "build", "--source", "meddra", str(meddra["folder"]), "--out", str(tmp / "closed.parquet"))
        linker_cli("index", "build", "--dict", str(tmp / "closed.parquet"), "--out", str(tmp / "closed-index"))
        linker = Linker.load(tmp / "closed-index")
        for style in STYLES:
            docs = [doc for file in dev_files for doc in read_inputs(file)]
            t0 = time.perf_counter()
            n_spans = 0
            for doc in docs:
                texts = [text for _, text in doc.sections]
                doc.spans = annotate_spans(linker, texts, extractor.extract(texts, style=style), k=1)
                n_spans += sum(len(s) for s in doc.spans)
            seconds = time.perf_counter() - t0
            write_output(docs, tmp / f"submission-{style}", "ade-xml", coded=True)
            end_to_end[style] = _summary(score_paths(dev_files, sorted((tmp / f"submission-{style}").glob("*.xml")))
                                         .to_dict())
            throughput[style] = {"annotate_seconds": round(seconds, 1), "annotate_docs_per_s": round(len(docs) / seconds, 3),
                                 "annotate_spans_per_s": round(n_spans / seconds, 1),
                                 "extract_seconds": round(extract_seconds[style], 1),
                                 "annotate_over_extract": round(seconds / extract_seconds[style], 2)}
        # the same dictionary coding the gold mentions: the coding part alone
        t0 = time.perf_counter()
        (tmp / "gold-coded").mkdir()
        for file in dev_files:
            normalize_path(linker, file, tmp / "gold-coded" / file.name, fmt="ade-xml")
        normalize_seconds = time.perf_counter() - t0
        gold_coded = _summary(score_paths(dev_files, sorted((tmp / "gold-coded").glob("*.xml"))).to_dict())
    report["tac_dev_ade_eval"] = {
        "dictionary": {"pts": meddra["pts"], "llts": meddra["llts"],
                       "built_from": f"Normalization elements of the {len(train_files)} training-split labels"},
        **{f"end_to_end_{style}": end_to_end[style] for style in STYLES}, "gold_mentions_coded": gold_coded}
    report["throughput"] = {"tac_dev_documents": len(dev_files), **throughput,
                            "normalize_gold_seconds": round(normalize_seconds, 1)}

    # ---- PHEE test, once
    count = int(previous.get("phee_test_evaluations", 0))
    if count and not args.rescore_test:
        report["phee_test"] = previous.get("phee_test")
        report["phee_test_model"] = previous.get("phee_test_model", previous.get("model"))
        print(f"PHEE test already scored {count} time(s): kept (pass --rescore-test to score again)", file=sys.stderr)
    else:
        skipped: list[str] = []
        test = read_phee(args.data / "phee" / "test.zip", skipped)
        t0 = time.perf_counter()
        spans = extractor.extract([d.text for d in test], style="phrases")
        seconds = time.perf_counter() - t0
        scores = phee_scores(effect_strings(test), [[s.text for s in doc if s.label in (AE, BENEFIT)] for doc in spans])
        scores.update(sentences=len(test), skipped_annotations=len(skipped), extract_seconds=round(seconds, 1),
                      sentences_per_s=round(len(test) / seconds, 1))
        report["phee_test"] = scores
        report["phee_test_model"] = extractor.revision
        count += 1
    report["phee_test_evaluations"] = count
    report["cpu_seconds"] = round(cpu_seconds() - cpu0)
    report["wall_seconds"] = round(time.perf_counter() - started)
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    report["command"] = " ".join(["python scripts/extract_eval.py", *sys.argv[1:]])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (args.out / "report.md").write_text(render(report, manifest), encoding="utf-8")
    print(f"wrote {rel(args.out / 'report.md')}", file=sys.stderr)


def _summary(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "per_document"}


def _uc(result: dict) -> tuple:
    m, c = result["use_case_1_mentions_micro_weighted"], result["use_case_2_codes_macro_by_section"]
    return m["precision"], m["recall"], m["f1"], c["precision"], c["recall"], c["f1"], result["quality"]["value"]


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def render(r: dict, manifest: dict) -> str:
    t = manifest["training"]
    phee, tac = r["phee_test"], r["tac_dev_mentions"]
    lines = [
        "# Adverse-event extraction (linker-ae): PHEE test, TAC 2017 development split",
        "",
        f"Model `{r['model']}`, span thresholds per head {r['threshold']} (chosen on PHEE dev and TAC dev). Written by "
        f"`{r['command']}`; data under `{r['data']}`.",
        f"PHEE test evaluations so far: **{r['phee_test_evaluations']}**. CPU time {r['cpu_seconds']:,} s "
        f"(wall {r['wall_seconds']:,} s), load average at the end {r['load_average']} (2 cores, shared).",
        "",
        "## PHEE test: Effect spans",
        "",
        f"Scored once, with `{r['phee_test_model']}`"
        + (" (the same tensors: the release was since rewritten with a new card and manifest, its fp16 weights "
           "re-saved unchanged in value)." if r["phee_test_model"] != r["model"] else "."),
        "",
        "| system | EM_F1 | Token_F1 |",
        "|---|---|---|",
        *[f"| {name} | {em:.2f} | {tok:.2f} |" for name, em, tok in PAPER_ROWS],
        f"| **linker-ae** (this release) | **{phee['EM_F1']:.2f}** | **{phee['Token_F1']:.2f}** |",
        "",
        f"{phee['sentences']:,} sentences, {phee['gold_spans']:,} gold Effect spans, {phee['predicted_spans']:,} "
        f"predicted (EM P/R {phee['EM_precision']}/{phee['EM_recall']}, token P/R {phee['Token_precision']}/"
        f"{phee['Token_recall']}); {phee['skipped_annotations']} annotation(s) skipped as their text does not match "
        "the .txt. `style=\"phrases\"` (PHEE's span convention). Settings differ: the paper scores the arguments of each gold event trigger; linker-ae finds "
        "every Effect span of a sentence (adverse and therapeutic) with no trigger given. EM_F1: SQuAD-normalised "
        "string match per sentence; Token_F1: SQuAD token overlap, micro-summed (`linker/extract/metrics.py`).",
        "",
        f"## TAC 2017 development split ({r['tac_dev_labels']} of the 101 training labels, seeded 20%, held out)",
        "",
        "AdverseReaction mentions (exact: same offsets; a discontinuous gold mention counts as missed since "
        f"linker-ae writes contiguous spans; {tac['discontinuous_gold']} of them. Relaxed: any overlap). `terms`: "
        "the head trained on TAC's convention; `auto` (the default of extract and annotate): the terms, and the "
        "phrase head's spans where no term overlaps them.",
        "",
        "| style | mentions | exact P | exact R | exact F1 | relaxed P | relaxed R | relaxed F1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for style in STYLES:
        for name in ("all", "positive"):
            e, x = tac[style][name]["exact"], tac[style][name]["relaxed"]
            lines.append(f"| {style} | {name} ({e['gold']:,} gold, {e['predicted']:,} predicted) | {e['precision']} | "
                         f"{e['recall']} | {e['f1']} | {x['precision']} | {x['recall']} | {x['f1']} |")
    ade = r["tac_dev_ade_eval"]
    lines += [
        "",
        f"Published, for scale only: {TAC_PUBLISHED}",
        "",
        "### End to end: ADE Eval use cases (`linker.eval.ade_eval`)",
        "",
        f"Closed-world MedDRA-format dictionary: {ade['dictionary']['pts']:,} PTs and {ade['dictionary']['llts']:,} "
        f"LLTs from the {ade['dictionary']['built_from']} (not MedDRA: only the terms TAC's annotators used; codes "
        "that occur only in the dev labels cannot be found). tf-idf index, default settings.",
        "",
        "| run | UC1 P | UC1 R | UC1 F | UC2 P | UC2 R | UC2 F | quality |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, key in (*((f"linker annotate --style {style} (extract + link)", f"end_to_end_{style}") for style in STYLES),
                      ("gold mentions, linked", "gold_mentions_coded")):
        values = _uc(ade[key])
        lines.append(f"| {name} | " + " | ".join(_pct(v) for v in values) + " |")
    th = r["throughput"]
    lines += [
        "",
        "The open default dictionary is not measured here (it holds no MedDRA codes).",
        "",
        "## Throughput (1 torch thread, shared 2-core machine)",
        "",
        *[f"- annotate --style {style} on the {th['tac_dev_documents']} dev labels: {th[style]['annotate_seconds']} s, "
          f"{th[style]['annotate_docs_per_s']} labels/s, {th[style]['annotate_spans_per_s']} spans/s; "
          f"{th[style]['annotate_over_extract']}x the extraction alone ({th[style]['extract_seconds']} s, the same "
          "sections in one call)." for style in STYLES],
        f"- linking the gold mentions alone (normalize): {th['normalize_gold_seconds']} s. The tagger is the cost: "
        "linking a label's spans with tf-idf takes milliseconds, so annotate runs at the speed of extract (a ratio "
        "below 1 is the noise of a shared machine).",
        f"- extract on PHEE test: {phee.get('sentences_per_s')} sentences/s.",
        "",
        "## Training (from the release manifest)",
        "",
        f"`{t['command']}`: {t['windows']:,} windows, {t['wall_seconds']:,} s wall, {t['cpu_seconds']:,} s CPU, "
        f"{t['torch_threads']} thread(s), load average {t['load_average']}; epoch chosen "
        f"{manifest['metrics']['chosen_epoch']}."
        + (f" Decoding (threshold, hysteresis, split per head) then chosen again on the same dev data: "
           f"`{t['tuned']['command']}`." if t.get("tuned") else ""),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
