#!/usr/bin/env bash
# One GPU session (device tool): install the carried FlashInfer bundle and wheels, record the
# goldens with FlashInfer's real CUDA kernels, then check layoutc's converters on CUDA.
#   run with: carry=[".gpu", ".whl"], command: bash tools/gpu/run.sh
set -uo pipefail
source .gpu/setup.sh
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD LAYOUTC_EXT_DIR=/tmp/layoutc_ext
mkdir -p "$LAYOUTC_EXT_DIR" "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)" | tee -a "$OUT/gpu.txt"
time python3 tools/gpu/record_goldens.py "$OUT" 2>&1 | tee "$OUT/record.log"
python3 tools/gpu/parity.py "${PARITY_GOLDENS:-$OUT}" 2>&1 | tee "$OUT/parity.log"
