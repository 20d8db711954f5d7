"""Cross-encoder re-rankers behind the dense linker-en index, on the lay development slice only.

    python -m bench.rerank_lay --index INDEX --reranker LABEL=FOLDER [--reranker ...] [--k 32]
        [--trained LABEL='command'] [--out eval/rerank/lay_dev]

INDEX: a dense linker-en index over the default dictionary less every held-out lay name (the test and development
slices: `linker dict build --source default --exclude-names linker/data/lay/heldout_names.tsv --exclude-names
linker/data/lay/dev_names.tsv`). For each re-ranker: Acc@1 of the retriever alone, and of its top k re-ordered by
logit + w x retriever score for each mix weight w (as `linker calibrate` mixes them), at k = 4, 8,
16 and --k. The lay test set is never read: this is where a re-ranker is chosen, or not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
from pathlib import Path

import time

import numpy as np

from bench.report import load
from linker.rerank import CrossEncoder

ROOT = Path(__file__).resolve().parents[1]
MIX_WEIGHTS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # the weight of the retriever's score (`retriever_weight`)


def _dev_candidates(index: Path, k: int):
    """The lay development phrases, and the dense retriever's top `k` for each (`linker.link.Linker`)."""
    from linker.datasets import load_dataset
    from linker.link import Linker
    from linker.sources.default import LAY_DEV

    mentions = load_dataset(f"lay:{LAY_DEV}")
    return mentions, Linker.load(index).link([m.text for m in mentions], k=k)


def dev_rerank_accuracy(index: Path, reranker, k: int, *, ks: tuple[int, ...] = ()) -> dict:
    """Acc@1 on the lay development slice: the retriever alone, and its top `k` re-ordered by
    logit + w x retriever score for each w of `MIX_WEIGHTS`; the share whose gold is in the top `k` bounds both.
    `ks`: the same for the top few of those `k` (each pair is scored once), under ``by_k``."""
    mentions, results = _dev_candidates(index, k)
    pairs = [(m.text, c.matched_name) for m, r in zip(mentions, results) for c in r.candidates]
    started = time.perf_counter()
    logits = reranker.score([p[0] for p in pairs], [p[1] for p in pairs])
    seconds = time.perf_counter() - started
    right = [np.array([c.concept_id in set(m.gold[0]) for c in r.candidates], dtype=bool)
             for m, r in zip(mentions, results)]
    retriever = [np.array([c.retriever_score for c in r.candidates], dtype=np.float32) for r in results]
    per = np.split(logits, np.cumsum([len(x) for x in right])[:-1])

    def by_weight(top: int) -> dict:
        out = {}
        for w in MIX_WEIGHTS:  # a phrase without candidates is a miss
            hits = [bool(x[:top][np.argmax(s[:top] + np.float32(w) * q[:top])]) if len(x) else False
                    for x, s, q in zip(right, per, retriever)]
            out[str(w)] = round(100 * float(np.mean(hits)), 2)
        return out

    return {"phrases": len(mentions), "rerank_k": k,
            "retriever_acc1": round(100 * float(np.mean([bool(x[0]) if len(x) else False for x in right])), 2),
            f"retriever_acc{k}": round(100 * float(np.mean([bool(x.any()) for x in right])), 2),
            "reranked_acc1_by_mix_weight": by_weight(k),
            "by_k": {str(top): {"retriever_acc": round(100 * float(np.mean([bool(x[:top].any()) for x in right])), 2),
                                "reranked_acc1_by_mix_weight": by_weight(top)} for top in ks if top < k},
            "rerank_ms_per_phrase": round(1000 * seconds / len(mentions), 1)}


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for value in values or ():
        label, sep, rest = value.partition("=")
        if not sep or not label or not rest:
            raise SystemExit(f"{option}: expected LABEL=VALUE, found {value!r}")
        out[label] = rest
    return out


def markdown(r: dict) -> str:
    lines = ["# Re-rankers behind the dense linker-en index: the lay development slice", "",
             f"Produced by `{r['command']}` on {r['date']} ({r['machine']['cpus']} CPUs, load average "
             f"{r['machine']['load_average_before']} before, {r['machine']['load_average_after']} after). "
             f"Index `{r['index']}`: the default dictionary less every held-out lay name. "
             f"{r['phrases']} development phrases (`linker/data/lay/lay_dev.tsv`); the test set is not read.", "",
             "Each cell: Acc@1 of the retriever's top k re-ordered by re-ranker logit + w x retriever score. "
             "w = 0 is the re-ranker alone; the retriever alone is the first column.", "",
             *([r["note"], ""] if r.get("note") else [])]
    for label, row in r["rerankers"].items():
        lines += [f"## {label}", "", f"Folder `{row['folder']}`" + (f"; trained by `{row['trained']}`" if row.get("trained")
                                                                     else "") + f"; {row['rerank_ms_per_phrase']} ms a "
                  f"phrase to score its top {row['rerank_k']} (2 threads).", "",
                  "| k | gold in top k | retriever Acc@1 | " + " | ".join(f"w = {w:g}" for w in MIX_WEIGHTS) + " |",
                  "|---:|---:|---:|" + "---:|" * len(MIX_WEIGHTS)]
        tables = {**row["by_k"], str(row["rerank_k"]): {"retriever_acc": row[f"retriever_acc{row['rerank_k']}"],
                                                        "reranked_acc1_by_mix_weight": row["reranked_acc1_by_mix_weight"]}}
        for k, t in tables.items():
            lines.append(f"| {k} | {t['retriever_acc']:.2f} | {row['retriever_acc1']:.2f} | "
                         + " | ".join(f"{v:.2f}" for v in t["reranked_acc1_by_mix_weight"].values()) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--reranker", action="append", required=True, metavar="LABEL=FOLDER")
    parser.add_argument("--trained", action="append", metavar="LABEL=COMMAND", help="how LABEL was trained")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--note", default="", help="how the folders the commands name were made (a paragraph)")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "rerank" / "lay_dev")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rerankers, trained = _pairs(args.reranker, "--reranker"), _pairs(args.trained, "--trained")
    before = load()
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python -m bench.rerank_lay " + " ".join(
                  [f"--index {args.index}", *(f"--reranker {v}" for v in args.reranker), f"--k {args.k}"]),
              "index": str(args.index), "note": args.note, "rerankers": {}}
    for label, folder in rerankers.items():
        row = dev_rerank_accuracy(args.index, CrossEncoder.load(folder), args.k, ks=(4, 8, 16))
        report["phrases"] = row.pop("phrases")
        report["rerankers"][label] = {"folder": folder, "trained": trained.get(label), **row}
    report["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_before": before,
                         "load_average_after": load()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
