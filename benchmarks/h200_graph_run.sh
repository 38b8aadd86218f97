#!/usr/bin/env bash
# Issue 25, a CUDA graph of the prepared launch per out= warm entry: on the H200, from the repository root
# (device tool, carry [".gpu", ".whl", ".wt-graph", ".base-graph"]; .base-graph = `git archive 064a815 layoutc
# specs benchmarks`, main before; .wt-graph = this branch):   bash .wt-graph/benchmarks/h200_graph_run.sh
# 1. the CUDA tests of the warm path (tests/runtime/test_warm_graph.py, test_warm_fast.py);
# 2. host time of a warm call, the FlashInfer lines, tiny layer (E=2, I=H=256): old, new, old out=, new out=
#    (and the default fingerprinted call) in alternation in one process (before_after.py --host --out-arg);
# 3. the step-by-step breakdown of flashinfer_cutlass_bf16's warm call (host_time.py --only cutlass_bf16);
# 4. single calls at the gpt-oss-20b and -120b layers, old / new / old out= / new out= against a device copy
#    (before_after.py --out-arg, SINGLE_SPECS); same bytes, fused == eager, out= == new.
# Each step has its own time limit (the device time is short); rows are written as they come.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
W=.wt-graph
B=$W/benchmarks
(cd $W && PYTHONPATH=/tmp/site:$PWD timeout "${T_TESTS:-30}" python3 -m pytest -q -p no:cacheprovider -rs \
  tests/runtime/test_warm_graph.py tests/runtime/test_warm_fast.py) > "$OUT/tests.log" 2>&1; echo "tests: exit $?"
tail -3 "$OUT/tests.log"
timeout "${T_HOST:-45}" python3 $B/before_after.py --old .base-graph --new $W --rounds "${R_HOST:-2}" --out-arg \
  --variants "${HOST_SPECS:-flashinfer}" --host --dims E=2,I=256,H=256 --out "$OUT/ba_host.jsonl" > "$OUT/ba_host.log" 2>&1; echo "host: exit $?"
timeout "${T_BREAK:-15}" env HOST_TIME_ROOT=$W python3 $B/host_time.py --reps 200 --shapes tiny \
  --only cutlass_bf16 --out "$OUT/host_breakdown.json" > "$OUT/host_breakdown.log" 2>&1; echo "breakdown: exit $?"
timeout "${T_SINGLE:-30}" python3 $B/before_after.py --old .base-graph --new $W --rounds "${R_SINGLE:-1}" --out-arg \
  --variants "${SINGLE_SPECS:-flashinfer_cutlass_bf16,flashinfer_trtllm_bf16,flashinfer_cutedsl_nvfp4}" \
  --dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944" --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
echo "single: exit $?"
python3 $B/host_fast_summary.py "$OUT" 2>&1 | tee "$OUT/summary.txt"
