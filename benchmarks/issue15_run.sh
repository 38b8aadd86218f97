#!/usr/bin/env bash
# Issue 15/12 on one H200 (device tool), from the repository root:
#   kind nvidia-h200, carry [".gpu", ".whl", ".old"], command: bash benchmarks/issue15_run.sh
# .old (optional) holds `git archive <earlier commit> layoutc specs benchmarks`: the lowering before
# this change, benchmarked in the same run for a before/after on the same machine.
# Results under $OUT: old/ and new/ (gpu_bench.log, bench.jsonl, bench.md), host_time.{log,json}.
set -uo pipefail
source .gpu/setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export LAYOUTC_EXT_DIR=/tmp/layoutc_ext
mkdir -p "$LAYOUTC_EXT_DIR" "$OUT/new" "$OUT/old"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
if [[ -d .old/layoutc && -z "${SKIP_OLD:-}" ]]; then  # before (SKIP_OLD=1: this tree only)
  (cd .old && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/gpu_bench.py "$OUT/old" bench --quick \
     && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 benchmarks/gpu_bench.py "$OUT/old" bench --quick --new) \
     > "$OUT/old/stdout.log" 2>&1; echo "old: exit $?"
fi
export PYTHONPATH=/tmp/site:$PWD
timeout 420 python3 benchmarks/gpu_bench.py "$OUT/new" parity bench --all; echo "new: exit $?"
timeout 90 python3 benchmarks/host_time.py --reps 100 --out "$OUT/host_time.json" | tee "$OUT/host_time.log"
