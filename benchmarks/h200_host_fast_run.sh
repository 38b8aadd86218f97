#!/usr/bin/env bash
# Issue 25, host time per warm call (the one-lookup warm path), before and after in one process, on the H200,
# from the repository root (device tool, carry [".gpu", ".whl", ".wt-host", ".base-host"]; .base-host =
# `git archive 9910c82 layoutc specs benchmarks`, the tree before; .wt-host = this branch):
#   bash .wt-host/benchmarks/h200_host_fast_run.sh
# 1. host time of a warm call, the 12 FlashInfer lines, tiny layer (E=2, I=H=256): old, new, old out=, new out=
#    (and the default fingerprinted call) in alternation in one process (before_after.py --host --out-arg);
# 2. single calls and 10 back to back at the gpt-oss-20b and -120b layers, old / new / old out= / new out=
#    against a device copy in each round (before_after.py --out-arg); same bytes, fused == eager, out= == new;
# 3. the step-by-step breakdown of flashinfer_cutlass_bf16's warm call (host_time.py --only cutlass_bf16).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
nproc >> "$OUT/gpu.txt"
B=.wt-host/benchmarks
timeout "${T_HOST:-100}" python3 $B/before_after.py --old .base-host --new .wt-host --rounds "${R_HOST:-3}" --out-arg \
  --host --dims E=2,I=256,H=256 --out "$OUT/ba_host.jsonl" > "$OUT/ba_host.log" 2>&1; echo "host: exit $?"
timeout "${T_BREAK:-45}" env HOST_TIME_ROOT=.wt-host python3 $B/host_time.py --reps 200 --shapes tiny \
  --only cutlass_bf16 --out "$OUT/host_breakdown.json" > "$OUT/host_breakdown.log" 2>&1; echo "breakdown: exit $?"
grep "  host \|CUDA graph\|worst\|runner\|warm call" "$OUT/host_breakdown.log"
timeout "${T_SINGLE:-200}" python3 $B/before_after.py --old .base-host --new .wt-host --rounds "${R_SINGLE:-3}" \
  --out-arg --dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944" --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
echo "single: exit $?"
python3 $B/host_fast_summary.py "$OUT" 2>&1 | tee "$OUT/summary.txt"
