#!/usr/bin/env bash
# The 2026-12-01 GPU helper's H200 session (issues 25, 24 and 22's kernel text), from the repository
# root of the main checkout with this tree copied to .wt-gpu (device tool, carry [".whl", ".wt-gpu"]):
#   bash .wt-gpu/benchmarks/h200_gpu_run.sh host     # host time per warm call, before (..) and after (.)
#   bash .wt-gpu/benchmarks/h200_gpu_run.sh speed    # every spec before/after at gpt-oss-120b; hopper split
#   bash .wt-gpu/benchmarks/h200_gpu_run.sh split    # per-body split (hopper, aiter_mxfp4), parity, breakdown
#   bash .wt-gpu/benchmarks/h200_gpu_run.sh final    # host time and the gpt-oss-20b layer before/after in one
#                                                    # process each; hopper split; host-time breakdown
# "Before" is the main checkout the device tool sends (the base of this branch); "after" is .wt-gpu.
# Results under $OUT; a summary is printed last.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
BEFORE=$PWD
cd .wt-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
summary() {  # a table of a before_after.py JSON-lines file
  python3 - "$1" <<'PY'
import json, sys
print(f"{'spec':50s} {'old ms':>7s} {'new ms':>7s} {'old %':>6s} {'new %':>6s} {'b2b old%':>8s} {'b2b new%':>8s} "
      f"same f==e | host us old/new (fp off) | host us old/new (fp on)")
for line in open(sys.argv[1]):
    r = json.loads(line)
    name = r["spec"] + " " + ",".join(f"{k}={v}" for k, v in r["params"].items())
    if "error" in r:
        print(f"{name:50s} ERROR {r['error'][:80]}")
        continue
    host = (f"{r['host_old_us']:6.1f} / {r['host_new_us']:6.1f} | {r['host_old_fingerprinted_us']:6.1f} / "
            f"{r['host_new_fingerprinted_us']:6.1f}") if "host_old_us" in r else ""
    print(f"{name:50s} {r['old_median_ms']:7.3f} {r['new_median_ms']:7.3f} {100 * r['old_fraction_of_copy']:6.1f} "
          f"{100 * r['new_fraction_of_copy']:6.1f} {100 * r['old_b2b_fraction_of_copy']:8.1f} "
          f"{100 * r['new_b2b_fraction_of_copy']:8.1f} {r['same_output']!s:5s} {r['new_fused_equals_eager']!s:5s}| {host}")
PY
}
case "${1:-host}" in
split)  # where the layer kernel's time goes (one body at a time), and parity of the final tree
  for spec in triton_kernels_mxfp4_hopper aiter_mxfp4; do
    timeout 80 python3 benchmarks/layer_split.py --spec $spec --out "$OUT/split.jsonl" > "$OUT/split_$spec.log" 2>&1
    echo "layer_split $spec: exit $?"; cat "$OUT/split_$spec.log"
  done
  timeout 120 python3 - > "$OUT/parity.log" 2>&1 <<'PY'
import torch, layoutc
from layoutc.convert.synthckpt import synthetic_inputs
CHANGED = [("triton_kernels_mxfp4_hopper", {}), ("triton_kernels_mxfp4_blackwell", {}), ("aiter_mxfp4", {}),
           ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_trtllm_mxfp4", {}),
           ("flashinfer_cutlass_bf16", {})]  # the spread quads, the one rows body, the quads walk
for name, params in CHANGED:
    spec = layoutc.compile_file(f"specs/{name}.lyt", params)
    for dims in ({"E": 32, "I": 2944, "H": 2944},):
        x = synthetic_inputs(spec, dims, 7, "cuda")
        a, b = spec.convert(x, fingerprint=False), spec.convert(x, fingerprint=False)  # full path, then prepared
        e = spec.convert(x, lowering="eager")
        same = all(a[k].view(torch.uint8).equal(e[k].view(torch.uint8)) and b[k].view(torch.uint8).equal(
            e[k].view(torch.uint8)) for k in e)
        print(name, params, dims, "fused (first and warm call) == eager:", same, flush=True)
PY
  echo "parity: exit $?"; cat "$OUT/parity.log"
  timeout 120 python3 benchmarks/host_time.py --reps 100 --shapes tiny --out "$OUT/host_final.json" \
    > "$OUT/host_final.log" 2>&1; echo "host_time: exit $?"
  grep "  host \|worst" "$OUT/host_final.log"
  ;;
final)
  timeout 200 python3 benchmarks/before_after.py --old "$BEFORE" --new . --variants all --rounds 5 --host \
    --dims E=2,I=256,H=256 --out "$OUT/ba_tiny.jsonl" > "$OUT/ba_tiny.log" 2>&1; echo "before_after tiny: exit $?"
  timeout 230 python3 benchmarks/before_after.py --old "$BEFORE" --new . --variants all --rounds 3 \
    --dims E=32,I=2944,H=2944 --out "$OUT/ba20.jsonl" > "$OUT/ba20.log" 2>&1; echo "before_after 20b: exit $?"
  timeout 60 python3 benchmarks/layer_split.py --spec triton_kernels_mxfp4_hopper --out "$OUT/split_hopper.jsonl" \
    > "$OUT/split_hopper.log" 2>&1; echo "layer_split: exit $?"
  timeout 90 python3 benchmarks/host_time.py --reps 100 --shapes tiny --out "$OUT/host_after2.json" \
    > "$OUT/host_after2.log" 2>&1; echo "host_time: exit $?"
  grep "  host \|worst" "$OUT/host_after2.log"
  cat "$OUT/split_hopper.log"
  echo "== E=2, I=H=256 (host time)"; summary "$OUT/ba_tiny.jsonl"
  echo "== gpt-oss-20b layer"; summary "$OUT/ba20.jsonl"
  ;;
host)
  HOST_TIME_ROOT=$BEFORE timeout 170 python3 benchmarks/host_time.py --reps 100 --shapes tiny \
    --out "$OUT/host_before.json" > "$OUT/host_before.log" 2>&1; echo "host before: exit $?"
  timeout 330 python3 benchmarks/host_time.py --reps 100 --out "$OUT/host_after.json" > "$OUT/host_after.log" 2>&1
  echo "host after: exit $?"
  python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
b = {(r["spec"], str(r["params"]), r["shape"]): r for r in json.load(open(f"{out}/host_before.json"))}
print(f"{'spec':44s} {'shape':12s} host us before/after (fp=False) | fp default before/after | convert/copy us (fp=False)")
for r in json.load(open(f"{out}/host_after.json")):
    o = b.get((r["spec"], str(r["params"]), r["shape"]), {})
    print(f"{r['spec'] + ' ' + str(r['params'] or ''):44s} {r['shape']:12s} {o.get('host_us', float('nan')):6.1f} / "
          f"{r['host_us']:6.1f} | {o.get('host_fingerprint_us', float('nan')):6.1f} / {r['host_fingerprint_us']:6.1f} | "
          f"{r['convert_us']:7.1f} / {r['copy_us']:7.1f} = {r['copy_us'] / r['convert_us']:5.1%}")
PY
  grep "host " "$OUT/host_before.log" | sed 's/^/before /'; grep "host \|worst" "$OUT/host_after.log" | sed 's/^/after /'
  ;;
speed)
  timeout 420 python3 benchmarks/before_after.py --old "$BEFORE" --new . --variants all --rounds 3 \
    --out "$OUT/ba120.jsonl" > "$OUT/ba120.log" 2>&1; echo "before_after: exit $?"
  timeout 100 python3 benchmarks/layer_split.py --spec triton_kernels_mxfp4_hopper --out "$OUT/split_hopper.jsonl" \
    > "$OUT/split_hopper.log" 2>&1; echo "layer_split: exit $?"
  cat "$OUT/split_hopper.log"
  python3 - "$OUT/ba120.jsonl" <<'PY'
import json, sys
print(f"{'spec':50s} {'old ms':>7s} {'new ms':>7s} {'new/old':>7s} {'old %':>6s} {'new %':>6s} {'b2b old%':>8s} "
      f"{'b2b new%':>8s} same fused==eager {'new+fp ms':>9s}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    name = r["spec"] + " " + ",".join(f"{k}={v}" for k, v in r["params"].items())
    if "error" in r:
        print(f"{name:50s} ERROR {r['error'][:80]}")
        continue
    print(f"{name:50s} {r['old_median_ms']:7.3f} {r['new_median_ms']:7.3f} {r['new_over_old']:7.3f} "
          f"{100 * r['old_fraction_of_copy']:6.1f} {100 * r['new_fraction_of_copy']:6.1f} "
          f"{100 * r['old_b2b_fraction_of_copy']:8.1f} {100 * r['new_b2b_fraction_of_copy']:8.1f} "
          f"{r['same_output']} {r['new_fused_equals_eager']} {r.get('new_fingerprinted_median_ms', float('nan')):9.3f}")
PY
  ;;
esac
