"""The guard fingerprint on the CPU: its native kernel against torch's int8 GEMM, in ONE process (issue 25).

    python benchmarks/fp_cpu.py [--mb 27] [--reps 21] [--threads N] [--avx2 3:128,4:128,3:1024] [--old TREE]

Per round, alternating: a clone of the bytes (the floor of a pass over them), ``_fingerprints`` with the native
first product (``layoutc.runtime.fingerprint._fp_rows_native``: AVX-512 VNNI or AVX2 through llvmlite), the same
with ``torch._int_mm`` (the form that runs where the kernel does not), and the first product alone in each form.
Then the byte products a second of the host's form (16 a byte of input) and, for the VNNI form, the instruction's
own throughput on this machine in the same minute: a loop of VPDPBUSD on registers and broadcast loads from L1, 12
independent chains (``peak``), against which the kernel's rate is given (64 products an instruction). ``--avx2``
times the first product of the AVX2 form built with other rows a group and chunks (GROUP:CHUNK pairs; the shipped
one first), in the same rounds, each checked against the shipped one's Y; ``--old`` the first product by the same
form of another checkout's ``layoutc/runtime/cpu_kernels.py`` (before and after in one process), and both ways of
the second product (the float64 GEMM the CPU takes, torch's int8 GEMM) at this layer's rows. Medians of
``--reps`` rounds. Not a test: timings depend on the machine and on what else runs on it (the load average is
printed).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _peak(llvm, seconds: float = 0.3) -> float:
    # VPDPBUSD a second on one thread: 12 chains, operands a register and a 4-byte broadcast from L1
    v, dot, chains = "<16 x i32>", "@llvm.x86.avx512.vpdpbusd.512", 12
    lines = [f"declare {v} {dot}({v}, {v}, {v})", f"define void @f(i64 %n, {v}* %out, i8* %inp) {{", "entry:",
             f"  %ap = bitcast i8* %inp to {v}*", f"  %a = load {v}, {v}* %ap, align 1", "  br label %loop", "loop:",
             "  %i = phi i64 [0, %entry], [%i1, %loop]"]
    lines += [f"  %c{j} = phi {v} [zeroinitializer, %entry], [%d{j}, %loop]" for j in range(chains)]
    lines += ["  %io = and i64 %i, 1023", "  %o = mul i64 %io, 4"]
    for j in range(chains):
        lines += [f"  %o{j} = add i64 %o, {j * 4096}", f"  %q{j} = getelementptr i8, i8* %inp, i64 %o{j}",
                  f"  %w{j} = bitcast i8* %q{j} to i32*", f"  %e{j} = load i32, i32* %w{j}, align 1",
                  f"  %f{j} = insertelement {v} undef, i32 %e{j}, i32 0",
                  f"  %h{j} = shufflevector {v} %f{j}, {v} undef, {v} zeroinitializer",
                  f"  %d{j} = call {v} {dot}({v} %c{j}, {v} %a, {v} %h{j})"]
    lines += ["  %i1 = add i64 %i, 1", "  %e = icmp eq i64 %i1, %n", "  br i1 %e, label %done, label %loop", "done:",
              f"  %s0 = add {v} %d0, %d1"] + [f"  %s{j - 1} = add {v} %s{j - 2}, %d{j}" for j in range(2, chains)]
    lines += [f"  store {v} %s{chains - 2}, {v}* %out, align 1", "  ret void", "}"]
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly("\n".join(lines)), machine)
    engine.finalize_object()
    f = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("f"))
    buf, out = (ctypes.c_int8 * (chains * 4096 + 8192))(), (ctypes.c_int8 * 64)()
    n, rates = 1_000_000, []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        f(n, ctypes.addressof(out), ctypes.addressof(buf))
        rates.append(n * chains / (time.perf_counter() - t0))
    return max(rates)


def _avx2_variants(fp, spec, bulk, y, native):
    # {label: a call of the first product by the AVX2 form built with GROUP rows a group and CHUNK bytes a chunk}
    # for each GROUP:CHUNK of `spec`, each checked to give the shipped kernel's Y
    from layoutc.runtime import cpu_kernels as ck

    out = {}
    if not spec:
        return out
    features, _, _, pack = fp._FP_NATIVE_FORMS["avx2"]
    host = fp._fp_llvm(features)
    if host is None:
        sys.exit("--avx2: the host has no AVX2 (or no llvmlite)")
    fp._fp_rows_native(bulk, y, native)
    want = y.clone()
    saved = dict(fp._FP_NATIVE_FORMS), dict(fp._FP_NATIVE_STATE)
    for pair in spec.split(","):
        group, chunk = (int(t) for t in pair.split(":"))
        fp._FP_NATIVE_FORMS["avx2"] = (features, group, lambda row, g, c=chunk: ck._fp_native_ir_avx2(row, g, c), pack)
        fp._FP_NATIVE_STATE.pop((fp._FP_ROW, fp._FP_COLS, "avx2"), None)
        variant = fp._fp_native("avx2")
        got = y.new_empty(y.shape)
        fp._fp_rows_native(bulk, got, variant)
        assert bool((got == want).all()), f"--avx2 {pair}: not the shipped kernel's Y"
        out[f"first product avx2 {group}:{chunk}"] = lambda v=variant, g=got: fp._fp_rows_native(bulk, g, v)
    fp._FP_NATIVE_FORMS.clear()
    fp._FP_NATIVE_FORMS.update(saved[0])
    fp._FP_NATIVE_STATE.clear()
    fp._FP_NATIVE_STATE.update(saved[1])
    return out


def _old_first(fp, tree, form, bulk, y, native):
    # a call of the first product by form `form` of the kernel in checkout `tree` (its cpu_kernels module loaded
    # from the file, its own rows a group), checked to give this tree's Y
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_cpu_kernels", Path(tree) / "layoutc/runtime/cpu_kernels.py")
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    features, group, make_ir, pack = old._FP_NATIVE_FORMS[form]
    engine = old._fp_jit(*old._fp_llvm(features), make_ir(fp._FP_ROW, group))
    body = engine.get_function_address("fp_body")
    packed = old._fp_aligned(pack(fp._fp_matrix(b"R", fp._FP_ROW, bulk.device).contiguous()).contiguous())
    kernel = (engine, body, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body), packed, group)
    fp._fp_rows_native(bulk, y, native)
    got = y.new_empty(y.shape)
    fp._fp_rows_native(bulk, got, kernel)
    assert bool((got == y).all()), "--old: not this tree's Y"
    return lambda: fp._fp_rows_native(bulk, got, kernel)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=27.0,
                    help="MiB of bytes to fingerprint (a layer at E=8, I=1024, H=2048)")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--avx2", default="", help="GROUP:CHUNK pairs of the AVX2 form to time besides the shipped one")
    ap.add_argument("--old", default="", help="a checkout whose kernel of the host's form to time as well")
    args = ap.parse_args()
    import torch

    from layoutc.runtime import fingerprint as fp

    if args.threads:
        torch.set_num_threads(args.threads)
    native = fp._fp_native()
    if native is None:
        sys.exit("the native fingerprint kernel does not run here (llvmlite, x86-64 with AVX-512 VNNI or AVX2)")
    form = next(f for f in fp._FP_NATIVE_FORMS if fp._fp_native(f) is native)
    import llvmlite.binding as llvm

    x = torch.randint(-128, 128, (int(args.mb * 2**20),), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    rows = x.numel() // fp._FP_ROW
    bulk, y = x[: rows * fp._FP_ROW].view(rows, fp._FP_ROW), torch.empty((rows, fp._FP_COLS), dtype=torch.int32)
    r = fp._fp_matrix(b"R", fp._FP_ROW, x.device)
    state = fp._FP_NATIVE_STATE

    def fingerprint(on):
        key = (fp._FP_ROW, fp._FP_COLS, None)
        state[key] = native if on else None
        try:
            return fp._fingerprints([x])[0]
        finally:
            state[key] = native

    assert fingerprint(True) == fingerprint(False)
    # the int8 GEMM's calls last in a round: a call just after one of them (100+ ms on both cores) took up to 1.3x
    # its time elsewhere in the round
    fns = {"clone": lambda: x.clone(), "fingerprint native": lambda: fingerprint(True),
           "first product native": lambda: fp._fp_rows_native(bulk, y, native)}
    fns.update(_avx2_variants(fp, args.avx2, bulk, y, native))
    if args.old:
        fns["first product old"] = _old_first(fp, args.old, form, bulk, y, native)
    y_bytes = y.view(torch.int8).t().contiguous()
    r2 = fp._fp_blocks(((rows, 0),), rows, rows, x.device, 1)
    fns["second product float64"] = lambda: torch.mm(y_bytes.double(), r2.double()).to(torch.int32)
    fns.update({"second product int8 GEMM": lambda: torch._int_mm(y_bytes, r2),
                "fingerprint int8 GEMM": lambda: fingerprint(False),
                "first product int8 GEMM": lambda: torch._int_mm(bulk, r, out=y)})
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()} "
          f"{llvm.get_host_cpu_name()}, {os.cpu_count()} cpus; threads {torch.get_num_threads()}; torch "
          f"{torch.__version__}; load average {os.getloadavg()}; {x.numel() / 2**20:.1f} MiB, {rows} rows")
    times = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(args.reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for k, ms in med.items():
        print(f"{k:26} {ms:7.3f} ms  ({ms / med['clone']:4.1f}x the clone)")
    threads = min(torch.get_num_threads(), -(-rows // native[4]))
    products = rows * fp._FP_ROW * fp._FP_COLS / (med["first product native"] / 1e3)
    print(f"form {form}: {products / 1e9:.1f} G byte products a second on {threads} threads, "
          f"{products / threads / 1e9:.1f} G a thread; load {os.getloadavg()[0]:.2f}")
    if form == "vnni":  # the instruction's own rate (64 products each), where the host has it
        peak = _peak(llvm)
        rate = products / 64
        print(f"VPDPBUSD alone: {peak / 1e9:.2f} G/s on one thread; the kernel: {rate / 1e9:.2f} G/s on {threads} "
              f"threads = {rate / threads / peak:.0%} of the instruction's rate a thread")


if __name__ == "__main__":
    main()
