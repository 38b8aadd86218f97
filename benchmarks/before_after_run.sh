#!/usr/bin/env bash
# Issue 11's last criterion on one H200 (device tool), from the repository root:
#   kind nvidia-h200, carry [".gpu", ".whl", ".old"], command: bash benchmarks/before_after_run.sh
# .old holds `git archive 9bb7b22 layoutc specs benchmarks` (the lowering before issues 11/12).
# benchmarks/before_after.py times the old and the new converter of every spec in one process, in
# alternation; then the CUDA checkpoint pipeline test when pytest is on the machine. Results:
# $OUT/ba.jsonl, $OUT/ba.log, $OUT/pipeline.log; a table is printed last.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
timeout 400 python3 benchmarks/before_after.py --old .old --new . --out "$OUT/ba.jsonl" > "$OUT/ba.log" 2>&1
echo "before_after: exit $?"
if python3 -c 'import pytest, hypothesis' 2>/dev/null; then
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/convert/test_checkpoint_pipeline.py -k cuda_pipeline > "$OUT/pipeline.log" 2>&1; echo "pipeline test: exit $?"
else
  echo "pytest/hypothesis not on the machine: pipeline test not run" | tee "$OUT/pipeline.log"
fi
python3 - "$OUT/ba.jsonl" <<'PY'
import json, sys
print(f"{'spec':58s} {'old ms':>7s} {'new ms':>7s} {'new/old':>7s} {'old %':>6s} {'new %':>6s} same  {'new+fp ms':>9s}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    name = r["spec"].removeprefix("flashinfer_") + " " + ",".join(f"{k}={v}" for k, v in r["params"].items())
    if "error" in r:
        print(f"{name:58s} ERROR {r['error'][:80]}")
        continue
    print(f"{name:58s} {r['old_median_ms']:7.3f} {r['new_median_ms']:7.3f} {r['new_over_old']:7.3f} "
          f"{100 * r['old_fraction_of_copy']:6.1f} {100 * r['new_fraction_of_copy']:6.1f} {r['same_output']}  "
          f"{r.get('new_fingerprinted_median_ms', float('nan')):9.3f}")
PY
