"""NCBI-disease test mentions whose dense Acc@1 is decided by a tie between concepts, not by the model.

    .venv/bin/python scripts/ncbi_dense_ties.py [--work indexes/ncbi_biosyn] [--encoder minilm]
        [--index indexes/ncbi_biosyn/dense_base --index indexes/ncbi_biosyn/dense_base_fp32]

The test dictionary of scripts/ncbi_biosyn.py (MEDIC + the train/dev mentions as names) holds names of
several concepts that the encoder reads as the same token ids (uncased WordPiece: "Cystic fibrosis"
and "cystic fibrosis"). A test mention with those token ids (BioSyn's query preprocessing) gets a
cosine of ~1 with all of them, equal up to float rounding (batch padding, bf16 or fp32, the CPU's
kernels), so which concept comes first is decided by rounding and row order: the *tie pool*. For
each --index (dense indexes of that dictionary and encoder) the script scores Acc@1 under BioSyn's
rule ("any") inside and outside the pool from its own linking, and counts the mentions on which the
indexes disagree. Writes eval/ncbi_ties/ncbi_dense_ties.md|json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from linker.dictionary import alternative_ids, read_concept_table
from linker.encoders import load_encoder
from linker.eval.datasets import load_dataset
from linker.eval.filters import Normaliser, ReferenceSet, filter_indices
from linker.eval.metrics import mention_hits
from linker.eval.report import gold_matcher, predict
from linker.fileio import atomic_file, portable_paths
from linker.link import Linker
from linker.text import code_key

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "indexes" / "ncbi_biosyn")
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--index", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "ncbi_ties")
    args = parser.parse_args()
    ncbi = args.data / "ncbi_disease"
    prep = f"#biosyn&typos={ncbi / 'ncbi-spell-check.txt'}"
    test = load_dataset(f"pubtator:{ncbi / 'NCBItestset_corpus.txt'}{prep}")
    train = [m.text for name in ("NCBItrainset_corpus.txt", "NCBIdevelopset_corpus.txt")
             for m in load_dataset(f"pubtator:{ncbi / name}{prep}")]
    dictionary = args.work / "medic_train_dev.parquet"
    table = read_concept_table(dictionary).table
    tokenizer = load_encoder(args.encoder).model.tokenizer

    def token_ids(texts: list[str]) -> list[tuple[int, ...]]:
        return [tuple(t) for t in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    concepts_of = defaultdict(set)  # token ids -> concepts with a name of exactly those tokens
    for cid, ids in zip(table.column("concept_id").to_pylist(), token_ids(table.column("name").to_pylist())):
        concepts_of[ids].add(code_key(cid))
    alternatives = alternative_ids(table)
    pool, mixed = [], []
    for i, (m, ids) in enumerate(zip(test, token_ids([m.text for m in test]))):
        concepts = concepts_of.get(ids, set())
        if len(m.gold) != 1 or len(concepts) < 2:
            continue
        pool.append(i)
        gold = {code_key(g) for g in m.gold[0]}
        gold |= {code_key(a) for g in list(gold) for a in alternatives.get(g, ())}
        if concepts & gold and concepts - gold:
            mixed.append(i)
    hard = filter_indices([m.text for m in test], "train0.2", references={"train": ReferenceSet(train, Normaliser())})
    result = {
        "command": " ".join(["python", "scripts/ncbi_dense_ties.py", *sys.argv[1:]]),
        "dictionary": str(dictionary), "names": table.num_rows, "encoder": args.encoder, "test_mentions": len(test),
        "pool": len(pool), "pool_gold_and_wrong": len(mixed), "pool_in_filtered02": len(set(pool) & set(hard)),
        "filtered02": len(hard), "indexes": [],
    }
    hits = []
    inside = set(pool)
    for folder in args.index:
        linker_ = Linker.load(folder)
        ranked = predict(linker_, test, 1, query_lang=False, progress=False)
        expand, _ = gold_matcher(linker_)
        right = mention_hits([m.gold for m in test], [tuple(r.ids for r in q) for q in ranked], 1, composite="any",
                             expand=expand)
        hits.append(right)
        precision = linker_.manifest.get("dense", {}).get("precision", {}).get("chosen")
        result["indexes"].append({"index": str(folder), "precision": precision, "acc1": round(100 * float(right.mean()), 2),
                                  "pool_right": int(right[pool].sum()),
                                  "outside_right": int(sum(right[i] for i in range(len(test)) if i not in inside))})
    if len(hits) >= 2:
        differ = [i for i in range(len(test)) if len({bool(h[i]) for h in hits}) > 1]
        result["disagree"] = len(differ)
        result["disagree_in_pool"] = sum(i in inside for i in differ)
    with atomic_file(args.out / "ncbi_dense_ties.json") as tmp:
        tmp.write_text(portable_paths(json.dumps(result, indent=2), root=ROOT, data=args.data))
    with atomic_file(args.out / "ncbi_dense_ties.md") as tmp:
        tmp.write_text(portable_paths(markdown(result), root=ROOT, data=args.data))
    print(markdown(result))


def markdown(r: dict) -> str:
    lines = [
        "# NCBI-disease: test mentions whose dense Acc@1 a tie decides",
        "",
        f"Produced by `{r['command']}`. Dictionary `{r['dictionary']}` ({r['names']:,} names), encoder "
        f"{r['encoder']}'s tokenizer; {r['test_mentions']} test mentions (BioSyn's preprocessing).",
        "",
        f"- Tie pool: {r['pool']} single-concept test mentions have the token ids of dictionary names of two or more "
        f"concepts; for {r['pool_gold_and_wrong']} of them those concepts include a gold one (or its xref) and a "
        "wrong one, so their Acc@1 is decided by float rounding and row order among vectors of equal cosine.",
        f"- None of the Filtered0.2 (train) mentions is in the pool: {r['pool_in_filtered02']} of {r['filtered02']}.",
        "",
    ]
    if r["indexes"]:
        lines += ["| index | names encoded in | Acc@1 (BioSyn rule) | right in the pool | right outside it |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{x['index']}` | {x['precision']} | {x['acc1']:.2f} | {x['pool_right']} / {r['pool']} | "
                  f"{x['outside_right']} / {r['test_mentions'] - r['pool']} |" for x in r["indexes"]]
    if "disagree" in r:
        lines += ["", f"The indexes disagree on {r['disagree']} mentions, {r['disagree_in_pool']} of them in the pool."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
