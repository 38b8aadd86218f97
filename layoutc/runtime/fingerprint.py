"""Fingerprints of tensor bytes: a digest of every byte, computed on the device that holds them.

Copied into generated converters (torch and the standard library only). The guard uses them to
follow converted bytes through copies (``clone``, ``.to(device)``, ``copy_``): a copy is accepted
when its fingerprint is that of a tensor layoutc converted (or a checkpoint it trusted).

Definition (scheme ``layoutc-fp1``), for a tensor's N bytes in row-major order:

* the bytes, as int8, cut into segments of at most ``_FP_SEGMENT_ROWS * _FP_ROW`` bytes, each segment into
  rows of ``_FP_ROW`` bytes (32 KiB) (the last row padded with zeros): a matrix X of at most 2^16 rows;
* Y = X @ R, R a fixed ``_FP_ROW x 16`` int8 matrix: exact in int32 (|sum| <= 2^15 * 2^14 = 2^29);
* Z = bytes(Y)^T @ R2[:rows], bytes(Y) the int8 view of Y (``[rows, 64]``), R2 a fixed
  ``2^16 x 16`` int8 matrix: exact in int32 (|sum| <= 2^16 * 2^14 = 2^30);
* the fingerprint is ``layoutc-fp1:`` + sha256(scheme, N, every segment's Z as little-endian int32).

R and R2 are SHAKE-256 output of a fixed seed, so the value is the same in every process, on every
device and in a manifest written by ``layoutc convert``. Both products are integer GEMMs on the
bytes where they lie (``torch._int_mm``: cuBLAS int8 on CUDA, zero-copy views of the tensor), with
no rounding anywhere, so the CPU and the GPU compute the same integers (on the CPU the second product, a few
rows, is a float64 GEMM instead: every integer in it, at most 2^30, is exact in float64). The only host work is
reading back Z (4 KiB per 2 GiB segment) and one sha256 of it, once. On CUDA a product's K axis is
cut into parts summed afterwards (:func:`_fp_mm`: more thread blocks for cuBLAS, the same integers),
and Z is copied to pinned host memory in the stream's order, so reading it back waits on nothing else.
On the CPU, where llvmlite imports and the CPU is x86-64 with AVX-512 VNNI or AVX2, the first product is a kernel of
our own instead (``_fp_native_ir`` for VNNI, ``_fp_native_ir_avx2`` for AVX2: LLVM IR compiled in the process, no text
from outside in it; ``LAYOUTC_FP_NATIVE=0`` turns it off): the same exact int32 sums, in half oneDNN's time with VNNI
and ~50 times faster than torch's int8 GEMM without it (which has no fast path there: 0.06-0.12 GB/s on a 2-core
Zen 3 machine, the AVX2 kernel ~7 GB/s), on torch's OpenMP threads; every first product of a
batch (a layer's tensors) in one run of it (one table of segments, one OpenMP region), each segment's whole rows
where they lie and only the rests of rows staged: 0.86-0.93x the time of a run per tensor with small ones staged,
0.68-0.85x on a 16-core host (BENCHMARKS.md).
On CUDA, where Triton imports, the two products run as two Triton kernels instead (``_fp_rows_kernel``, one launch
per segment, its last row's padding a load mask; ``_fp_z_kernel``, one launch for every segment): the same exact
int32 sums, with no staging copy, no transposed copy of Y and no cuBLAS call per segment.

Strength: for two different byte strings of one length, over the choice of R and R2, the chance of
equal fingerprints is at most 2 * 256^-16 = 2^-127 (a row differs, so some product column differs
unless a uniform int8 entry hits one value: 1/256 per column, 16 independent columns; the same for
the bytes of Y against R2). That bound holds for any change made without regard to R and R2 (bugs,
lost layouts, corruption, edits): it is a universal hash, not a cryptographic one. R and R2 are
public; someone who wants a collision can solve a linear system for one. The guard does not defend
against that adversary: one who can write the bytes can as well edit them through ``.data`` or
rewrite the manifest beside a checkpoint.
"""

import ctypes
import hashlib
import linecache
import os

import torch

from .cpu_kernels import _FP_NATIVE_FORMS, _FP_NATIVE_STATE, _fp_aligned, _fp_gomp, _fp_jit, _fp_llvm, _fp_run_job

_FP_SCHEME = "layoutc-fp1"
#: Bytes per row of the first product (a multiple of 8, at most 2^17 for exact int32 sums).
_FP_ROW = 1 << 15
#: Columns of R and R2 (a multiple of 8: cuBLAS int8 GEMMs need it).
_FP_COLS = 16
#: Rows per segment (at most 2^16 for exact int32 sums in the second product): 2 GiB per segment.
_FP_SEGMENT_ROWS = 1 << 16
#: Fewest rows an int8 GEMM takes straight from a tensor, per device type (cuBLAS needs more than
#: 16; the CPU takes any): the rows of a smaller part go through a zero-padded staging buffer.
_FP_MIN_ROWS = {"cuda": 17}
#: Fewest rows a segment goes through an int8 GEMM of its own with, per device type (else staged with the other
#: small ones: one GEMM). On the CPU each call costs ~0.13 ms whatever its rows (2.6 us a row after that):
#: a layer's scales and biases took 4 of its 7 calls and a fifth of its fingerprint time. (Not for the CPU's native
#: kernel, which takes every whole row where it lies, all segments in one run.)
_FP_OWN_ROWS = {"cuda": 17, "cpu": 64}
_FP_SEED = b"layoutc fingerprint v1 "

#: Rows of an int8 GEMM's first operand below which _fp_mm cuts its K axis into parts, per device type (none:
#: never), and the most parts.
_FP_SPLIT_ROWS = {"cuda": 1 << 15}
_FP_SPLIT_MOST = 8
#: Rows of Y (and of the second product's K) a multiple of this, per device type (8 elsewhere).
_FP_ROWS_MULTIPLE = {"cuda": 256}

_FP_MATRICES = {}
_FP_BLOCKS = {}
#: Bytes of a widened copy of R2's blocks (the CPU's second product) kept per layout, at most: larger batches (many
#: segments) widen theirs per call rather than hold 8 bytes an int8 entry for each of 64 layouts
_FP_WIDE_KEPT = 1 << 23
_FP_ZEROS = {}

#: On CUDA, both products by Triton kernels (_fp_products_triton) where Triton imports, unless
#: LAYOUTC_FP_TRITON=0 (read at import): cuBLAS's int8 GEMM of 16 columns streamed a 277 MB output at ~2.4 TB/s and
#: took ~70 us for each small one, and the rests of rows went through a staging copy.
_FP_TRITON = os.environ.get("LAYOUTC_FP_TRITON", "1") != "0"
_FP_TRITON_DEVICES = {"cuda"}  # device types it runs on (tests add "cpu": Triton's interpreter, the same kernel)
_FP_TRITON_STATE = {}  # "kernel": the Triton functions (None: no Triton); launches and segment tables by key
_FP_TRITON_FILE = "<layoutc fingerprint kernel>"
_FP_TRITON_SOURCE = '''
@triton.jit
def _fp_rows_kernel(x_ptr, r_ptr, y_ptr, nbytes, ROW: tl.constexpr, COLS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, PART: tl.constexpr):
    # Y[m] += X[m, k0:k0 + PART] @ R[k0:k0 + PART] for the BLOCK_M rows m of this program, k0 = PART * its
    # second index: X the segment's bytes in rows of ROW (int8; bytes at or past nbytes read as 0, the
    # definition's padding of the last row), R column-major (R[k, n] at n * ROW + k). int8 products summed
    # in int32, added to Y atomically: exact in any order. Rows past the segment's last are not written.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k0 = tl.program_id(1) * PART
    cols = tl.arange(0, COLS)
    acc = tl.zeros((BLOCK_M, COLS), dtype=tl.int32)
    for k in range(0, PART, BLOCK_K):
        ks = k0 + k + tl.arange(0, BLOCK_K)
        at = rows[:, None].to(tl.int64) * ROW + ks[None, :]
        a = tl.load(x_ptr + at, mask=at < nbytes, other=0)
        b = tl.load(r_ptr + cols[None, :] * ROW + ks[:, None])
        acc += tl.dot(a, b, out_dtype=tl.int32)
    inside = rows[:, None].to(tl.int64) * ROW < nbytes
    tl.atomic_add(y_ptr + rows[:, None] * COLS + cols[None, :], acc, mask=inside)


@triton.jit
def _fp_z_kernel(yb_ptr, r2_ptr, z_ptr, seg_ptr, nseg, R2_ROWS: tl.constexpr, COLS: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    # Z_s += bytes(Y[at_s + i])^T @ R2[i] for the BLOCK_R rows i of this program's chunk of segment s (its second
    # index; (at_s, n_s) in the table at seg_ptr, rows i >= n_s read as 0): yb the int8 view of Y, 4 * COLS
    # bytes a row; R2 column-major (R2[i, c] at c * R2_ROWS + i); Z [4 * COLS, COLS * nseg], segment s's block
    # at its columns COLS * s. Exact int32 sums, added atomically.
    s = tl.program_id(1)
    at = tl.load(seg_ptr + 2 * s)
    n = tl.load(seg_ptr + 2 * s + 1)
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    b = tl.arange(0, 4 * COLS)
    c = tl.arange(0, COLS)
    live = i < n
    yb = tl.load(yb_ptr + (at + i)[:, None] * (4 * COLS) + b[None, :], mask=live[:, None], other=0)
    r2 = tl.load(r2_ptr + c[None, :] * R2_ROWS + i[:, None], mask=live[:, None], other=0)
    acc = tl.dot(tl.trans(yb), r2, out_dtype=tl.int32)
    tl.atomic_add(z_ptr + b[:, None] * (COLS * nseg) + COLS * s + c[None, :], acc)
'''
#: Rows of Y per program of _fp_rows_kernel, bytes of a row per step, and the fewest programs a segment's product
#: is cut into along K for (parts of at least _FP_TRITON_LEAST_PART bytes).
_FP_TRITON_BLOCK_M = 64
_FP_TRITON_BLOCK_K = 128
_FP_TRITON_PROGRAMS = 1024
_FP_TRITON_LEAST_PART = 1024
#: Rows of Y per program of _fp_z_kernel; warps per program of both.
_FP_TRITON_BLOCK_R = 256
_FP_TRITON_WARPS = 4


#: On the CPU, the first product by a kernel of our own (layoutc.runtime.cpu_kernels, compiled by llvmlite's LLVM for
#: the host) where the host is x86-64 with AVX-512 VNNI or AVX2 and llvmlite imports, unless LAYOUTC_FP_NATIVE=0 (read
#: at import): oneDNN's int8 GEMM of 16 columns (torch._int_mm) took 1.3-1.4 ms for the first product of a 27 MiB
#: layer on the 2-core Zen 5 machine, the VNNI kernel 0.64-0.74 ms; on the 2-core Zen 3 machine (AVX2, no VNNI)
#: torch's took 225-425 ms, the AVX2 kernel 3.7-4.9 ms (BENCHMARKS.md).
_FP_NATIVE = os.environ.get("LAYOUTC_FP_NATIVE", "1") != "0"

def _fp_native(form=None):
    # (engine, fp_body's address, a ctypes function of it, R packed for the form, rows a group) of the native kernel
    # for the current _FP_ROW: of `form` (a name in _FP_NATIVE_FORMS), or where None the first form the host runs;
    # None where it does not run here (LAYOUTC_FP_NATIVE=0, no llvmlite, not x86-64 with the form's features, a row
    # that is not a multiple of 64, other than 16 columns). Built once per process (a race builds it twice: the same).
    if not _FP_NATIVE:
        return None
    key = (_FP_ROW, _FP_COLS, form)
    if key in _FP_NATIVE_STATE:
        return _FP_NATIVE_STATE[key]
    got = None
    if form is None:  # the first form that runs here (each built once: the same object as asked for by name)
        got = next((k for k in map(_fp_native, _FP_NATIVE_FORMS) if k is not None), None)
    elif _FP_ROW % 64 == 0 and _FP_COLS == 16:
        features, group, make_ir, pack = _FP_NATIVE_FORMS[form]
        host = _fp_llvm(features)
        if host is not None:
            engine = _fp_jit(*host, make_ir(_FP_ROW, group))
            body = engine.get_function_address("fp_body")
            packed = _fp_aligned(pack(_fp_matrix(b"R", _FP_ROW, torch.device("cpu")).contiguous()).contiguous())
            got = engine, body, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body), packed, group
    _FP_NATIVE_STATE[key] = got
    return got


def _fp_rows_native(a, y, native):
    # y = a @ R by the native kernel: a [rows, _FP_ROW] int8 and y [rows, _FP_COLS] int32, contiguous CPU tensors
    # (the kernel reads and writes exactly those bytes). One pair of _fp_rows_native_many's.
    _fp_rows_native_many([(a, y)], native)


def _fp_rows_native_many(pairs, native):
    # y = a @ R for every (a, y) of `pairs` (each as _fp_rows_native's) by one run of the native kernel: groups of
    # rows of every pair from one counter, on torch's threads: one OpenMP region of torch's runtime where it has one
    # (its threads, spinning after a parallel op, take the parts at once), else the calling thread and Python
    # threads (the ctypes call releases the GIL). One region for a layer's tensors, not one each: on 16 threads a
    # region per tensor took 1.2x the time of three (BENCHMARKS.md).
    table, groups = [], 0
    for a, y in pairs:
        rows = a.shape[0]
        if not (a.device.type == y.device.type == "cpu" and a.dtype == torch.int8 and y.dtype == torch.int32
                and a.is_contiguous() and y.is_contiguous() and tuple(a.shape) == (rows, _FP_ROW)
                and tuple(y.shape) == (rows, _FP_COLS)):
            raise ValueError(f"fingerprint kernel: {tuple(a.shape)} {a.dtype} @ R into {tuple(y.shape)} {y.dtype}")
        if rows:
            groups += -(-rows // native[4])
            table += [groups, a.data_ptr(), y.data_ptr(), rows]
    if not groups:
        return
    _, body, call, packed, _ = native
    job = (ctypes.c_int64 * (3 + len(table)))(0, groups, packed.data_ptr(), *table)
    threads = max(1, min(torch.get_num_threads(), groups))
    _fp_run_job(body, call, job, threads, _fp_gomp() if threads > 1 else None)


def _fp_first(a, y):
    # y = a @ R (the first product) for a [rows, _FP_ROW] int8 and y [rows, _FP_COLS] int32 by an int8 GEMM (_fp_mm):
    # where the native kernel does not run (_fp_products_torch runs every first product of a batch by it at once)
    _fp_mm(a, lambda c: _fp_matrix(b"R", _FP_ROW, a.device, c), y)


def _fp_matrix(which, rows, device, split=1):
    # R (b"R") or R2 (b"R2"), SHAKE-256 of the seed: a prefix of the stream for fewer rows. split > 1: R in
    # _fp_mm's split form.
    key = (which, rows, str(device), split)
    m = _FP_MATRICES.get(key)
    if m is None and split > 1:
        m = _FP_MATRICES[key] = _fp_split_form(_fp_matrix(which, rows, device), split)
    if m is None:
        data = bytearray(hashlib.shake_256(_FP_SEED + which).digest(rows * _FP_COLS))
        m = torch.frombuffer(data, dtype=torch.int8).reshape(rows, _FP_COLS).to(device)
        # column-major (the transpose of a contiguous matrix): cuBLAS's fast int8 GEMMs take the
        # second operand so ("TN"); a row-major one is slower, and wrong on some torch versions
        m = _FP_MATRICES[key] = m.t().contiguous().t()
    return m


def _fp_bytes_of(t):
    # The tensor's bytes in row-major order as a flat int8 tensor on a device with int8 GEMMs.
    x = t.detach()
    if x.device.type not in ("cpu", "cuda"):
        x = x.cpu()  # same integers, computed on the host
    if not x.is_contiguous():
        x = x.contiguous()
    x = x.reshape(-1).view(torch.uint8).view(torch.int8)
    if x.is_cuda and x.data_ptr() % 16:
        x = x.clone()  # cuBLAS wants aligned operands; a slice of a larger buffer may _fingerprint_start anywhere
    return x


def _fp_split(m, k, device):
    # How many parts _fp_mm cuts the K axis of an [m, k] @ [k, n] product into: 1 on the CPU; on CUDA the fewest
    # (a power of 2, at most _FP_SPLIT_MOST, each part's K a multiple of 16) that give the product at least
    # _FP_SPLIT_ROWS rows of its first operand. cuBLAS runs an int8 GEMM of few rows and a long K on few
    # thread blocks, each walking all of K: a 17 MB output's GEMM took ~70 us on the H200, a 277 MB one 118 us
    # (benchmarks/single_split.py), where a copy of their bytes takes ~8 and ~60.
    target = _FP_SPLIT_ROWS.get(device.type)
    c = 1
    while target is not None and c < _FP_SPLIT_MOST and m * c < target and k % (32 * c) == 0:
        c *= 2
    return c


def _fp_split_form(b, c):
    # [k, n] -> [k / c, c * n]: column block j holds rows j * k / c ... (j + 1) * k / c of b (column-major, as
    # _fp_matrix lays its matrices out for cuBLAS).
    k, n = b.shape
    m = b.reshape(c, k // c, n).permute(1, 0, 2).reshape(k // c, c * n)
    return m.t().contiguous().t()


def _fp_mm(a, b_of, out=None):
    # a @ b, exact in int32: a [m, k] contiguous int8, b_of(c) the [k, n] int8 matrix (c = 1) or its split form
    # (_fp_split_form). With c parts the product is [m * c, k / c] @ [k / c, c * n] (a's rows cut in c, a view):
    # row i * c + j, column block j is part j's share of row i, and the c shares are summed. The same integers:
    # int32 sums of int8 products are exact in any order (the definition bounds them by 2^30).
    m, k = a.shape
    c = _fp_split(m, k, a.device)
    if c == 1:
        return torch._int_mm(a, b_of(1), out=out) if out is not None else torch._int_mm(a, b_of(1))
    w = torch._int_mm(a.view(m * c, k // c), b_of(c))
    n = w.shape[1] // c
    parts = w.view(m, c, c, n).diagonal(dim1=1, dim2=2)  # [m, n, c]: part j of row i, column block j
    if out is None:
        return parts.sum(-1, dtype=torch.int32)
    return torch.sum(parts, -1, dtype=torch.int32, out=out)


def _fp_zeros(n, device):
    # n zero bytes (a view of one buffer per device, grown as needed, never written): staging's padding.
    z = _FP_ZEROS.get(str(device))
    if z is None or z.numel() < n:
        z = _FP_ZEROS[str(device)] = torch.zeros(max(n, _FP_ROW), dtype=torch.int8, device=device)
    return z[:n]


def _fingerprint_start(tensors):
    """Queue the _fingerprints of ``tensors`` (one device, or several: grouped) without waiting for
    them. Returns a handle for :func:`_fingerprint_finish`."""
    groups, xs = {}, {}
    for i, t in enumerate(tensors):
        if t.is_meta or not t.numel():
            key = "meta" if t.is_meta else "none"
        else:  # the bytes read once (a misaligned CUDA tensor is cloned here: once, not per use)
            xs[i] = _fp_bytes_of(t)
            key = str(xs[i].device)
        groups.setdefault(key, []).append(i)
    parts = []
    for key, idx in groups.items():
        if key in ("none", "meta"):  # no bytes: the fingerprint of none; a meta tensor has none to read
            parts.append((idx, key, [[] for _ in idx], [0 for _ in idx]))
        else:
            parts.append(_fp_start_group([xs[i] for i in idx], idx))
    return parts


def _fp_start_group(xs, idx):
    # One batch of flat int8 byte views (_fp_bytes_of, one device): the products of every segment, Z of segment k
    # in column block k of one matrix (_fp_products_triton on CUDA where it runs, else _fp_products_torch).
    with torch.no_grad():
        device = xs[0].device
        done = _fp_products_triton(xs, device) if device.type in _FP_TRITON_DEVICES else None
        segs, z = done if done is not None else _fp_products_torch(xs, device)
        event = None
        if device.type == "cuda":
            # Z (4 KiB per segment) goes to pinned host memory in the stream's order, and the event marks that
            # copy: reading it back later (_fingerprint_finish, the stamp's _resolve of finished ones) is then a
            # host read. A plain z.cpu() there would wait for everything queued on the caller's stream since,
            # the conversion that is stamping included: every convert call synchronized the device once 64
            # were pending (benchmarks/before_after.py, the default call).
            host = torch.empty(z.shape, dtype=z.dtype, pin_memory=True)
            host.copy_(z, non_blocking=True)
            z = host
            event = torch.cuda.Event()
            event.record()
    cols = [[] for _ in xs]
    for k, (j, _, _, _) in enumerate(segs):
        cols[j].append(k)
    return idx, (z, event), cols, [x.numel() for x in xs]


def _fp_segments(xs):
    # (tensor index, flat bytes) of every segment of the batch, in order.
    seg_bytes = _FP_SEGMENT_ROWS * _FP_ROW
    return [(j, x[s: s + seg_bytes]) for j, x in enumerate(xs) for s in range(0, x.numel(), seg_bytes)]


def _fp_products_torch(xs, device):
    # The products by int8 GEMMs (torch._int_mm): the bulk of every segment straight from the tensor (one
    # GEMM per segment), the rest (a last partial row, or every row of a small segment) through one staging
    # buffer, then one GEMM of Y with R2 laid out per segment in column blocks (_fp_blocks). Y holds the bulk
    # rows of every segment in order, then the staged rows in order, then zero rows: the same integers whichever
    # rows are staged, a row's place in R2 being its place in the tensor. Returns (segments as (tensor index,
    # bytes, bulk rows, staged rows), Z).
    min_rows = _FP_MIN_ROWS.get(device.type, 1)
    # the native kernel takes every segment's whole rows where they lie, all in one run (its cost per call is a
    # job table and one OpenMP region, not oneDNN's ~0.13 ms): only the rests of rows are staged
    native = _fp_native() if device.type == "cpu" else None
    own_rows = 1 if native is not None else _FP_OWN_ROWS.get(device.type, min_rows)
    firsts = []  # (X, Y) of every first product, run at the end: one run of the native kernel, or a GEMM each
    segs = []
    for j, part in _fp_segments(xs):
        full = part.numel() // _FP_ROW
        bulk = full if full >= own_rows else 0
        segs.append((j, part, bulk, -(-(part.numel() - bulk * _FP_ROW) // _FP_ROW)))
    bulk_rows = sum(b for _, _, b, _ in segs)
    staged = sum(st for _, _, _, st in segs)
    pad = 0 if staged == 0 else max(min_rows, staged)
    # the second product needs a multiple of 8 rows; on CUDA of 256, so that _fp_mm can cut its K (these rows)
    # in 8 (zero rows of X and of R2's blocks add nothing)
    pad += (-(bulk_rows + pad)) % _FP_ROWS_MULTIPLE.get(device.type, 8)
    rows = bulk_rows + pad
    y = torch.empty((rows, _FP_COLS), dtype=torch.int32, device=device)
    at = 0
    for _, part, bulk, _ in segs:
        if bulk:
            firsts.append((part[: bulk * _FP_ROW].view(bulk, _FP_ROW), y[at: at + bulk]))
            at += bulk
    if staged:
        # The rests one after the other, each from a row's start, zeros between and after: one copy (torch.cat
        # of the rests and views of a zero buffer) instead of a zeroed buffer and a copy per rest.
        pieces = []
        for _, part, bulk, st in segs:
            if st:
                rest = part[bulk * _FP_ROW:]
                pieces += [rest, _fp_zeros(st * _FP_ROW - rest.numel(), device)]
        pieces.append(_fp_zeros((pad - staged) * _FP_ROW, device))
        buf = torch.cat([p for p in pieces if p.numel()]).view(pad, _FP_ROW)
        firsts.append((buf, y[bulk_rows:]))
    elif pad:
        y[bulk_rows:].zero_()
    if native is not None:
        _fp_rows_native_many(firsts, native)
    else:
        for a, part_y in firsts:
            _fp_first(a, part_y)
    layout = tuple((bulk, st) for _, _, bulk, st in segs)
    if device.type == "cpu":
        # Z in float64 on the CPU: exact (every product and sum is an integer of at most 2^30, the definition's
        # bound, and float64 holds every integer up to 2^53), and 0.08 ms for a layer's 864 rows where torch's
        # int8 GEMM took 0.29 (2-core Zen 3 machine, no VNNI; BENCHMARKS.md). Y's bytes widened where they lie and
        # transposed as a view, R2's blocks widened once per layout (kept up to _FP_WIDE_KEPT bytes): a widening of
        # a transposed view took ~0.2 ms on its own (0.22-0.28 -> 0.15-0.21 ms a layer on the 2-core Zen 4 machine,
        # BENCHMARKS.md)
        return segs, torch.mm(y.view(torch.int8).double().t(),
                              _fp_blocks(layout, rows, bulk_rows, device, 1, torch.float64)).to(torch.int32)
    y_bytes = y.view(torch.int8).t().contiguous()
    return segs, _fp_mm(y_bytes, lambda c: _fp_blocks(layout, rows, bulk_rows, device, c))


def _fp_triton():
    # The Triton functions (_fp_rows_kernel, _fp_z_kernel), or None (no Triton, or LAYOUTC_FP_TRITON=0).
    if "kernel" not in _FP_TRITON_STATE:
        kernel = None
        if _FP_TRITON:
            try:
                import triton
                import triton.language as tl
            except ImportError:
                triton = None
            if triton is not None:
                namespace = {"triton": triton, "tl": tl, "__name__": _FP_TRITON_FILE}
                source = _FP_TRITON_SOURCE
                linecache.cache[_FP_TRITON_FILE] = (len(source), None, source.splitlines(True), _FP_TRITON_FILE)
                exec(compile(source, _FP_TRITON_FILE, "exec"), namespace)
                kernel = (namespace["_fp_rows_kernel"], namespace["_fp_z_kernel"])
        _FP_TRITON_STATE["kernel"] = kernel
    return _FP_TRITON_STATE["kernel"]


def _fp_products_triton(xs, device):
    # The products by the Triton kernels: Y by _fp_rows_kernel, one launch per segment, every row of a segment
    # (its last one padded with zeros by the kernel's mask) in order; then Z of every segment by one launch of
    # _fp_z_kernel. Returns _fp_products_torch's (segments, Z), or None where the kernels do not run here.
    kernels = _fp_triton()
    if kernels is None or _FP_ROW % _FP_TRITON_BLOCK_K or _FP_COLS * 4 % 16:
        return None
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):  # Triton launches on the current device (and its current stream)
            return _fp_products_triton(xs, device)
    segs = [(j, part, -(-part.numel() // _FP_ROW), 0) for j, part in _fp_segments(xs)]
    rows = sum(n for _, _, n, _ in segs)
    y = torch.zeros((rows, _FP_COLS), dtype=torch.int32, device=device)
    r = _fp_matrix(b"R", _FP_ROW, device)
    at = 0
    for _, part, n, _ in segs:
        tiles = -(-n // _FP_TRITON_BLOCK_M)
        split = 1  # K cut in parts until the segment has enough programs (parts of at least the least part)
        while tiles * split < _FP_TRITON_PROGRAMS and _FP_ROW // (2 * split) >= max(_FP_TRITON_LEAST_PART,
                                                                                   _FP_TRITON_BLOCK_K):
            split *= 2
        _fp_launch(kernels[0], (tiles, split), (part, r, y[at: at + n], part.numel()),
                   (_FP_ROW, _FP_COLS, _FP_TRITON_BLOCK_M, _FP_TRITON_BLOCK_K, _FP_ROW // split))
        at += n
    counts = tuple(n for _, _, n, _ in segs)
    table = _fp_segment_table(counts, device)
    z = torch.zeros((4 * _FP_COLS, _FP_COLS * len(segs)), dtype=torch.int32, device=device)
    r2 = _fp_matrix(b"R2", _FP_SEGMENT_ROWS, device)
    _fp_launch(kernels[1], (-(-max(counts) // _FP_TRITON_BLOCK_R), len(segs)),
               (y.view(torch.int8), r2, z, table, len(segs)), (_FP_SEGMENT_ROWS, _FP_COLS, _FP_TRITON_BLOCK_R))
    return segs, z


def _fp_segment_table(counts, device):
    # (first row in Y, rows) of every segment, int64 on the device: one per layout of a batch, kept (a copy to the
    # device per call would cost more than the kernel that reads it).
    key = ("segments", counts, str(device))
    table = _FP_TRITON_STATE.get(key)
    if table is None:
        starts = [sum(counts[:k]) for k in range(len(counts))]
        table = torch.tensor([v for pair in zip(starts, counts) for v in pair], dtype=torch.int64).to(device)
        _fp_keep(key, table)
    return table


def _fp_keep(key, value):
    # _FP_TRITON_STATE[key] = value, at most 64 entries besides the kernels
    if len(_FP_TRITON_STATE) >= 64:
        kernels = _FP_TRITON_STATE["kernel"]
        _FP_TRITON_STATE.clear()
        _FP_TRITON_STATE["kernel"] = kernels
    _FP_TRITON_STATE[key] = value


def _fp_launch(kernel, grid, args, consts):
    # `kernel` on `grid` with its arguments and constexprs (in order). Triton's own launch binds and specialises
    # every argument on each call (~20-30 us of host time, seven launches a layer); the compiled kernel it returns
    # is kept per what Triton specialises on here (the kernel, the device, the constexprs, each pointer's 16-byte
    # alignment, each integer's, an integer of 1 and its width: a 2 GiB segment's byte count is past int32) and
    # called directly after (its runner still calls Triton's launch hooks).
    spec = tuple(a.data_ptr() % 16 == 0 if isinstance(a, torch.Tensor) else (a % 16 == 0, a == 1, a < 2**31)
                 for a in args)
    key = ("launch", id(kernel), str(args[0].device), spec, consts, _FP_TRITON_WARPS)
    hit = _FP_TRITON_STATE.get(key)  # (kernel, compiled): the id is compared with the kernel kept
    if hit is not None and hit[0] is kernel:
        hit[1][(grid[0], grid[1], 1)](*args, *consts)
        return
    names = list(kernel.arg_names)[len(args):]
    compiled = kernel[grid](*args, **dict(zip(names, consts)), num_warps=_FP_TRITON_WARPS)
    if args[0].is_cuda and hasattr(compiled, "__getitem__") and getattr(compiled, "function", None):
        _fp_keep(key, (kernel, compiled))


def _fp_blocks(layout, rows, bulk_rows, device, split=1, dtype=None):
    # R2 placed for a batch: column block k holds R2's rows for segment k's rows of Y (its bulk
    # rows, then its staged rows), zeros elsewhere: block k of the product is segment k's Z.
    # split > 1: that matrix in _fp_mm's split form. dtype: that matrix converted (the same integers), kept too.
    key = (layout, rows, bulk_rows, str(device), _FP_ROW, _FP_SEGMENT_ROWS, split, dtype)
    m = _FP_BLOCKS.get(key)
    if m is None and dtype is not None:
        m = _fp_blocks(layout, rows, bulk_rows, device, split).to(dtype)
        if m.numel() * m.element_size() <= _FP_WIDE_KEPT:  # kept where small: a layer's 0.7 MB
            _FP_BLOCKS[key] = m
    if m is None and split > 1:
        m = _FP_BLOCKS[key] = _fp_split_form(_fp_blocks(layout, rows, bulk_rows, device), split)
    if m is None:
        r2 = _fp_matrix(b"R2", _FP_SEGMENT_ROWS, device)
        m = torch.zeros((_FP_COLS * len(layout), rows), dtype=torch.int8, device=device).t()  # column-major
        at, staged_at = 0, bulk_rows
        for k, (bulk, st) in enumerate(layout):
            cols = slice(k * _FP_COLS, (k + 1) * _FP_COLS)
            if bulk:
                m[at: at + bulk, cols] = r2[:bulk]
                at += bulk
            if st:
                m[staged_at: staged_at + st, cols] = r2[bulk: bulk + st]
                staged_at += st
        if len(_FP_BLOCKS) >= 64:
            _FP_BLOCKS.clear()
        _FP_BLOCKS[key] = m
    return m


def _fingerprint_finish(handle, count):
    """The fingerprints (strings) of the tensors given to :func:`_fingerprint_start`, in order: waits
    for the device and reads back the small products."""
    out = [None] * count
    for idx, work, cols, sizes in handle:
        z = None
        if work == "meta":
            continue
        if work != "none":
            z, event = work
            if event is not None:
                event.synchronize()  # the copy into pinned host memory (CUDA) is done
            z = z.cpu()  # a host tensor already on CUDA (no device call) and on the CPU
            # every column block's rows in one piece of memory, one copy for all (not one per block)
            z = z.view(z.shape[0], -1, _FP_COLS).transpose(0, 1).contiguous()
        for i, ks, n in zip(idx, cols, sizes):
            h = hashlib.sha256(f"{_FP_SCHEME}\0{n}\0".encode())
            for k in ks:
                h.update(_host_bytes(z[k]))
            out[i] = f"{_FP_SCHEME}:{h.hexdigest()}"
    return out


def _host_bytes(t):
    # The bytes of a contiguous host tensor, in memory order (the little-endian int32 of the definition on the
    # machines torch runs on): one copy of its memory, where bytes(t.view(uint8).tolist()) made a Python int per
    # byte (~60 us per 4 KiB block: the larger part of a stamp's host time once fingerprints were read back).
    # The tensor is alive and owns its memory for the duration of the read.
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _fingerprints(tensors):
    """The _fingerprints of ``tensors`` (a list), computed where they lie."""
    return _fingerprint_finish(_fingerprint_start(tensors), len(tensors))
