#!/usr/bin/env bash
# The closing H200 run of the session of 2026-12-02 (issues 24, 25), from the repository root (device tool,
# kind nvidia-h200, carry [".gpu", ".whl", ".emitted"]). `.emitted` holds the old and the new converters of every
# shipped spec, emitted on the CPU machine beforehand (generated converters are the same bytes on every machine):
#   python benchmarks/before_after.py --old <git archive of the base> --new . --variants all --emit-only .emitted
# Steps, each with its own time limit (rows are written as they come):
# 1. the CUDA tests of the warm path (tests/runtime/test_warm_graph.py, test_warm_fast.py);
# 2. every shipped spec, old / new / new with out= in alternation in one process, single calls and 10 back to
#    back against a device copy of the same bytes, at the gpt-oss-20b and -120b layers (W4A8 at its own
#    layers, before_after.SPEC_DIMS); same bytes and fused == eager checked on every row;
# 3. the host time of a warm call of the FlashInfer specs (tiny layer), old / new / new with out=;
# 4. the step-by-step breakdown of flashinfer_cutlass_bf16's warm call.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
PYTHONPATH=/tmp/site:$PWD timeout "${T_TESTS:-30}" python3 -m pytest -q -p no:cacheprovider -rs \
  tests/runtime/test_warm_graph.py tests/runtime/test_warm_fast.py > "$OUT/tests.log" 2>&1; echo "tests: exit $?"
tail -2 "$OUT/tests.log"
timeout "${T_ALL:-250}" python3 benchmarks/before_after.py --emitted .emitted --new . --rounds "${ROUNDS:-2}" \
  --out-arg --variants all --dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944" --out "$OUT/ba.jsonl" \
  > "$OUT/ba.log" 2>&1; echo "all specs: exit $?"
timeout "${T_HOST:-50}" python3 benchmarks/before_after.py --emitted .emitted --new . --rounds 2 --out-arg --host \
  --variants flashinfer --dims E=2,I=256,H=256 --out "$OUT/ba_host.jsonl" > "$OUT/ba_host.log" 2>&1
echo "host: exit $?"
timeout "${T_BREAK:-20}" python3 benchmarks/host_time.py --reps 200 --shapes tiny --only cutlass_bf16 \
  --out "$OUT/host_breakdown.json" > "$OUT/host_breakdown.log" 2>&1; echo "breakdown: exit $?"
wc -l "$OUT"/*.jsonl
