"""How many NCBI-disease dev mentions a tie between equally scored concepts decides, and what a training prior
would do there (a diagnostic for the next step, nothing in the library changes).

    .venv/bin/python scripts/ncbi_tie_prior.py [--index indexes/rr/ncbi-sapinit_tfidf_rerank] [--data ../shared/data]
        [--out eval]

MEDIC gives one name to several concepts ("aniridia": MeSH D015783 and supplementary concept C536372; "sjs": a
synonym of D010009 and of MEDIC's own OMIM:255800), so a mention that is such a name ties them,
score for score, and the Linker's rule (score desc, then concept_id) decides. The prior tried here: among concepts
tied at the top score, the one gold most often in the *train* split's annotations first (then the Linker's order).
Measured on the dev split only, for the index's retriever alone and with its bound re-ranker (the mix its
calibration chose), with the evaluation's rules (BioSyn's ``any`` for composites, MEDIC's OMIM xrefs).
Needs the index of `scripts/rerank_confidence.py --datasets ncbi-sapinit` (MEDIC + train mentions, re-ranker bound).
Writes eval/ncbi_ties/ncbi_tie_prior.{md,json}.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from linker.eval.datasets import load_dataset
from linker.eval.metrics import mention_hits
from linker.eval.report import gold_matcher
from linker.fileio import atomic_file, portable_paths
from linker.link import Linker
from linker.text import code_key


def with_prior(candidates, prior: collections.Counter) -> list[str]:
    """Concept ids in the Linker's order, except that concepts tied with the first (equal final score) are
    re-ordered by train-annotation count, most first (a stable sort keeps the Linker's order among equal counts)."""
    ids = [c.concept_id for c in candidates]
    if len(candidates) < 2:
        return ids
    top = candidates[0].score
    tied = sum(1 for c in candidates if abs(c.score - top) <= 1e-6 * max(1.0, abs(top)))
    head = sorted(ids[:tied], key=lambda cid: -prior[code_key(cid)])
    return head + ids[tied:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=ROOT / "indexes" / "rr" / "ncbi-sapinit_tfidf_rerank")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "ncbi_ties")
    args = parser.parse_args()
    ncbi = args.data / "ncbi_disease"
    prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
    train = load_dataset(f"pubtator:{ncbi / 'NCBItrainset_corpus.txt'}{prep}")
    prior = collections.Counter(code_key(g) for m in train for part in m.gold for g in part)
    dev_spec = f"pubtator:{ncbi / 'NCBIdevelopset_corpus.txt'}{prep}"
    dev = load_dataset(dev_spec)
    gold = [m.gold for m in dev]
    rows = []
    for system, rerank in (("retriever (tf-idf)", "none"), ("retriever + re-ranker (calibrated mix)", None)):
        linker_ = Linker.load(args.index, rerank=rerank, rerank_k=16)
        expand, _known = gold_matcher(linker_)
        texts = list(dict.fromkeys(q for m in dev for q in m.queries))
        found = dict(zip(texts, linker_.link(texts, k=16)))
        as_linked = [tuple(tuple(c.concept_id for c in found[q].candidates) for q in m.queries) for m in dev]
        prior_first = [tuple(tuple(with_prior(found[q].candidates, prior)) for q in m.queries) for m in dev]
        tied_top = sum(any(len(r.candidates) > 1 and abs(r.candidates[1].score - r.candidates[0].score) <= 1e-6
                           for r in (found[q] for q in m.queries)) for m in dev)
        before = mention_hits(gold, as_linked, 1, composite="any", expand=expand)
        after = mention_hits(gold, prior_first, 1, composite="any", expand=expand)
        rows.append({"system": system, "mentions": len(dev), "top_tied": int(tied_top),
                     "acc1": float(before.mean()), "acc1_prior": float(after.mean()),
                     "fixed": int((after & ~before).sum()), "broken": int((before & ~after).sum())})
    summary = {"command": " ".join(["python", "scripts/ncbi_tie_prior.py", *sys.argv[1:]]),
               "index": str(args.index), "dataset": dev_spec, "prior_from": "NCBItrainset_corpus.txt gold ids",
               "prior_concepts": len(prior), "rows": rows}
    lines = ["# NCBI-disease dev: mentions a tie decides, and a train-annotation prior", "",
             f"Produced by `{summary['command']}` (index `{summary['index']}`, MEDIC + train mentions; dev "
             f"`{dev_spec}`). The prior counts the gold concepts of the train split's annotations ({len(prior):,} "
             "concepts); it only re-orders concepts tied with the top score, most annotated first. Dev only: no "
             "test mention was looked at.", "",
             "| system | dev mentions | top score tied | Acc@1 as linked | Acc@1 with the prior | fixed | broken |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['mentions']:,} | {r['top_tied']:,} | {100 * r['acc1']:.2f} | "
                     f"{100 * r['acc1_prior']:.2f} | {r['fixed']} | {r['broken']} |")
    lines.append("")
    for path, text in ((args.out / "ncbi_tie_prior.json", json.dumps(summary, indent=2)),
                       (args.out / "ncbi_tie_prior.md", "\n".join(lines))):
        with atomic_file(path) as tmp:
            tmp.write_text(portable_paths(text, root=ROOT, data=args.data), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
