#!/usr/bin/env bash
# Adds .gpu/flashinfer_moe_extra.tar.xz: what the trimmed SM90 fused-MoE build
# (tools/gpu/moe_sm90/build.py) needs beyond shared/gpu/bundle.sh's FlashInfer tarball.
#   flashinfer/data/cccl   FlashInfer's vendored CCCL (cub, thrust, libcudacxx; 25 MB, 1.7 MB as xz).
#                          FlashInfer's JIT puts it first on every include path (jit/env.py,
#                          CCCL_INCLUDE_DIRS). Without it, host-only units that include CUTLASS
#                          (cutlass_heuristic.cpp: cutlass.h -> <cuda/std/utility>) do not compile
#                          with g++, since CUDA 13 keeps its own CCCL under include/cccl, which only
#                          nvcc searches.
# Taken from an installed flashinfer-python of the bundle's version ($PYTHON, .venv/bin/python or
# python3), else from the wheel (pip download). Usage, from the repo root, after bundle.sh:
#   bash tools/gpu/moe_sm90/bundle_extra.sh
set -euo pipefail
out=$PWD/.gpu
[[ -f $out/flashinfer.tar.xz ]] || { echo "no .gpu/flashinfer.tar.xz: run shared/gpu/bundle.sh first" >&2; exit 1; }
version=$(tar -xJOf "$out/flashinfer.tar.xz" --wildcards 'flashinfer_python-*.dist-info/METADATA' | sed -n 's/^Version: //p')
keep=(flashinfer/data/cccl)
src=
for py in "${PYTHON:-}" ./.venv/bin/python python3; do
  [[ -n $py ]] && command -v "$py" >/dev/null 2>&1 || continue
  site=$("$py" -c 'import flashinfer, importlib.metadata as m, os, sys
if m.version("flashinfer-python") == sys.argv[1]: print(os.path.dirname(os.path.dirname(flashinfer.__file__)))' "$version" 2>/dev/null || true)
  if [[ -n $site && -d $site/flashinfer/data/cccl ]]; then src=$site; break; fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -z $src ]]; then
  python3 -m pip download -q --no-deps -d "$tmp/whl" "flashinfer-python==$version"
  (cd "$tmp" && python3 -m zipfile -e whl/flashinfer_python-*.whl site >/dev/null)
  src=$tmp/site
fi
echo "flashinfer-python $version from $src: ${keep[*]}"
tar -C "$src" -cJf "$out/flashinfer_moe_extra.tar.xz" "${keep[@]}"
ls -la "$out/flashinfer_moe_extra.tar.xz"
du -sh "$out"
