"""A sweep of tagger trainings, read back from their release folders: eval/extract/sweep.md and sweep.json.

    python -m bench.extract_sweep RELEASE [RELEASE ...] [--out eval/extract]

Each RELEASE is a folder `linker train extractor` wrote (its manifest.json holds the command, where it ran and every
epoch's dev scores). The report groups the runs by their settings but the seed, and gives each group's spread over
seeds: the chosen epoch's choice score (the mean of PHEE dev Effect EM_F1 and TAC 2017 dev AdverseReaction exact
F1, as training chooses) and its two parts, then every epoch's mean, so a choice of settings and of epochs reads off
development data alone. No test set is read.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from bench.report import Report, table

SETTINGS = ("base", "lr", "epochs", "batch_size", "frozen_layers", "tac_negative_share")  # what a group shares


def read_run(folder: Path) -> dict:
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    training, history = manifest["training"], manifest["history"]
    best = max(history, key=lambda h: h["choice"])  # as `_choose_epoch` keeps it (ties: the first)
    return {"run": folder.name, "config": {k: training["config"][k] for k in (*SETTINGS, "seed")},
            "command": training["command"], "device": training.get("device", "CPU"),
            "wall_seconds": training["wall_seconds"], "chosen_epoch": best["epoch"],
            "epochs": [{"epoch": h["epoch"], "choice": h["choice"], "phee_dev_em_f1": h["phee_dev"]["EM_F1"],
                        "tac_dev_exact_f1": h["tac_dev"]["exact"]["f1"]} for h in history]}


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f} ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else f"{mean:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("eval/extract"))
    args = parser.parse_args(argv)
    report = Report("sweep", out=args.out, title="linker-ae training sweep: development scores by settings and seed")
    runs = [read_run(folder) for folder in args.releases]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        groups[tuple(run["config"][k] for k in SETTINGS)].append(run)

    def chosen(run: dict, key: str) -> float:
        return next(e[key] for e in run["epochs"] if e["epoch"] == run["chosen_epoch"])

    summary = []
    for key, members in sorted(groups.items(), key=lambda kv: -statistics.fmean(chosen(r, "choice") for r in kv[1])):
        summary.append([*key, len(members), spread([chosen(r, "choice") for r in members]),
                        spread([chosen(r, "phee_dev_em_f1") for r in members]),
                        spread([chosen(r, "tac_dev_exact_f1") for r in members]),
                        ", ".join(str(r["chosen_epoch"]) for r in members)])
    lines = [f"{len(runs)} runs of `linker train extractor`, read from their release folders' manifests. Each keeps "
             "the epoch with the best choice score on the development data (PHEE dev and the TAC 2017 dev split); "
             "cells give the mean over seeds and, in brackets, the lowest and highest run. Wall times include each "
             "epoch's dev scoring (on the CPU); runs that ran at once on one machine shared it.", "",
             *table([*SETTINGS, "seeds", "choice", "PHEE dev EM_F1", "TAC dev exact F1", "chosen epochs"], summary), "",
             "## Every epoch (mean choice score over the seeds of each group)", ""]
    longest = max(len(r["epochs"]) for r in runs)
    rows = []
    for key, members in groups.items():
        cells = []
        for epoch in range(1, longest + 1):
            values = [e["choice"] for r in members for e in r["epochs"] if e["epoch"] == epoch]
            cells.append(f"{statistics.fmean(values):.2f}" if values else "")
        rows.append([f"lr {key[1]}, {key[2]} epochs", *cells])
    lines += table(["settings", *map(str, range(1, longest + 1))], rows, "l" + "r" * longest)
    lines += ["", "## Runs", "", *table(["run", "seed", "device", "wall s", "command"],
                                        [[r["run"], r["config"]["seed"], r["device"], r["wall_seconds"],
                                          f"`{r['command']}`"] for r in runs])]
    report.write({"runs": runs}, lines)


if __name__ == "__main__":
    main()
