#!/usr/bin/env bash
# vllm_cutlass_w4a8's fused converter on one rank of tensor parallelism (tp_size 2, 3, 4, 8), old and new, on one
# H200 (device tool, kind nvidia-h200), from the main checkout's root with this worktree copied to .wt-w4a8tp and
# carry [".whl", ".wt-w4a8tp", ".emitted-w4a8tp"]. `.emitted-w4a8tp`: the old and new converters emitted on the
# CPU machine (no compile in device time):
#   python benchmarks/before_after.py --old <git archive of the base> --new . --variants w4a8tp \
#     --emit-only .emitted-w4a8tp
# Old and new in alternation (single, 10 back to back, out=) against a device copy of the shard's bytes, at the
# layers the spec accepts at each tp_size (DeepSeek-V3 at 2, 4, 8; Qwen3-235B-A22B at 2; Qwen3-30B-A3B at 3);
# old == new bytes and fused == eager checked on every row.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
timeout 400 python3 .wt-w4a8tp/benchmarks/before_after.py --emitted .emitted-w4a8tp --new .wt-w4a8tp --rounds 2 \
  --out-arg --variants w4a8tp --out "$OUT/ba.jsonl" 2>&1 | tee "$OUT/ba.log"; echo "ba exit $?"
