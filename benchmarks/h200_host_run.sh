#!/usr/bin/env bash
# Issue 25 (CUDA part), 2026-12-02, from the repository root of the main checkout with this tree copied to
# .wt-t25g (device tool, carry [".whl", ".wt-t25g"]):
#   bash .wt-t25g/benchmarks/h200_host_run.sh explore  # host time of the new tree, step by step; CUDA graph check
#   bash .wt-t25g/benchmarks/h200_host_run.sh host     # host time before/after in one process (E=2, I=H=256)
#   bash .wt-t25g/benchmarks/h200_host_run.sh final    # host time before/after (FlashInfer specs, tiny layer),
#                                                     # then the same specs before/after at gpt-oss-20b and -120b
# "Before" is the main checkout the device tool sends; "after" is .wt-t25g. Results under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
BEFORE=$PWD
cd .wt-t25g || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
nproc >> "$OUT/gpu.txt"
case "${1:-explore}" in
explore)
  timeout 150 python3 benchmarks/host_time.py --reps 200 --shapes tiny --only cutlass_bf16,trtllm_bf16,cutlass_nvfp4 \
    --out "$OUT/host_explore.json" > "$OUT/host_explore.log" 2>&1; echo "host_time: exit $?"
  cat "$OUT/host_explore.log"
  ;;
final)
  HOST_TIME_ROOT=$BEFORE timeout 60 python3 benchmarks/host_time.py --reps 100 --shapes tiny --no-breakdown \
    --only flashinfer --out "$OUT/host_before.json" > "$OUT/host_before.log" 2>&1; echo "host before: exit $?"
  timeout 90 python3 benchmarks/host_time.py --reps 100 --shapes tiny --only flashinfer \
    --out "$OUT/host_after.json" > "$OUT/host_after.log" 2>&1; echo "host after: exit $?"
  grep "  host \|CUDA graph\|worst" "$OUT/host_after.log"
  timeout 220 python3 benchmarks/before_after.py --old "$BEFORE" --new . --rounds 3 --out-arg \
    --dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944" --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
  echo "before_after: exit $?"
  python3 benchmarks/host_summary.py "$OUT" | tee "$OUT/summary.txt"
  ;;
host)  # host time before and after in one process (old and new in alternation), then the breakdown
  timeout 85 python3 benchmarks/before_after.py --old "$BEFORE" --new . --rounds 3 --out-arg --host \
    --dims E=2,I=256,H=256 --out "$OUT/ba_host.jsonl" > "$OUT/ba_host.log" 2>&1; echo "before_after: exit $?"
  timeout 40 python3 benchmarks/host_time.py --reps 200 --shapes tiny --only cutlass_bf16 \
    --out "$OUT/host_breakdown.json" > "$OUT/host_breakdown.log" 2>&1; echo "host_time: exit $?"
  grep "  host \|CUDA graph\|worst\|runner" "$OUT/host_breakdown.log"
  python3 benchmarks/host_summary.py "$OUT" | tee "$OUT/summary_host.txt"
  ;;
esac
