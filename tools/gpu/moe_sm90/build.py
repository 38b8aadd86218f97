"""Trimmed JIT build of FlashInfer's SM90 CUTLASS fused MoE: MXFP4 weights x BF16 activations only.

FlashInfer's ``gen_cutlass_fused_moe_sm90_module`` (flashinfer/jit/fused_moe.py) compiles 248
units, every dtype combination and tile (75 min on 16 cores). This module starts from that very
spec (same nvcc flags, defines and include paths) and keeps only what the W4A16 path can reach;
README.md beside this file says why each source is kept or dropped. Everything is compiled by
FlashInfer's own ninja generator (``JitSpecNvcc.write_ninja``) into FlashInfer's JIT cache, so a
second call continues an interrupted build (ninja is incremental).

    python tools/gpu/moe_sm90/build.py [--jobs 16] [--deadline EPOCH_SECONDS] [--objects-only]

``build(...)`` returns the loaded tvm-ffi module; ``install(module)`` makes
``flashinfer.fused_moe.cutlass_fused_moe`` use it on SM90.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "layoutc_fused_moe_90_w4a16"

# FlashInfer's sources (paths relative to flashinfer/data/csrc) kept from the full SM90 spec.
KEEP = {
    "fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu": "the tvm-ffi binding (init/run_moe)",
    "fused_moe/cutlass_backend/deepgemm_jit_setup.cu": "get_cutlass_fused_moe_module calls set_deepgemm_jit_include_dirs",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_kernels_bf16_fp4.cu":
        "MoeGemmRunner<bf16, Fp4Type, bf16>: the GEMM dispatch of this path",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_tma_warp_specialized_input.cu":
        "TmaWarpSpecializedGroupedGemmInput workspace/layout (host)",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu":
        "interleave kernels behind the binding's interleave_moe_*_for_sm90_mixed_gemm",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp": "candidate tactics (FAST_BUILD: one tile)",
    "nv_internal/tensorrt_llm/kernels/preQuantScaleKernel.cu": "small; referenced by the runner template",
    "nv_internal/tensorrt_llm/kernels/lora/lora.cpp": "small; referenced by the runner template",
    "nv_internal/cpp/common/envUtils.cpp": "common", "nv_internal/cpp/common/logger.cpp": "common",
    "nv_internal/cpp/common/stringUtils.cpp": "common", "nv_internal/cpp/common/tllmException.cpp": "common",
    "nv_internal/cpp/common/memoryUtils.cu": "common",
}

# The mixed-input grouped GEMM instantiations compiled, out of the 184 bf16 x e2m1 ones that
# generate_sm90_mixed_type_grouped_gemm_operations lists: (CTA tile, cluster, mainloop schedule).
#  * 128x128x128, 1x1x1, pingpong: under -DFAST_BUILD get_candidate_tiles_sm90 returns only
#    CtaShape128x128x128B and sm90_supports_coop() is false, so get_candidate_configs_sm90 gives
#    PINGPONG with clusters 1x1x1, 2x1x1, 1x2x1, 2x2x1; the runner's default tactic
#    (setRunnerProfiles: mAllProfiles.front(), GEMM2: the first GEMM2 tactic) is the 1x1x1 one.
#  * 128x64x256, 1x1x1, cooperative: calcMaxWorkspaceSizeTmaWarpSpecializedMixedInput sizes the
#    GEMM workspace with this launcher (Ktile 256 for Fp4Type) on every call.
# The other three FAST_BUILD tactics (clusters 2x1x1, 1x2x1, 2x2x1) link to the trap: without
# autotuning (no flashinfer.autotune context, no profile_ids) they are never launched.
KEEP_OPS = [((128, 128, 128), (1, 1, 1), "TmaWarpSpecializedPingpong"),
            ((128, 64, 256), (1, 1, 1), "TmaWarpSpecializedCooperative")]

EXTRA_FLAGS = ["-DFAST_BUILD"]

#: What the last build() call got to (moe_kernel.py records it in its results).
STATUS: dict = {}


def log(msg: str) -> None:
    print(f"[moe_sm90 build {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def full_spec():
    """FlashInfer's own SM90 fused-MoE JitSpec (this also writes its 211 generated files; ~5 s)."""
    from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module

    return gen_cutlass_fused_moe_sm90_module(use_fast_build=True)


def kept_operations():
    """FlashInfer's own launcher descriptions for the bf16 x e2m1 instantiations in KEEP_OPS."""
    from flashinfer.jit.gemm.cutlass import generate_kernels as gk
    from flashinfer.jit.gemm.cutlass.cutlass_library import DataType

    ops = []
    for op in gk.generate_sm90_mixed_type_grouped_gemm_operations(True):
        key = (tuple(op.cta_shape), tuple(op.cga_shape), op.mainloop_schedule.name)
        if op.act_type == DataType.bf16 and op.weight_type == gk.e2m1 and key in KEEP_OPS:
            ops.append(op)
    found = {(tuple(o.cta_shape), tuple(o.cga_shape), o.mainloop_schedule.name) for o in ops}
    missing = [k for k in KEEP_OPS if k not in found]
    if missing:
        raise RuntimeError(f"FlashInfer's generator lists no bf16 x e2m1 launcher for {missing}")
    return ops


def gen_dir() -> Path:
    from flashinfer.jit import env as jit_env

    return jit_env.FLASHINFER_GEN_SRC_DIR / NAME


def write_instantiations(out: Path) -> list[Path]:
    """One generated .cu per kept launcher (FlashInfer's write_file, its launcher .inl), so they
    compile in parallel. write_file leaves a file untouched when its content is unchanged."""
    from flashinfer.jit.gemm.cutlass import generate_kernels as gk

    inl = "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.inl"
    files = []
    for op in kept_operations():
        path = out / f"sm90_mixed_{op.cta_shape[0]}x{op.cta_shape[1]}x{op.cta_shape[2]}_{op.mainloop_schedule.name}.generated.cu"
        gk.write_file([inl], [op], str(path))
        files.append(path)
    return files


TRAP_SOURCE = "trimmed_out.generated.cpp"
TRAP_PREAMBLE = """// Generated by tools/gpu/moe_sm90/build.py: symbols the FlashInfer binding references but this
// trimmed build does not compile (other dtype combinations, tiles and clusters). Each resolves
// (ld --defsym, trimmed_out.rsp) to a stub that names it and aborts, so a trimmed-out path fails
// loudly instead of the whole module failing to load.
#include <cstdio>
#include <cstdlib>
static void layoutc_trimmed_out(const char* symbol) {
  std::fprintf(stderr, "layoutc trimmed SM90 MoE build: %s was not compiled (see tools/gpu/moe_sm90/README.md)\\n", symbol);
  std::abort();
}
"""


def spec(trap_dir: Path | None = None):
    """The trimmed JitSpec: FlashInfer's SM90 spec with its source list replaced."""
    from flashinfer.jit import env as jit_env

    full = full_spec()
    csrc = jit_env.FLASHINFER_CSRC_DIR
    by_rel = {str(p.relative_to(csrc)) if p.is_relative_to(csrc) else str(p): p for p in full.sources}
    missing = [k for k in KEEP if k not in by_rel]
    if missing:
        raise RuntimeError(f"FlashInfer's SM90 fused-MoE spec no longer lists {missing}")
    out = trap_dir or gen_dir()
    out.mkdir(parents=True, exist_ok=True)
    trap = out / TRAP_SOURCE
    if not trap.exists():
        trap.write_text(TRAP_PREAMBLE)
    rsp = out / "trimmed_out.rsp"
    if not rsp.exists():
        rsp.write_text("")
    sources = [by_rel[k] for k in KEEP] + [HERE / "csrc" / "runner_bf16_mxfp4.cu"] + write_instantiations(out) + [trap]
    return dataclasses.replace(
        full, name=NAME, sources=sources,
        extra_cflags=list(full.extra_cflags or []) + EXTRA_FLAGS,
        extra_cuda_cflags=list(full.extra_cuda_cflags or []) + EXTRA_FLAGS,
        # the defsym list is read at link time; the trap stubs are compiled into the module
        extra_ldflags=list(full.extra_ldflags or []) + [f"-Wl,@{rsp}"],
    )


def objects(s) -> list[Path]:
    """Object paths exactly as flashinfer.jit.cpp_ext.generate_ninja_build_for_op names them."""
    return [(s.build_dir / f"{p.parent.name}_{p.stem}{'.cuda.o' if p.suffix == '.cu' else '.o'}").resolve()
            for p in s.sources]


def run_ninja(s, targets: list[Path], jobs: int, deadline: float | None) -> bool:
    """ninja on the given targets; logs each step as it finishes (ninja reports steps on
    completion when not on a terminal) with the elapsed time. Returns False when the deadline
    stopped it: ninja is interrupted, deletes the outputs of the commands it interrupted and keeps
    the finished ones, so the next call resumes. ninja is stopped too if this process is."""
    # -k 0: on an error keep compiling the other units, so one call reports every failure
    cmd = ["ninja", "-C", str(s.build_dir), "-f", str(s.ninja_path), "-j", str(jobs), "-k", "0", *map(str, targets)]
    t0 = time.time()
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    tail: list[str] = []

    def reader() -> None:
        for line in proc.stdout:
            m = re.match(r"\[(\d+)/(\d+) ([\d.]+)s\] (.*)", line)
            if m:
                target = re.search(r" -o (\S+)", m.group(4))
                name = Path(target.group(1)).name if target else m.group(4)[:80]
                log(f"finished {m.group(1)}/{m.group(2)} at +{time.time() - t0:.0f}s: {name}")
                continue
            tail.append(line.rstrip())
            del tail[:-400]
            if "error" in line.lower() or "FAILED" in line:
                print(line.rstrip(), flush=True)

    import threading

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    stopped = False
    try:
        while proc.poll() is None:
            if deadline is not None and time.time() > deadline:
                log("deadline reached: stopping ninja (finished objects are kept; run again to resume)")
                stopped = True
                break
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # ninja interrupts its commands and cleans their outputs
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        thread.join(timeout=5)
    if stopped:
        return False
    if proc.returncode != 0:
        print("\n".join(tail[-200:]), flush=True)
        raise RuntimeError(f"ninja failed (exit {proc.returncode}) after {time.time() - t0:.0f}s")
    return True


def _nm(path: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", "--format=posix", *flags, str(path)], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line and not line.endswith(":")}


def trap_unreachable(s, objs: list[Path]) -> list[str]:
    """Symbols in FlashInfer's namespaces that the objects reference but none defines -> one
    aborting stub each (TRAP_SOURCE) and an ld --defsym per symbol (trimmed_out.rsp)."""
    trap_obj = objects(s)[-1]
    real = [o for o in objs if o != trap_obj]
    undefined: set[str] = set()
    defined: set[str] = set()
    for o in real:
        undefined |= _nm(o, "--undefined-only")
        defined |= _nm(o, "--defined-only")
    # tensorrt_llm:: (mangled "12tensorrt_llm") is FlashInfer's vendored TRT-LLM code; everything
    # else (libc, libstdc++, CUDA, tvm-ffi, nvrtc) is resolved by shared libraries at load time.
    names = sorted(n for n in undefined - defined if "12tensorrt_llm" in n)
    trap_dir = s.sources[-1].parent
    body = [TRAP_PREAMBLE]
    rsp = []
    for i, n in enumerate(names):
        body.append(f'extern "C" void layoutc_trimmed_out_{i}() {{ layoutc_trimmed_out("{n}"); }}\n')
        rsp.append(f"--defsym={n}=layoutc_trimmed_out_{i}")
    text = "".join(body)
    trap = trap_dir / TRAP_SOURCE
    if trap.read_text() != text:
        trap.write_text(text)
    (trap_dir / "trimmed_out.rsp").write_text("\n".join(rsp) + "\n")
    return names


def demangle(names: list[str]) -> list[str]:
    if not names:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False)
    return out.stdout.splitlines() if out.returncode == 0 else names


def build(jobs: int = 16, deadline: float | None = None, objects_only: bool = False, report: Path | None = None):
    """Compile (resumable), trap the trimmed-out symbols, link, load. Returns the module, or None
    when the deadline stopped the build or ``objects_only``."""
    t0 = time.time()
    s = spec()
    s.write_ninja()
    objs = objects(s)
    done = sum(o.exists() for o in objs[:-1])
    log(f"spec {NAME}: {len(s.sources)} sources ({done} objects already built), build dir {s.build_dir}, "
        f"-j{jobs}, spec ready in {time.time() - t0:.1f}s")
    for p in s.sources:
        log(f"  source {p}")
    STATUS.update(objects_total=len(objs) - 1, objects_before=done)
    finished = run_ninja(s, objs[:-1], jobs, deadline)
    STATUS.update(objects_built=sum(o.exists() for o in objs[:-1]), compile_s=round(time.time() - t0, 1))
    if not finished:
        log(f"build incomplete: {STATUS['objects_built']}/{len(objs) - 1} objects after {time.time() - t0:.0f}s")
        return None
    log(f"all {len(objs) - 1} objects built after {time.time() - t0:.0f}s")
    trapped = trap_unreachable(s, objs[:-1])
    log(f"{len(trapped)} trimmed-out symbols resolve to aborting stubs")
    STATUS["trapped_symbols"] = len(trapped)
    if report is not None:
        report.write_text("\n".join(demangle(trapped)) + "\n")
    if objects_only:
        return None
    if not run_ninja(s, [s.jit_library_path], jobs, deadline):
        return None
    undefined = sorted(n for n in _nm(s.jit_library_path, "-D", "--undefined-only") if "12tensorrt_llm" in n)
    if undefined:
        raise RuntimeError(f"{len(undefined)} FlashInfer symbols still undefined in the module: {demangle(undefined)[:10]}")
    size = s.jit_library_path.stat().st_size / 2**20
    log(f"linked {s.jit_library_path.name} ({size:.1f} MiB) after {time.time() - t0:.0f}s")
    STATUS.update(linked_mib=round(size, 2), total_s=round(time.time() - t0, 1))
    module = s.load()
    log(f"loaded after {time.time() - t0:.0f}s")
    return module


def install(module) -> None:
    """Make flashinfer.fused_moe.cutlass_fused_moe (and the interleave helpers) use ``module`` on
    SM90: get_cutlass_fused_moe_module('90') calls core.gen_cutlass_fused_moe_sm90_module(...)
    .build_and_load(); that now returns the module built here instead of starting the full build."""
    from flashinfer.fused_moe import core

    class Built:
        def build_and_load(self):
            return module

    core.gen_cutlass_fused_moe_sm90_module = lambda use_fast_build=False: Built()
    core.get_cutlass_fused_moe_module.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", os.cpu_count() or 1)))
    ap.add_argument("--deadline", type=float, default=None, help="stop ninja at this time.time()")
    ap.add_argument("--objects-only", action="store_true", help="compile, compute the trap list, do not link")
    ap.add_argument("--report", type=Path, default=None, help="write the trimmed-out symbols (demangled) here")
    args = ap.parse_args()
    build(args.jobs, args.deadline, args.objects_only, args.report)


if __name__ == "__main__":
    sys.exit(main())
