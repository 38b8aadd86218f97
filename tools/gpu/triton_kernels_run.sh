#!/usr/bin/env bash
# OpenAI triton_kernels' matmul_ogs on the H200 with weights converted by layoutc (tools/gpu/triton_kernels_moe.py).
#
# triton_kernels is not a PyPI package (the PyPI `triton-kernels` is someone else's) and the GPU machine has no
# network, so its source travels in a carried folder, never in the repository. Two steps:
#
# 1. Here, in the repository root (needs a git clone of the Triton repository, or any git dir holding its tags):
#      echo /.tk/ >> .git/info/exclude
#      bash tools/gpu/triton_kernels_run.sh prepare /path/to/triton.git v3.6.0
#    The tag must be the Triton release installed on the GPU machine (`python3 -c 'import triton;
#    print(triton.__version__)'` there; 3.6.0 on 2026-12-01). v3.6.0 is commit
#    7c56a5e40f7fd928dfd5c72902d5def0097db73a ("[release 3.6] Release Triton to pypi (#9254)").
#    This writes .tk/: the triton_kernels source (python/triton_kernels, about 0.6 MB), the converter that
#    `layoutc compile specs/triton_kernels_mxfp4_hopper.lyt` generates, and this folder's two scripts.
# 2. Device tool: carry=[".tk"], command: bash .tk/triton_kernels_run.sh run [--profile]
#    Writes $OUT/run.log and $OUT/results.json (and the goldens file tests/goldens/triton_kernels_hopper_mxfp4.pt
#    holds); about 15 s on a warm H200.
set -euo pipefail
mode=${1:-}
case "$mode" in
  prepare)
    gitdir=${2:?usage: prepare TRITON_GIT_DIR TAG}
    tag=${3:?usage: prepare TRITON_GIT_DIR TAG}
    root=$(git rev-parse --show-toplevel)
    tk=${TK_DIR:-$root/.tk}        # the carried folder (ignored by git)
    src=${LAYOUTC_SRC:-$root}      # the layoutc checkout whose spec and compiler make the converter
    rm -rf "$tk/src"
    mkdir -p "$tk/src"
    git --git-dir="$gitdir" archive "$tag" python/triton_kernels | tar -x -C "$tk/src"
    git --git-dir="$gitdir" rev-parse "$tag^{commit}" > "$tk/src/TRITON_COMMIT"
    python=${PYTHON:-$root/.venv/bin/python}
    (cd "$src" && PYTHONPATH="$src" "$python" -m layoutc compile specs/triton_kernels_mxfp4_hopper.lyt \
      -o "$tk/layoutc_triton_kernels_mxfp4_hopper.py")
    cp "$root/tools/gpu/triton_kernels_moe.py" "$root/tools/gpu/triton_kernels_run.sh" "$tk/"
    du -sh "$tk"
    ;;
  run)
    shift
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    : "${OUT:?set OUT to the folder for the results}"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" | tee "$OUT/env.txt"
    if [ -f "$here/src/TRITON_COMMIT" ]; then
      echo "triton_kernels from commit $(cat "$here/src/TRITON_COMMIT")" | tee -a "$OUT/env.txt"
    fi
    PYTHONUNBUFFERED=1 python3 "$here/triton_kernels_moe.py" \
      --converter "$here/layoutc_triton_kernels_mxfp4_hopper.py" \
      --tk-src "$here/src/python/triton_kernels" --out "$OUT" "$@" 2>&1 | tee "$OUT/stdout.log"
    ;;
  *)
    echo "usage: $0 prepare TRITON_GIT_DIR TAG | run [--profile]" >&2
    exit 2
    ;;
esac
