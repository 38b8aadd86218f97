#!/usr/bin/env bash
# The session's closing H200 run (issues 23-25), from the repository root (device tool, kind nvidia-h200,
# carry [".gpu", ".whl", ".old"]; .old = `git archive <base> layoutc specs benchmarks`, the tree before the
# session; .whl = lark and interegular wheels for the machine's Python):
#   bash benchmarks/h200_final_run.sh flashinfer   # FlashInfer's specs: old/new/new with out=, 20b and 120b
#                                                  # layers; host time of a warm call (tiny layer), breakdown
#   bash benchmarks/h200_final_run.sh other        # the other engines' specs, 20b and 120b layers
#                                                  # (vllm_cutlass_w4a8 at its own: before_after.SPEC_DIMS,
#                                                  # the Qwen3-30B-A3B and DeepSeek-V3 layers; timed alone
#                                                  # where .old has no such spec); the CUDA pipeline test
# benchmarks/before_after.py times the old and the new converters in one process, in alternation (single
# calls and 10 back to back, a device copy of the same bytes in each round; same bytes and fused == eager
# checked). Results under $OUT; tables printed last (benchmarks/host_summary.py).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
dims="E=32,I=2944,H=2944;E=128,I=2944,H=2944"
case "${1:?flashinfer or other}" in
flashinfer)
  timeout 300 python3 benchmarks/before_after.py --old .old --new . --rounds 3 --out-arg --dims "$dims" \
    --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1; echo "before_after: exit $?"
  timeout 90 python3 benchmarks/before_after.py --old .old --new . --rounds 3 --out-arg --host \
    --dims E=2,I=256,H=256 --out "$OUT/ba_host.jsonl" > "$OUT/ba_host.log" 2>&1; echo "host: exit $?"
  timeout 45 python3 benchmarks/host_time.py --reps 200 --shapes tiny --only cutlass_bf16 \
    --out "$OUT/host_breakdown.json" > "$OUT/host_breakdown.log" 2>&1; echo "breakdown: exit $?"
  grep "  host \|CUDA graph\|worst\|runner" "$OUT/host_breakdown.log"
  ;;
other)
  timeout "${T_OTHER:-330}" python3 benchmarks/before_after.py --old .old --new . --rounds 3 --variants other \
    --dims "$dims" --out "$OUT/ba_other.jsonl" > "$OUT/ba_other.log" 2>&1; echo "before_after other: exit $?"
  if python3 -c 'import pytest, hypothesis' 2>/dev/null; then
    PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider \
      tests/convert/test_checkpoint_pipeline.py -k cuda_pipeline > "$OUT/pipeline.log" 2>&1
    echo "pipeline test: exit $?"
  fi
  ;;
esac
python3 benchmarks/host_summary.py "$OUT" 2>&1 | tee "$OUT/summary.txt"
