#!/usr/bin/env bash
# Issue 25, single calls (2026-12-02, wt-single): one H200 run from this tree's root (device tool, kind nvidia-h200,
# carry [".gpu", ".whl", ".wt-single"], the tree rsynced into .wt-single with the converters emitted on the CPU into
# .wt-single/.emitted-single: python benchmarks/before_after.py --old <git archive of the base> --new . --variants
# all --emit-only .emitted-single). Steps, each with its own time limit:
# 1. the CUDA tests of the warm path, the launch and the fingerprint's read-back;
# 2. benchmarks/single_split.py: where a warm single call's host time goes at the gpt-oss-20b layer, and the
#    fingerprint's device time with its GEMMs' K in parts or not (and at the 120b layer for one spec);
# 3. before_after.py: every shipped spec, old and new in alternation in one process, at the gpt-oss-20b and -120b
#    layers: fingerprint=False, the default call (fingerprint on) and out=, single and 10 back to back, against a
#    device copy of the same bytes; same bytes old == new, fused == eager, out= == the allocating call.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
timeout "${T_TESTS:-60}" python3 -m pytest -q -p no:cacheprovider -rs tests/runtime/test_warm_graph.py \
  tests/runtime/test_warm_fast.py tests/lower/test_launch.py \
  tests/runtime/test_guard_copies.py::test_cuda_fingerprints_are_read_back_from_pinned_host_memory \
  > "$OUT/tests.log" 2>&1; echo "tests: exit $?"; tail -2 "$OUT/tests.log"
timeout "${T_SPLIT:-100}" python3 benchmarks/single_split.py > "$OUT/split.log" 2>&1; echo "split: exit $?"
timeout "${T_SPLIT120:-40}" python3 benchmarks/single_split.py --specs flashinfer_cutlass_bf16 \
  --dims E=128,I=2944,H=2944 > "$OUT/split120.log" 2>&1; echo "split 120b: exit $?"
timeout "${T_ALL:-380}" python3 benchmarks/before_after.py --emitted .emitted-single --new . --rounds "${ROUNDS:-2}" \
  --out-arg --variants "${VARIANTS:-all}" --dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944" --out "$OUT/ba.jsonl" \
  > "$OUT/ba.log" 2>&1; echo "all specs: exit $?"
wc -l "$OUT"/*.jsonl
