#!/usr/bin/env bash
# A new user's install, end to end: build the wheel, install it (not editable) into a fresh venv
# with the CPU build of torch, and run the commands and the Python API from a folder outside the
# checkout. Fails on a Python warning, a traceback, an "internal error", or a command that fails.
#
#   tools/check_wheel.sh            (about 3 minutes on the 2-core machine, most of it installing torch)
#
# Environment: PYTHON (default python3), TORCH (default torch==2.13.0, the CPU build from the local
# wheel cache; elsewhere add PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), KEEP=1 keeps
# the scratch folder. tests/test_packaging.py (slow set) makes the same checks offline, reusing this
# environment's torch.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/layoutc-wheel.XXXXXX")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "build the wheel from a copy of the checkout (tracked and new files; the checkout gets no build/)"
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/run"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp -P --parents -t "$WORK/src")
"$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/layoutc-*.whl)"
echo "$(basename "$WHEEL"): $(unzip -l "$WHEEL" | grep -c 'layoutc/specs/.*\.lyt') shipped specs inside"

step "fresh venv (no system site packages): $TORCH, then the wheel"
"$PYTHON" -m venv "$WORK/venv"
PIP="$WORK/venv/bin/pip"
"$PIP" install -q "$TORCH" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$PIP" install -q "$WHEEL" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$WORK/venv/bin/python" -c "import torch; assert torch.__version__, 'no torch'"
for extra in matplotlib flashinfer triton; do
  if "$WORK/venv/bin/python" -c "import $extra" 2>/dev/null; then echo "unexpected: $extra is installed"; exit 1; fi
done

BIN="$WORK/venv/bin"
LOG="$WORK/log"
cd "$WORK/run"

# run EXPECTED_RC COMMAND...: echo it, run it, keep its output, check the exit status
run() {
  local want="$1"; shift
  printf '$ %s\n' "$*"
  set +e
  "$@" >"$LOG" 2>&1
  local rc=$?
  set -e
  sed 's/^/    /' "$LOG" | head -n 12
  if [ "$rc" != "$want" ]; then echo "exit status $rc, expected $want"; exit 1; fi
  if grep -E "Warning:|Traceback|internal error" "$LOG"; then echo "a warning or an error above"; exit 1; fi
  cat "$LOG" >>"$WORK/all.log"
}

step "commands, from $WORK/run"
run 0 "$BIN/layoutc" --version
run 0 "$BIN/layoutc" check flashinfer_cutlass_bf16 flashinfer_cutedsl_nvfp4
run 0 "$BIN/layoutc" compile flashinfer_cutlass_mxfp8 -o conv.py
run 0 "$BIN/layoutc" demo
run 0 "$BIN/layoutc" explain flashinfer_cutlass_bf16 --tensor w13_weight_scale
run 0 "$BIN/layoutc" ops

step "layoutc convert on a small checkpoint written with the API"
run 0 "$BIN/python" - <<'EOF'
import torch
import layoutc
from layoutc import shardfile
from layoutc.cli.demo import synthetic_inputs
from layoutc.shipped import SPECS

spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
layer = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=0)
tensors = {f"model.layers.0.mlp.experts.{k}": v for k, v in layer.items()}
tensors["model.embed_tokens.weight"] = torch.zeros(8, 4)
import os
os.makedirs("ckpt", exist_ok=True)
shardfile.write("ckpt/model.safetensors", tensors, {"format": "pt"})
print("wrote ckpt/model.safetensors")
EOF
run 0 "$BIN/layoutc" convert --spec flashinfer_cutlass_bf16 --in ckpt --out ckpt-sm90
test -f ckpt-sm90/model.safetensors && test -f ckpt-sm90/layoutc_manifest.json

step "the Python API, the registry and the compiled module"
run 0 "$BIN/python" - <<'EOF'
import torch
import layoutc
from layoutc.cli.demo import synthetic_inputs
from layoutc.registry import DEFAULT

DEFAULT.check(DEFAULT.backends)          # compiles and verifies every shipped spec
spec = DEFAULT.spec("flashinfer_cutlass_mxfp4_mxfp8")
x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=1)
out = DEFAULT.convert("flashinfer_cutlass_mxfp4_mxfp8", x)
back = spec.inverse(out)
assert all(torch.equal(back[k].view(torch.uint8), x[k].view(torch.uint8)) for k in x if x[k].element_size() == 1)
import conv                              # written by `layoutc compile` above
again = conv.convert(x)
assert all(torch.equal(again[k], out[k]) for k in out)
print(f"registry: {len(DEFAULT.backends)} backends verified; API and compiled module agree")
EOF

step "optional extras missing: the message names the extra; bench on the CPU runs without FlashInfer"
run 2 "$BIN/layoutc" draw flashinfer_cutlass_bf16 --tensor w13_weight -o w13.png
grep -q "layoutc\[review\]" "$LOG"
run 0 "$BIN/layoutc" bench flashinfer_cutlass_bf16 --shape E=2,I=128,H=256 --reps 1
grep -q "skipped: flashinfer is not installed" "$LOG"

step "wheel check passed"
