#!/usr/bin/env bash
# Regenerates tests/goldens/w4a8_reorder.txt: CUTLASS's W4A8 reorder layout and packed_scale_t, printed
# on the host by tools/goldens/w4a8_reorder.cu (no GPU needed; nvcc and CUTLASS's headers are).
#
#   tools/goldens/w4a8_reorder.sh CUTLASS_DIR [OUT]
#
# CUTLASS_DIR holds include/ and tools/util/include/ (e.g. a CUTLASS checkout, or FlashInfer's wheel's
# flashinfer/data/cutlass). Recorded with FlashInfer's bundled CUTLASS and nvcc 13.0. The tests read the
# output and need neither nvcc nor CUTLASS.
#
# cutlass/util/mixed_dtype_utils.hpp includes reference/device/tensor_fill.h, which needs curand (device
# random fills this host-only program never calls): an empty stand-in for that one header is put first
# on the include path, in a temporary folder.
set -euo pipefail
cutlass=${1:?usage: $0 CUTLASS_DIR [OUT]}
out=${2:-$(dirname "$0")/../../tests/goldens/w4a8_reorder.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/shim/cutlass/util/reference/device"
echo '#pragma once' > "$tmp/shim/cutlass/util/reference/device/tensor_fill.h"
nvcc -std=c++17 --expt-relaxed-constexpr -I "$tmp/shim" -I "$cutlass/include" -I "$cutlass/tools/util/include" \
    -o "$tmp/w4a8_reorder" "$(dirname "$0")/w4a8_reorder.cu"
{
  echo "# CUTLASS W4A8 facts printed by tools/goldens/w4a8_reorder.cu (regenerate: tools/goldens/w4a8_reorder.sh)"
  # (N, K): the smallest atom-multiple, several atoms along each axis, and K = 2 x 256 (vLLM: K % 256, N % 16)
  for nk in "16 32" "16 256" "32 64" "48 512"; do
    set -- $nk
    echo "reorder $1 $2"
    "$tmp/w4a8_reorder" reorder "$1" "$2"
  done
  echo "packed_scale"
  "$tmp/w4a8_reorder" packed_scale
} > "$out"
echo "wrote $out"
