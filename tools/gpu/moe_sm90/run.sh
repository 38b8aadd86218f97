#!/usr/bin/env bash
# Issue 14 in one GPU call: the trimmed SM90 fused-MoE build, then the kernel run on weights
# converted by layoutc (tools/gpu/moe_kernel.py). Prepare on the CPU machine, from the repo root:
#   bash ../shared/gpu/bundle.sh && bash tools/gpu/moe_sm90/bundle_extra.sh
#   python3 -m pip download --no-deps --only-binary=:all: lark attrs -d .whl   # layoutc's imports
# then, with the device tool (carry [".gpu", ".whl"]):
#   source .gpu/setup.sh && bash tools/gpu/moe_sm90/run.sh
# Time: moe_kernel.py gets a deadline RUN_BUDGET_S (570) seconds after this script starts; the
# build stops early enough to leave the kernel stage its time, and `timeout` is the backstop.
# If the build did not finish (exit 3), run the same command again at once: the objects live in
# FlashInfer's JIT cache under $FLASHINFER_WORKSPACE_BASE and ninja resumes while the machine is
# warm. Writes into $OUT: run.log, gpu.txt, moe_kernel.json, flashinfer_cutlass_moe_sm90.pt,
# trimmed_out_symbols.txt.
set -uo pipefail
start=$(date +%s)
stamp() { echo "[run.sh +$(( $(date +%s) - start ))s] $*"; }
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
: "${OUT:?OUT must be set (the device tool sets it)}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

[[ -d /tmp/site/flashinfer ]] || source .gpu/setup.sh
if [[ ! -d /tmp/site/flashinfer/data/cccl ]]; then
  if [[ -f .gpu/flashinfer_moe_extra.tar.xz ]]; then
    tar -xJf .gpu/flashinfer_moe_extra.tar.xz -C /tmp/site
  else
    echo "warning: no .gpu/flashinfer_moe_extra.tar.xz (tools/gpu/moe_sm90/bundle_extra.sh): host units including CUTLASS will not compile"
  fi
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
{ python3 --version; nvcc --version | tail -2; ninja --version; echo "cores $(nproc)"; } | tee -a "$OUT/gpu.txt"
# layoutc needs lark and attrs (carry .whl/ with their wheels if the machine lacks them)
python3 -c "import importlib.metadata as m
for d in ('torch', 'triton', 'apache-tvm-ffi', 'flashinfer-python', 'lark', 'attrs', 'packaging'):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, 'MISSING')" | tee -a "$OUT/gpu.txt"
stamp "setup done (MAX_JOBS=$MAX_JOBS)"

# Optional: .gpu/layoutc_fused_moe_90_w4a16.so, the same trimmed module cross-compiled on the CPU
# machine (README: "Prebuilt module"). Used only if the build here fails or runs out of time, or
# instead of it with MOE_PREBUILT_ONLY=1 (saves the 2-3 minutes of device time the build takes).
prebuilt=()
if [[ -f .gpu/layoutc_fused_moe_90_w4a16.so ]]; then
  prebuilt=(--prebuilt .gpu/layoutc_fused_moe_90_w4a16.so)
  [[ ${MOE_PREBUILT_ONLY:-0} == 1 ]] && prebuilt+=(--prebuilt-only)
fi
deadline=$(( start + ${RUN_BUDGET_S:-570} ))
timeout --signal=INT --kill-after=10 $(( deadline - $(date +%s) + 15 )) \
  python3 tools/gpu/moe_kernel.py "$OUT" --deadline "$deadline" --jobs "$MAX_JOBS" ${prebuilt[@]+"${prebuilt[@]}"}
rc=$?
case $rc in
  0) stamp "moe_kernel.py: kernel ran and matched the reference" ;;
  3) stamp "moe_kernel.py: no module (build stopped by the deadline or failed); run the same command again now to resume" ;;
  124|130|137) stamp "moe_kernel.py: killed by the timeout backstop (exit $rc)" ;;
  *) stamp "moe_kernel.py: exit $rc (see moe_kernel.json: errors)" ;;
esac
ls -la "$OUT"
exit $rc
