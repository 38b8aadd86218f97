#!/usr/bin/env bash
# Issue 15 on the GPU machine (device tool), from the repository root:
#   kind nvidia-h200,    carry [".whl"], command: bash benchmarks/checkpoint_run.sh one
#   kind nvidia-h200-x2, carry [".whl"], command: bash benchmarks/checkpoint_run.sh two
# .whl holds the wheels the machine lacks (lark, interegular; see the device notes). Results:
# $OUT/ckpt_<mode>.json and $OUT/ckpt_<mode>.log; a summary table is printed last.
set -uo pipefail
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
# never NVLink multicast on the shared hosts (the device notes)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "${OUT:=$PWD/out}"
python3 -c 'import torch, lark, attrs, click, safetensors; print("torch", torch.__version__, "gpus", torch.cuda.device_count())' || exit 1
python3 benchmarks/checkpoint_throughput.py "$@" --out "$OUT"
