# Sourced by the device scripts (benchmarks/*_run.sh) from the repository root: the set-up every H200 run
# shares. `.gpu` (FlashInfer's sources and FFI wheel, when carried) is set up, the wheels in `.whl` that the
# device's Python lacks (lark, interegular) go to /tmp/site, and the GPU, driver and library versions are
# written to $OUT/gpu.txt, so every result folder says what it ran on.
if [ -f .gpu/setup.sh ]; then source .gpu/setup.sh; fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p "${OUT:=$PWD/out}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
