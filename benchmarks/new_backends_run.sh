#!/usr/bin/env bash
# Issue 24/25 on one H200 (device tool), the new (non-FlashInfer) specs before and after a change:
#   rsync this worktree to <main>/.wt-NAME; kind nvidia-h200, carry [".whl", ".wt-NAME"], command:
#   bash .wt-NAME/benchmarks/new_backends_run.sh .wt-NAME
# The tree the tool sends (main) is "old", the carried worktree "new": benchmarks/before_after.py times
# both converters of every spec in OTHER_VARIANTS in one process, in alternation, at the gpt-oss-120b
# layer (E=128, I=H=2944) and then the gpt-oss-20b layer (E=32): single calls and 10 back to back,
# a device copy of the same bytes in each round, fused == eager checked. Results: $OUT/ba120.jsonl,
# $OUT/ba20.jsonl and their logs; a table is printed last. OLD=folder (a carried `git archive` of another
# commit) replaces main as the old side, VARIANTS=spec,spec limits the specs.
set -uo pipefail
new=${1:?the carried worktree folder}
old=${OLD:-.}  # the tree the tool sends (main), or a carried git archive
variants=${VARIANTS:-other}
source "$(dirname "$0")/gpu_env.sh"  # .gpu, the wheels of .whl in /tmp/site, $OUT/gpu.txt
rounds=${ROUNDS:-3}
timeout "${T120:-170}" python3 "$new/benchmarks/before_after.py" --old "$old" --new "$new" --variants "$variants" \
  --rounds "$rounds" --out "$OUT/ba120.jsonl" > "$OUT/ba120.log" 2>&1
echo "120b: exit $?"
timeout "${T20:-100}" python3 "$new/benchmarks/before_after.py" --old "$old" --new "$new" --variants "$variants" \
  --rounds "$rounds" --dims E=32,I=2944,H=2944 --out "$OUT/ba20.jsonl" > "$OUT/ba20.log" 2>&1
echo "20b: exit $?"
python3 - "$OUT"/ba120.jsonl "$OUT"/ba20.jsonl <<'PY'
import json, sys
print(f"{'layer':5s} {'spec':28s} {'old ms':>7s} {'new ms':>7s} {'old %':>6s} {'new %':>6s} {'old b2b%':>8s} "
      f"{'new b2b%':>8s} same f==e")
for path, layer in zip(sys.argv[1:], ("120b", "20b")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        r = json.loads(line)
        if "error" in r:
            print(f"{layer:5s} {r['spec']:28s} ERROR {r['error'][:90]}")
            continue
        print(f"{layer:5s} {r['spec']:28s} {r['old_median_ms']:7.3f} {r['new_median_ms']:7.3f} "
              f"{100 * r['old_fraction_of_copy']:6.1f} {100 * r['new_fraction_of_copy']:6.1f} "
              f"{100 * r['old_b2b_fraction_of_copy']:8.1f} {100 * r['new_b2b_fraction_of_copy']:8.1f} "
              f"{r['same_output']} {r['new_fused_equals_eager']}")
PY
