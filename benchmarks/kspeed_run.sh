#!/usr/bin/env bash
# H200 run of the kspeed branch (issues 24/25: trtllm_mxfp4, aiter_mxfp4, marlin_nvfp4 against their
# targets), from the repository root of the device tool's checkout (carry [".gpu", ".whl", ".wt-kspeed",
# ".base-kspeed"]; .base-kspeed = `git archive 9910c82 layoutc specs benchmarks`, .wt-kspeed = this branch):
#   bash .wt-kspeed/benchmarks/kspeed_run.sh
# benchmarks/before_after.py: old (9910c82) and new converters in one process, in alternation, single calls
# and 10 back to back against a device copy of the same bytes; same bytes and fused == eager checked. The
# specs the branch changes (trtllm_mxfp4 both pad_to, aiter_mxfp4, triton_kernels_mxfp4_hopper,
# marlin_gptq_int4) and two it does not (cutlass_mxfp4_padded, marlin_nvfp4). Then
# benchmarks/kernel_split.py: each tensor's block alone, after, and the Marlin layer kernels at other warps.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
cd .wt-kspeed
specs=flashinfer_trtllm_mxfp4,aiter_mxfp4,marlin_nvfp4,triton_kernels_mxfp4_hopper,marlin_gptq_int4
specs=$specs,flashinfer_cutlass_mxfp4_padded
timeout "${T_BA:-240}" python3 benchmarks/before_after.py --old ../.base-kspeed --new . --rounds 3 --variants "$specs" \
  --dims "E=128,I=2944,H=2944;E=32,I=2944,H=2944" --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
echo "before_after: exit $?"
timeout "${T_SPLIT:-90}" python3 benchmarks/kernel_split.py --dims E=128,I=2944,H=2944 --warps 2,8 \
  --specs flashinfer_trtllm_mxfp4,aiter_mxfp4,marlin_nvfp4,marlin_mxfp4 --out "$OUT/split_after.jsonl" \
  > "$OUT/split_after.log" 2>&1
echo "kernel_split: exit $?"
python3 benchmarks/kspeed_summary.py "$OUT/ba.jsonl" | tee "$OUT/summary.txt"
grep "==\|layer kernel" "$OUT/split_after.log"
