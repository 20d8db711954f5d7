#!/usr/bin/env bash
# The GPU half of issue 14's full-size NCBI-disease re-rankers: the recipes of rerank_confidence.py's
# ncbi-sapinit-q6k, ncbi-sapinit-qall and ncbi-sapinit-q6k-mined (sap-initialised MiniLM cross-encoders, 10 to 40
# min each on 2 cores) trained at once and compared on the dev split only (--heldin-only); the best by dev comes back packed.
#
#   bash scripts/gpu_rerank.sh OUT
#
# Runs on a GPU machine whose python3 has torch, transformers and sentence-transformers but no network, from a copy
# of this repository that also holds (git-ignored):
#   .whl/                   wheels of what that python lacks (rapidfuzz, sparse-dot-topn) for its version
#   .device/ncbi_disease/   the ncbi_disease folder of ../shared/data
#   .device/sap/            models/ncbi-biosyn-minilm-sap-all, packed by `scripts/model_transfer.py pack` (fp16, no
#                           --base: the whole model travels, so the start is that model's fp16 rounding)
# Leaves in OUT: chosen/ (the dev-chosen re-ranker, packed: `scripts/model_transfer.py unpack OUT/chosen
# models/rr-NAME-minilm`, NAME in OUT/chosen.txt) and meta.tgz (each recipe's rerank_confidence.json and log). Back
# on the scoring machine, `python scripts/rerank_confidence.py --datasets "" --import-heldin
# META/ncbi-sapinit-*/rerank_confidence.json` adds the dev comparison made here; a recipe that beats the chosen one
# on dev is then scored on test by `--datasets NAME` there, which finds it trained and trains nothing.
set -euo pipefail
out=${1:?usage: gpu_rerank.sh OUT}
mkdir -p "$out"
source "$(dirname "$0")/gpu_ncbi_setup.sh"  # wheels, ../shared/data/ncbi_disease, the sap model; sets $py
recipes=${RECIPES:-ncbi-sapinit-q6k ncbi-sapinit-qall ncbi-sapinit-q6k-mined}
# the dictionaries first, once: the recipes' processes would otherwise write the same parquet files at once
$py -c "import sys; sys.path.insert(0, 'scripts'); from pathlib import Path; from rerank_confidence import datasets
datasets(Path('../shared/data').resolve(), Path('indexes/rr').resolve(), False)['ncbi']['dicts']()"
# each recipe's summary under the repository, so its recorded command names a portable --out
runs=indexes/gpu_rerank
mkdir -p "$runs"
for recipe in $recipes; do  # one process each: the GPU is far from busy with one MiniLM, the CPUs tokenise
  timeout "${RECIPE_SECONDS:-450}" $py scripts/rerank_confidence.py --datasets "$recipe" --systems reranked \
    --rerank-k 16 --threads "${THREADS:-5}" --train-seconds "${TRAIN_SECONDS:-300}" --checkpoint-every 1000 \
    --heldin-only --out "$runs/$recipe" >"$runs/$recipe.log" 2>&1 &
done
wait || true  # a recipe that failed or ran out of time is left out of the choice below; its log says why
for recipe in $recipes; do tail -2 "$runs/$recipe.log"; done
# the recipe whose chosen mix scored best on dev (the first listed on a tie)
best=$($py - "$runs" $recipes <<'EOF'
import json, sys
from pathlib import Path
out, recipes = Path(sys.argv[1]), sys.argv[2:]
scores = {}
for recipe in recipes:
    path = out / recipe / "rerank_confidence.json"
    if path.exists():
        mixing = json.loads(path.read_text())["heldin_only"][recipe]["systems"]["reranked"]["calibration_fit"]["mixing"]
        by_weight = {float(w): a for w, a in mixing["accuracy_at_1_by_weight"].items()}  # JSON keys are strings
        scores[recipe] = by_weight[float(mixing["retriever_weight"])]
print(scores, file=sys.stderr)
print(max(scores, key=lambda r: (scores[r], -recipes.index(r))))
EOF
)
echo "$best" >"$out/chosen.txt"
$py scripts/model_transfer.py pack "models/rr-$best-minilm" "$out/chosen" --shard-mb 15.5
# every small file in one tar (the tool returns at most 8 files)
tar -czf "$out/meta.tgz" -C "$runs" .
find "$out" -type f | xargs ls -la
