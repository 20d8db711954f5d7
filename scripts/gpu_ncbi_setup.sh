# Sourced (from the repository root) by scripts/gpu_ncbi_biosyn.sh and scripts/gpu_rerank.sh on a lent GPU machine:
# installs the carried wheels (.whl/) that its python lacks, puts NCBI-disease where every machine's reports name it
# (../shared/data) and unpacks the sap model (.device/sap); sets $py.
py=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
mkdir -p ../shared/data
[ -d ../shared/data/ncbi_disease ] || cp -r .device/ncbi_disease ../shared/data/
[ -d models/ncbi-biosyn-minilm-sap-all ] || $py scripts/model_transfer.py unpack .device/sap models/ncbi-biosyn-minilm-sap-all
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
