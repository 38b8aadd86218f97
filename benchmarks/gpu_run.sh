#!/usr/bin/env bash
# On the GPU machine (device tool): carry=[".gpu", ".whl"], command: bash benchmarks/gpu_run.sh [parity] [sweep] [bench]
set -uo pipefail
source .gpu/setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD LAYOUTC_EXT_DIR=/tmp/layoutc_ext
mkdir -p "$LAYOUTC_EXT_DIR" "$OUT"
python3 benchmarks/gpu_bench.py "$OUT" "$@"
