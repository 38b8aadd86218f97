#!/usr/bin/env bash
# H200 run of the nvfp4 branch (issue 24: marlin_nvfp4's fused layer against a device copy), from the
# repository root of the device tool's checkout (carry [".gpu", ".whl", ".wt-nvfp4", ".base-nvfp4"];
# .base-nvfp4 = `git archive 064a815 layoutc specs benchmarks`, .wt-nvfp4 = this branch):
#   bash .wt-nvfp4/benchmarks/nvfp4_run.sh
# benchmarks/before_after.py: old and new converters in one process, in alternation, single calls and 10
# back to back against a device copy of the same bytes; same bytes and fused == eager checked. The spec the
# branch changes (marlin_nvfp4), the one with the same weight kernel (marlin_mxfp4) and a control
# (flashinfer_cutlass_mxfp4_padded). Then benchmarks/kernel_split.py on both trees: each block alone, and the
# layer kernel at 2 and 8 warps (SPLIT_TREES=". ../.base-nvfp4" profiles the old tree too).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
cd .wt-nvfp4
timeout "${T_BA:-110}" python3 benchmarks/before_after.py --old ../.base-nvfp4 --new . --rounds "${ROUNDS:-2}" \
  --variants marlin_nvfp4,marlin_mxfp4,flashinfer_cutlass_mxfp4_padded \
  --dims "E=128,I=2944,H=2944;E=32,I=2944,H=2944" --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
echo "before_after: exit $?"
for tree in ${SPLIT_TREES:-.}; do
  name=$([ "$tree" = . ] && echo after || echo before)
  timeout "${T_SPLIT:-30}" python3 benchmarks/kernel_split.py --tree "$tree" --dims E=128,I=2944,H=2944 --warps 2,8 \
    --specs marlin_nvfp4 --out "$OUT/split_$name.jsonl" > "$OUT/split_$name.log" 2>&1
  echo "kernel_split $name: exit $?"
done
python3 benchmarks/kspeed_summary.py "$OUT/ba.jsonl" | tee "$OUT/summary.txt"
grep -h "==\|layer kernel\|scale" "$OUT"/split_*.log
