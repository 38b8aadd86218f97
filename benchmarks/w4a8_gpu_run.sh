#!/usr/bin/env bash
# vllm_cutlass_w4a8 on one H200 (device tool): rsync this worktree to <main>/.wt-w4a8; kind nvidia-h200,
# carry [".whl", ".wt-w4a8"], command: bash .wt-w4a8/benchmarks/w4a8_gpu_run.sh .wt-w4a8
# Results: $OUT/w4a8.jsonl, $OUT/w4a8.log, $OUT/gpu.txt.
set -uo pipefail
tree=${1:?the carried worktree folder}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/$tree PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
  | tee -a "$OUT/gpu.txt"
cd "$tree" && timeout "${T:-240}" python3 benchmarks/w4a8_gpu.py --out "$OUT/w4a8.jsonl" --rounds "${ROUNDS:-3}" \
  2>&1 | tee "$OUT/w4a8.log"
echo "exit ${PIPESTATUS[0]}"
