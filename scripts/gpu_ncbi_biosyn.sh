#!/usr/bin/env bash
# The GPU half of eval/ncbi_biosyn/ncbi_biosyn_sapall_dev.md: BioSyn's lr, batch size and top-k chosen on NCBI-disease dev,
# then BioSyn on train+dev with the chosen ones, starting from the sap model trained here on every MEDIC pair.
#
#   bash scripts/gpu_ncbi_biosyn.sh OUT
#
# Runs on a GPU machine whose python3 has torch, transformers and sentence-transformers but no network,
# from a copy of this repository that also holds (git-ignored):
#   .whl/                 wheels of what that python lacks (rapidfuzz, sparse-dot-topn) for its version
#   .device/ncbi_disease/ the ncbi_disease folder of ../shared/data
#   .device/sap/          models/ncbi-biosyn-minilm-sap-all, packed by `scripts/model_transfer.py pack`
# and leaves in OUT the grid report, the stage times, the log and the final model packed for the way back
# (`scripts/model_transfer.py unpack OUT/model models/ncbi-biosyn-minilm-sap-all-biosyn-devgrid`). The
# indexes and the test report are then built on any machine by the same ncbi_biosyn.py command without
# --stop-after (Makefile: eval-ncbi-biosyn-dev), which skips the stages done here.
set -euo pipefail
out=${1:?usage: gpu_ncbi_biosyn.sh OUT}
mkdir -p "$out"
source "$(dirname "$0")/gpu_ncbi_setup.sh"  # wheels, ../shared/data/ncbi_disease, the sap model; sets $py
$py scripts/ncbi_biosyn.py --sap-pairs all --epochs "${EPOCHS:-10}" --report-name ncbi_biosyn_sapall_dev \
  --work indexes/ncbi_biosyn_sapall --out "$out" \
  --grid "${GRID:-topk=20,40 batch=16,32 lr=1e-5,2e-5,5e-5}" --grid-workers "${WORKERS:-4}" \
  --grid-seconds "${GRID_SECONDS:-200}" --biosyn-max-seconds "${FINAL_SECONDS:-240}" \
  --stop-after biosyn --threads "${THREADS:-16}" 2>&1 | tee "$out/log.txt"
$py scripts/model_transfer.py pack models/ncbi-biosyn-minilm-sap-all-biosyn-devgrid "$out/model" --shard-mb 15.5
ls -la "$out" "$out/model"
