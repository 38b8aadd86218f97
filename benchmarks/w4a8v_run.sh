#!/usr/bin/env bash
# vllm_cutlass_w4a8's fused converter on one H200 (device tool, kind nvidia-h200), from the main checkout's root
# with this worktree copied to .wt-w4a8v and carry [".whl", ".wt-w4a8v", ".emitted-w4a8v"]. `.emitted-w4a8v`:
# the old and new converters emitted on the CPU machine (no compile in device time):
#   python benchmarks/before_after.py --old <git archive of the base> --new . --variants vllm_cutlass_w4a8 \
#     --emit-only .emitted-w4a8v
# Steps: WALKS=1: benchmarks/w4a8_walks.py (the weight reorder's access patterns, each alone); then old and new
# in alternation (single, 10 back to back, out=) against a device copy; then kernel_split on the new tree.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
if [[ "${WALKS:-0}" == 1 ]]; then
  (cd .wt-w4a8v && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/w4a8_walks.py --out "$OUT/walks.jsonl" \
    2>&1 | tee "$OUT/walks.log")
fi
timeout 200 python3 .wt-w4a8v/benchmarks/before_after.py --emitted .emitted-w4a8v --new .wt-w4a8v --rounds 2 \
  --out-arg --variants vllm_cutlass_w4a8 --out "$OUT/ba.jsonl" 2>&1 | tee "$OUT/ba.log"; echo "ba exit $?"
cd .wt-w4a8v
PYTHONPATH=/tmp/site:$PWD timeout 100 python3 benchmarks/kernel_split.py --specs vllm_cutlass_w4a8 \
  --dims "E=128,I=768,H=2048;E=256,I=2048,H=7168" --warps 8 --out "$OUT/split.jsonl" 2>&1 | tee "$OUT/split.log"
