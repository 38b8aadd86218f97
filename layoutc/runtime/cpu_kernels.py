"""Kernels of our own on the CPU: LLVM IR compiled in the process, run on torch's threads.

Copied whole into generated converters (before :mod:`layoutc.runtime.fingerprint`; torch, ctypes and the standard
library only). The fingerprint's first product Y = X @ R (X's rows of int8 bytes, R a fixed int8 matrix of 16
columns; :mod:`layoutc.runtime.fingerprint` has the definition) in two forms, the best the host runs taken:

* ``vnni`` (x86-64 with AVX-512 VNNI): one VPDPBUSD multiplies 4 bytes of a row with 16 columns of R at once (64
  products), 8 rows a group sharing each load of R;
* ``avx2`` (x86-64 with AVX2, e.g. a Zen 3 machine): two VPMADDWD multiply 2 bytes of a row, widened to 16 bits,
  with 16 columns (32 products), 3 rows a group, each pair broadcast from a sign-extended copy of the row's chunk
  on the stack. Where AVX-512 VNNI is missing, torch's int8 GEMM has no fast path on the CPU (0.06-0.12 GB/s for a
  layer's 27 MB on the 2-core Zen 3 machine); this form runs at ~7 GB/s on its two cores (BENCHMARKS.md).

Both are exact: every product and every sum is the definition's int32. Each is made from a few integers only (the
row's bytes, rows a group, chains): no text from outside reaches the IR. LLVM compiles it for the host CPU
(llvmlite, numba's own dependency); nothing is cached on disk. The helpers that run a kernel's body on torch's
OpenMP threads (``_fp_gomp``, ``_fp_run_job``) or on Python threads (``_fp_on_threads``) serve the conversion
kernels of :mod:`layoutc.lower.native` and :mod:`layoutc.lower.native_simd` too.
"""

import ctypes

import torch

#: Rows of X one step of the kernel reads together (each 4 bytes of R's 16 columns, loaded once, serve all of
#: them); 16 row streams at the rows' 32 KiB stride took twice the time (one L1 set for all of them).
_FP_NATIVE_GROUP = 8
_FP_NATIVE_CHAINS = 2  # accumulators a row (sums in flight: VPDPBUSD's latency)
#: Rows a group of the AVX2 form: two accumulators of 8 lanes a row, of 16 ymm registers in all (3 and 4 rows ran
#: alike, 2 at 0.8x their speed on the Zen 3 machine; BENCHMARKS.md).
_FP_NATIVE_AVX2_GROUP = 3
#: Bytes of a row the AVX2 form sign-extends to the stack at a time (a group's chunks stay in L1 between its two
#: loops): 64-512 ran alike, 4096 at 0.9x (BENCHMARKS.md).
_FP_AVX2_CHUNK = 128
_FP_NATIVE_STATE = {}  # (row, cols, form): the kernel (or None: it does not run here); "gomp", "pool"
_FP_MOST_SHARED = 256  # compiled kernels shared in a process (each a few hundred KiB of IR text and code)


def _fp_native_ir(row, group, chains):
    # LLVM IR (x86-64, AVX-512 VNNI) of Y = X @ R for X's rows of `row` bytes (a multiple of 64), made from the three
    # integers only. VPDPBUSD multiplies unsigned bytes by signed ones, 4 products summed into each int32 lane: for
    # 4 bytes x[k..k+3] of a row, broadcast to 16 lanes, and R's rows k..k+3 packed as lane c's 4 bytes (R'[k / 4,
    # c, i] = R[k + i, c] + 128, unsigned), the lanes gain sum_i x[k + i] * (R[k + i, c] + 128). So a row's lanes
    # end as Y[m, c] + 128 * sum(x[m]); the row's byte sum (VPDPBUSD of its 64-byte vectors against bytes of 1,
    # in the same loop) is taken away. Exact: the int32 lanes wrap modulo 2^32 (VPDPBUSD, not its saturating form)
    # and Y fits in int32 (the definition's bound); at the shipped row no lane even wraps (<= row * 255 * 128).
    # fp_group(x, r, y, g, n): rows g .. g + group - 1 of the n rows (one past the last reads and writes the last
    # row again: the same values); a loop turn takes 64 bytes of each row, its 16 quads of bytes summed into
    # `chains` accumulators in turn (group * chains chains of VPDPBUSD in flight: one chain waits its latency).
    # fp_body(job): groups from an atomic counter until none is left (job: counter, groups, then the addresses of X,
    # R' and Y and n as int64).
    v, dot = "<16 x i32>", "@llvm.x86.avx512.vpdpbusd.512"
    ones = "<" + ", ".join(["i32 16843009"] * 16) + ">"  # 0x01010101: four unsigned bytes of 1 a lane
    rows, sets = range(group), range(chains)
    lines = [f"declare {v} {dot}({v}, {v}, {v})", f"declare i32 @llvm.vector.reduce.add.v16i32({v})", ""]
    lines += _fp_group_entry_ir(row, group)
    lines += [f"  %a{j}.{h} = phi {v} [zeroinitializer, %entry], [%a{j}.{h}.e, %loop]" for j in rows for h in sets]
    lines += [f"  %s{j} = phi {v} [zeroinitializer, %entry], [%s{j}.e, %loop]" for j in rows]
    last = {(j, h): f"%a{j}.{h}" for j in rows for h in sets}  # each accumulator's latest value
    for i in range(16):
        h = i % chains
        lines += [f"  %k.{i} = add i64 %k, {4 * i}", f"  %ro.{i} = mul i64 %k.{i}, 16",
                  f"  %rp.{i} = getelementptr i8, i8* %r, i64 %ro.{i}", f"  %rq.{i} = bitcast i8* %rp.{i} to {v}*",
                  f"  %rv.{i} = load {v}, {v}* %rq.{i}, align 64"]
        for j in rows:
            got = f"%a{j}.{h}.e" if i + chains >= 16 else f"%b{j}.{i}"  # the turn's last use of this accumulator
            lines += [f"  %q{j}.{i} = getelementptr i8, i8* %p{j}, i64 %k.{i}",
                      f"  %w{j}.{i} = bitcast i8* %q{j}.{i} to i32*",
                      f"  %e{j}.{i} = load i32, i32* %w{j}.{i}, align 1",
                      f"  %f{j}.{i} = insertelement {v} undef, i32 %e{j}.{i}, i32 0",
                      f"  %x{j}.{i} = shufflevector {v} %f{j}.{i}, {v} undef, {v} zeroinitializer",
                      f"  {got} = call {v} {dot}({v} {last[j, h]}, {v} %rv.{i}, {v} %x{j}.{i})"]
            last[j, h] = got
    for j in rows:
        lines += [f"  %sq{j} = getelementptr i8, i8* %p{j}, i64 %k", f"  %sp{j} = bitcast i8* %sq{j} to {v}*",
                  f"  %sv{j} = load {v}, {v}* %sp{j}, align 1",
                  f"  %s{j}.e = call {v} {dot}({v} %s{j}, {v} {ones}, {v} %sv{j})"]
    lines += ["  %k1 = add i64 %k, 64", f"  %end = icmp eq i64 %k1, {row}", "  br i1 %end, label %rest, label %loop",
              "rest:"]
    for j in rows:
        lines += [f"  %t{j}.0 = add {v} %a{j}.0.e, zeroinitializer"]
        lines += [f"  %t{j}.{h} = add {v} %t{j}.{h - 1}, %a{j}.{h}.e" for h in sets if h]
        lines += [f"  %S{j} = call i32 @llvm.vector.reduce.add.v16i32({v} %s{j}.e)", f"  %c{j} = mul i32 %S{j}, 128",
                  f"  %d{j} = insertelement {v} undef, i32 %c{j}, i32 0",
                  f"  %u{j} = shufflevector {v} %d{j}, {v} undef, {v} zeroinitializer",
                  f"  %z{j} = sub {v} %t{j}.{chains - 1}, %u{j}",
                  f"  %yo{j} = mul i64 %m{j}, 16", f"  %yi{j} = getelementptr i32, i32* %y, i64 %yo{j}",
                  f"  %yp{j} = bitcast i32* %yi{j} to {v}*", f"  store {v} %z{j}, {v}* %yp{j}, align 4"]
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n" + _fp_body_ir(group)


def _fp_native_ir_avx2(row, group, chunk=None):
    # LLVM IR (x86-64, AVX2) of Y = X @ R for X's rows of `row` bytes (a multiple of 16), made from the integers
    # only: the form for hosts without AVX-512 VNNI, where torch's int8 GEMM takes its slow path (~0.06-0.12 GB/s on
    # a 2-core AVX2 machine, BENCHMARKS.md). VPMADDWD multiplies 16-bit lanes in pairs and sums each pair into an
    # int32 lane: for pair q of a row (bytes x[2q], x[2q + 1], sign-extended, broadcast to the 8 lanes) and R's rows
    # 2q, 2q + 1 packed as lane c's two 16-bit values (R16[p, b, c, i] = R[2p + i, 8b + c], 64 bytes a pair p:
    # columns 0-7 then 8-15), lane c of the row's accumulator b gains x[2q] R[2q, 8b + c] + x[2q + 1] R[2q + 1, 8b +
    # c]. Exact: every product and pair fits (|x R| <= 2^14), and the sums are the definition's int32 Y.
    # The row goes in chunks of `chunk` bytes (a power of two dividing the row): a first loop sign-extends the
    # chunk of each row of the group into a buffer on the stack, the second broadcasts each pair from there (a
    # broadcast load: no shuffle). Broadcasting pairs from a register took a cross-lane shuffle or two each, the
    # kernel's bound (0.7x the speed, BENCHMARKS.md). fp_group(x, r, y, g, n): rows g .. g + group - 1 of the n rows
    # (one past the last reads and writes the last row again), each with two accumulators of 8 lanes.
    chunk = chunk or _FP_AVX2_CHUNK
    while row % chunk:  # the largest power of two dividing both (16 at least: the row is a multiple of 16)
        chunk //= 2
    v, h, dot = "<8 x i32>", "<16 x i16>", "@llvm.x86.avx2.pmadd.wd"
    rows, acc = range(group), [(j, b) for j in range(group) for b in (0, 1)]
    entry = _fp_group_entry_ir(row, group)
    assert entry[-3:] == ["  br label %loop", "loop:", "  %k = phi i64 [0, %entry], [%k1, %loop]"]
    lines = [f"declare {v} {dot}({h}, {h})", ""] + entry[:-3]
    lines += [f"  %buf = alloca [{group * chunk} x i16], align 64",
              f"  %bb = bitcast [{group * chunk} x i16]* %buf to i16*", "  br label %chunk", "chunk:",
              "  %c0 = phi i64 [0, %entry], [%c1, %chunk.end]"]
    lines += [f"  %A{j}.{b} = phi {v} [zeroinitializer, %entry], [%a{j}.{b}.7, %chunk.end]" for j, b in acc]
    # the chunk of each row, sign-extended into the buffer (row j at j * chunk), 16 bytes a turn
    lines += ["  br label %widen", "widen:", "  %kw = phi i64 [0, %chunk], [%kw1, %widen]", "  %kx = add i64 %c0, %kw"]
    for j in rows:
        lines += [f"  %q{j} = getelementptr i8, i8* %p{j}, i64 %kx", f"  %w{j} = bitcast i8* %q{j} to <16 x i8>*",
                  f"  %xv{j} = load <16 x i8>, <16 x i8>* %w{j}, align 1", f"  %xs{j} = sext <16 x i8> %xv{j} to {h}",
                  f"  %bo{j} = add i64 %kw, {j * chunk}", f"  %bq{j} = getelementptr i16, i16* %bb, i64 %bo{j}",
                  f"  %bp{j} = bitcast i16* %bq{j} to {h}*", f"  store {h} %xs{j}, {h}* %bp{j}, align 32"]
    lines += ["  %kw1 = add i64 %kw, 16", f"  %wend = icmp eq i64 %kw1, {chunk}",
              "  br i1 %wend, label %loop.pre, label %widen", "loop.pre:", "  br label %loop", "loop:",
              "  %k = phi i64 [0, %loop.pre], [%k1, %loop]"]
    lines += [f"  %a{j}.{b} = phi {v} [%A{j}.{b}, %loop.pre], [%a{j}.{b}.7, %loop]" for j, b in acc]
    lines += ["  %kr = add i64 %c0, %k", "  %rk = mul i64 %kr, 32"]
    last = {(j, b): f"%a{j}.{b}" for j, b in acc}
    for q in range(8):
        for b in (0, 1):
            lines += [f"  %ro{q}.{b} = add i64 %rk, {64 * q + 32 * b}",
                      f"  %rp{q}.{b} = getelementptr i8, i8* %r, i64 %ro{q}.{b}",
                      f"  %rq{q}.{b} = bitcast i8* %rp{q}.{b} to {h}*",
                      f"  %rv{q}.{b} = load {h}, {h}* %rq{q}.{b}, align 32"]
        for j in rows:
            lines += [f"  %eo{j}.{q} = add i64 %k, {j * chunk + 2 * q}",
                      f"  %eq{j}.{q} = getelementptr i16, i16* %bb, i64 %eo{j}.{q}",
                      f"  %ep{j}.{q} = bitcast i16* %eq{j}.{q} to i32*",
                      f"  %e{j}.{q} = load i32, i32* %ep{j}.{q}, align 4",
                      f"  %f{j}.{q} = insertelement {v} undef, i32 %e{j}.{q}, i32 0",
                      f"  %s{j}.{q} = shufflevector {v} %f{j}.{q}, {v} undef, {v} zeroinitializer",
                      f"  %t{j}.{q} = bitcast {v} %s{j}.{q} to {h}"]
            for b in (0, 1):
                lines += [f"  %d{j}.{q}.{b} = call {v} {dot}({h} %t{j}.{q}, {h} %rv{q}.{b})",
                          f"  %a{j}.{b}.{q} = add {v} {last[j, b]}, %d{j}.{q}.{b}"]
                last[j, b] = f"%a{j}.{b}.{q}"
    lines += ["  %k1 = add i64 %k, 16", f"  %end = icmp eq i64 %k1, {chunk}",
              "  br i1 %end, label %chunk.end, label %loop", "chunk.end:", f"  %c1 = add i64 %c0, {chunk}",
              f"  %cend = icmp eq i64 %c1, {row}", "  br i1 %cend, label %rest, label %chunk", "rest:"]
    for j, b in acc:
        lines += [f"  %yo{j}.{b} = mul i64 %m{j}, 16", f"  %yb{j}.{b} = add i64 %yo{j}.{b}, {8 * b}",
                  f"  %yi{j}.{b} = getelementptr i32, i32* %y, i64 %yb{j}.{b}",
                  f"  %yp{j}.{b} = bitcast i32* %yi{j}.{b} to {v}*",
                  f"  store {v} %a{j}.{b}.7, {v}* %yp{j}.{b}, align 4"]
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n" + _fp_body_ir(group)


def _fp_group_entry_ir(row, group):
    # The start of fp_group(x, r, y, g, n) in either form, to its loop's counter: row j of the group is %m{j} (row
    # g + j, or the last row where that is past it) at %p{j}; the loop's %k counts bytes of a row from 0.
    lines = ["define void @fp_group(i8* %x, i8* %r, i32* %y, i64 %g, i64 %n) {", "entry:", "  %last = sub i64 %n, 1"]
    for j in range(group):
        lines += [f"  %i{j} = add i64 %g, {j}", f"  %in{j} = icmp slt i64 %i{j}, %n",
                  f"  %m{j} = select i1 %in{j}, i64 %i{j}, i64 %last", f"  %o{j} = mul i64 %m{j}, {row}",
                  f"  %p{j} = getelementptr i8, i8* %x, i64 %o{j}"]
    return lines + ["  br label %loop", "loop:", "  %k = phi i64 [0, %entry], [%k1, %loop]"]


def _fp_body_ir(group):
    # LLVM IR of fp_body(job), the part of a native kernel (either form) each thread runs: groups of `group` rows
    # from an atomic counter until none is left, each by the form's fp_group. The job is (counter, groups, R', then
    # per segment: groups up to its end, X, Y, rows), as int64; a group number from the counter is found in the
    # segments' table by a scan (a layer has a few segments; a group is a few rows).
    lines = ["", "define void @fp_body(i64* %job) {", "entry:",
              "  %groups.at = getelementptr i64, i64* %job, i64 1", "  %groups = load i64, i64* %groups.at",
              "  %r.at = getelementptr i64, i64* %job, i64 2", "  %r.v = load i64, i64* %r.at",
              "  %r = inttoptr i64 %r.v to i8*", "  br label %take", "take:",
              "  %k = atomicrmw add i64* %job, i64 1 monotonic",
              "  %more = icmp slt i64 %k, %groups", "  br i1 %more, label %find, label %out", "find:",
              "  %at = phi i64 [3, %take], [%at1, %find]", "  %from = phi i64 [0, %take], [%end, %find]",
              "  %end.at = getelementptr i64, i64* %job, i64 %at", "  %end = load i64, i64* %end.at",
              "  %at1 = add i64 %at, 4", "  %here = icmp slt i64 %k, %end", "  br i1 %here, label %run, label %find",
              "run:"]
    for i, name in enumerate(("x", "y", "n"), 1):
        lines += [f"  %{name}.o = add i64 %at, {i}", f"  %{name}.at = getelementptr i64, i64* %job, i64 %{name}.o",
                  f"  %{name}.v = load i64, i64* %{name}.at"]
    lines += ["  %x = inttoptr i64 %x.v to i8*", "  %y = inttoptr i64 %y.v to i32*", "  %kk = sub i64 %k, %from",
              f"  %g = mul i64 %kk, {group}", "  call void @fp_group(i8* %x, i8* %r, i32* %y, i64 %g, i64 %n.v)",
              "  br label %take", "out:", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def _fp_pack_vnni(r):
    # R' for the VNNI form from R (rows x 16 int8): R's rows k .. k + 3 as lane c's 4 bytes, + 128 (unsigned)
    return (r.to(torch.int16).view(r.shape[0] // 4, 4, r.shape[1]).permute(0, 2, 1) + 128).to(torch.uint8)


def _fp_pack_avx2(r):
    # R16 for the AVX2 form from R (rows x 16 int8): R's rows 2p, 2p + 1 as lane c's two 16-bit values, columns 0-7
    # then 8-15
    return r.to(torch.int16).view(r.shape[0] // 2, 2, 2, 8).permute(0, 2, 3, 1)


def _fp_aligned(t, align=64):
    # t, or a copy of it at an address that is a multiple of `align` bytes: both forms load R with aligned vector
    # loads (align 64 / 32 in their IR), which fault on another address. torch's CPU allocator gives 64-byte
    # aligned storage, so this copies nothing unless that ever changes.
    if t.data_ptr() % align == 0:
        return t
    room = torch.empty(t.numel() * t.element_size() + align, dtype=torch.uint8)
    skip = -room.data_ptr() % align
    out = room[skip: skip + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return out.copy_(t)


#: The native kernel's forms, best first: name -> (LLVM features the host needs, rows a group, the IR from the row
#: and the group, R packed for it). VNNI: one VPDPBUSD for 4 bytes of a row and 16 columns (64 products), 8 rows
#: a group (16 accumulators of 32 zmm registers); AVX2: two VPMADDWD for 2 bytes of a row (32 products), 3 rows
#: (6 accumulators of 16 ymm registers).
_FP_NATIVE_FORMS = {
    "vnni": (("avx512f", "avx512bw", "avx512vnni"), _FP_NATIVE_GROUP,
             lambda row, group: _fp_native_ir(row, group, _FP_NATIVE_CHAINS), _fp_pack_vnni),
    "avx2": (("avx2",), _FP_NATIVE_AVX2_GROUP, _fp_native_ir_avx2, _fp_pack_avx2),
}


def _fp_llvm(needs):
    """``(llvmlite.binding, the host's features)`` where llvmlite imports and the host is x86-64 with every
    feature named in ``needs`` (as LLVM names them: what the CPU and the OS's saved registers support), else
    None. The kernels of our own (this one, :mod:`layoutc.lower.native`'s SIMD one) are LLVM IR for such hosts."""
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return None
    if llvm.get_process_triple().split("-")[0] not in ("x86_64", "amd64"):
        return None
    features = llvm.get_host_cpu_features()
    return (llvm, features) if all(features.get(f, False) for f in needs) else None


def _fp_jit(llvm, features, ir, optimize=False):
    """An MCJIT engine of the LLVM IR text ``ir``, compiled for the host CPU. Never cached on disk; shared in the
    process by every converter that asks for the same text (kept in llvmlite's module namespace, as numba keeps its
    compiled kernels in its own: a converter module is standalone, and each carries these functions): a second
    converter of the same kernels compiles none (25-100 ms a kernel). The key is the whole text, the features and
    ``optimize``, so machine code is shared only where it was made from the same IR. ``optimize``: LLVM's O3
    pipeline runs on the IR first (the scalar kernels of :mod:`layoutc.lower.native_ir`, written plainly and left
    to it; the SIMD kernels' IR is laid out by hand)."""
    # the dict's name is versioned with what an entry is and how it was made: a converter of another layoutc that
    # compiles otherwise (options, pipeline, what it stores) keeps its own
    shared = llvm.__dict__.setdefault("_layoutc_engines_v1", {})
    key = (ir, llvm.get_host_cpu_name(), features.flatten(), "opt3", "O3" if optimize else "")
    got = shared.get(key)
    if got is not None:
        return got
    try:
        llvm.initialize()  # llvmlite < 0.45 needs it; later ones initialise themselves and raise here
    except RuntimeError:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features.flatten(), opt=3)
    module = llvm.parse_assembly(ir)
    module.verify()
    if optimize:
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    if len(shared) < _FP_MOST_SHARED:  # past it (plans of many forms) each caller keeps its own
        shared[key] = engine
    return engine


def _fp_gomp():
    """``GOMP_parallel`` of the OpenMP runtime torch runs its CPU ops on (a ctypes function), or None: torch's
    parallel backend is not OpenMP, or the process has no such symbol (not Linux or macOS). Looked up once."""
    got = _FP_NATIVE_STATE.get("gomp", False)
    if got is False:
        got = None
        if "parallel backend: OpenMP" in torch.__config__.parallel_info():
            try:  # the runtime torch loaded (its libgomp's symbols are global in the process)
                got = ctypes.CDLL(None).GOMP_parallel
                got.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
                got.restype = None
            except (OSError, AttributeError, TypeError):
                got = None
        _FP_NATIVE_STATE["gomp"] = got
    return got


def _fp_run_job(body, call, job, threads, gomp):
    """A kernel of our own's body (its address ``body`` and a ctypes function ``call`` of it, each taking the job's
    address) on ``threads`` threads, each taking its share of the job from the job's own counter: the calling thread
    alone, one region of ``gomp`` (torch's ``GOMP_parallel``), or, where None, the calling thread and Python worker
    threads (the ctypes call releases the GIL). ``job``: a ctypes array, alive until this returns."""
    at = ctypes.addressof(job)
    if threads == 1:
        call(at)
    elif gomp is not None:
        gomp(body, at, threads, 0)
    else:
        _fp_on_threads(lambda: call(at), threads)


def _fp_on_threads(fn, threads):
    """``fn()`` at once on the calling thread and on ``threads - 1`` Python worker threads (one pool a process,
    grown as needed; also the native conversion kernels' where they do not run on OpenMP): the results, the
    calling thread's first. ``fn`` takes its share of the work itself (a shared counter)."""
    pool = _FP_NATIVE_STATE.get("pool")
    if pool is None or pool._max_workers < threads - 1:
        import concurrent.futures

        pool = _FP_NATIVE_STATE["pool"] = concurrent.futures.ThreadPoolExecutor(threads - 1)
    futures = [pool.submit(fn) for _ in range(threads - 1)]
    return [fn()] + [f.result() for f in futures]
