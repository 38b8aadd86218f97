"""Access patterns for the CUTLASS W4A8 weight reorder, timed side by side (issue 24's last speed target).

    python benchmarks/w4a8_walks.py [--dims "E=256,I=2048,H=7168;..."] [--check-only] [--out rows.jsonl]

Each variant is a hand-written Triton kernel of one weight tensor's conversion (the reorder into
CUTLASS's 16x32 atoms, the nibble map of the shipped converter), checked bit for bit against
``specs/vllm_cutlass_w4a8.lyt``'s own converter (its eager lowering) and timed alone, single and 10
back to back, against a device copy of the same bytes. They decide which walk the compiler should
emit; none of them is used by a converter.

The atom: source rows n = 8h + r of a 16-row block, 16 bytes (value columns 32ak .. 32ak + 31) per
row; output: 64 words, word 8r + 2b + a = the 16-bit half (4a + b) of row r, and the same of row
r + 8 above it; atoms in column-major order (along N first).
- ``groups``: the shipped grouped units walk: lane = (atom, r), 128 lanes over 16 atoms along N.
- ``swz TK``: the same per-lane work, lanes ordered with TK atoms along K fastest, so a warp load
  reads TK * 16 contiguous bytes of a row (TK = 8: whole 128-byte lines).
- ``tile TK``: a program loads rows r and r + 8 of one atom row block over TK atoms as two 2-D tiles,
  combines the halves in their load layout and reorders [r, atom, a, b] -> [atom, r, b, a] in
  registers (tl.join / tl.permute / tl.reshape: Triton's layout conversion through shared memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

DIMS = "E=128,I=768,H=2048;E=256,I=2048,H=7168"


@triton.jit
def _nibbles(raw):
    # unified_encode_int4b after the uint4b8 -> int4 step, bit-sliced (the shipped converter's chain)
    x0 = raw & 0x11111111
    x1 = (raw >> 1) & 0x11111111
    x2 = (raw >> 2) & 0x11111111
    x3 = (raw >> 3) & 0x11111111
    m9 = x0 & x3
    o1 = x1 ^ m9
    m10 = x1 & x3
    m11 = x0 & x1 & x3
    o2 = x2 ^ m9 ^ m10 ^ m11
    o3 = x3 ^ 0x11111111
    return x0 | (o1 << 1) | (o2 << 2) | (o3 << 3)


@triton.jit
def _words8(c00, c01, c02, c03, c10, c11, c12, c13):
    w0 = (c00 & 0xffff) | (c10 << 16)
    w1 = (c02 & 0xffff) | (c12 << 16)
    w2 = (c00 >> 16) | (c10 & 0xffff0000)
    w3 = (c02 >> 16) | (c12 & 0xffff0000)
    w4 = (c01 & 0xffff) | (c11 << 16)
    w5 = (c03 & 0xffff) | (c13 << 16)
    w6 = (c01 >> 16) | (c11 & 0xffff0000)
    w7 = (c03 >> 16) | (c13 & 0xffff0000)
    j = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    return j


@triton.jit
def _swz(x_ptr, y_ptr, N: tl.constexpr, K: tl.constexpr, TK: tl.constexpr, L: tl.constexpr):
    """Lane = (atom along K fastest (TK), r, atom along N); TK = 1 with L = 128 is the shipped order."""
    pid = tl.program_id(0)
    KA: tl.constexpr = K // 32
    NA: tl.constexpr = N // 16
    TN: tl.constexpr = L // TK // 8
    lane = tl.arange(0, L)
    kk = lane % TK
    m = lane // TK
    r = m % 8
    an = (pid % (NA // TN)) * TN + m // 8
    rest = pid // (NA // TN)
    ak = (rest % (KA // TK)) * TK + kk
    e = rest // (KA // TK)
    src = (e * N + 16 * an + r).to(tl.int64) * (K // 8) + 4 * ak
    q = tl.arange(0, 4)[None, :]
    l0 = tl.load(x_ptr + src[:, None] + q).to(tl.uint32, bitcast=True)
    l1 = tl.load(x_ptr + src[:, None] + 8 * (K // 8) + q).to(tl.uint32, bitcast=True)
    a0, b0 = tl.split(tl.reshape(l0, [L, 2, 2]))
    c00, c02 = tl.split(a0)
    c01, c03 = tl.split(b0)
    a1, b1 = tl.split(tl.reshape(l1, [L, 2, 2]))
    c10, c12 = tl.split(a1)
    c11, c13 = tl.split(b1)
    w = tl.reshape(_words8(c00, c01, c02, c03, c10, c11, c12, c13), [L, 8])
    w = _nibbles(w)
    g = ((e * KA + ak).to(tl.int64) * NA + an) * 8 + r
    tl.store(y_ptr + g[:, None] * 8 + tl.arange(0, 8)[None, :], w.to(tl.int32, bitcast=True))


@triton.jit
def _tile(x_ptr, y_ptr, N: tl.constexpr, K: tl.constexpr, TK: tl.constexpr):
    """One program: atom row block an, atoms ak0 .. ak0 + TK - 1 along K, as [8, 4 TK] word tiles."""
    pid = tl.program_id(0)
    KA: tl.constexpr = K // 32
    NA: tl.constexpr = N // 16
    an = pid % NA
    rest = pid // NA
    ak0 = (rest % (KA // TK)) * TK
    e = rest // (KA // TK)
    rows = tl.arange(0, 8)[:, None]
    cols = tl.arange(0, 4 * TK)[None, :]
    src = (e * N + 16 * an + rows).to(tl.int64) * (K // 8) + 4 * ak0 + cols
    x0 = _nibbles(tl.load(x_ptr + src).to(tl.uint32, bitcast=True))
    x1 = _nibbles(tl.load(x_ptr + src + 8 * (K // 8)).to(tl.uint32, bitcast=True))
    lo = (x0 & 0xffff) | (x1 << 16)  # b even: halves 0 of the two rows
    hi = (x0 >> 16) | (x1 & 0xffff0000)  # b odd
    j = tl.join(lo, hi)  # [r, 4 TK, bl]
    j = tl.reshape(j, [8, TK, 2, 2, 2])  # r, atom, a, bw, bl
    j = tl.permute(j, (1, 0, 3, 4, 2))  # atom, r, bw, bl, a: word 8r + 4bw + 2bl + a
    w = tl.reshape(j, [TK, 64])
    base = ((e * KA + ak0 + tl.arange(0, TK)).to(tl.int64) * NA + an) * 64
    tl.store(y_ptr + base[:, None] + tl.arange(0, 64)[None, :], w.to(tl.int32, bitcast=True))


def _events(fn, reps=20, calls=1):
    # milliseconds of one call (CUDA events), by `layoutc bench`'s own timing loop
    from layoutc.cli.bench import timeit

    return timeit(fn, "cuda", reps=reps, calls=calls) * 1e3


def variants(n: int, k: int):
    """(name, launch(x, y)) of every variant that fits an [E, n, k/8] tensor."""
    ka, na = k // 32, n // 16
    out = []
    for tk, lanes, warps in ((1, 128, 4), (2, 128, 4), (4, 128, 4), (8, 128, 4), (8, 256, 8), (16, 256, 8),
                             (4, 256, 8)):
        tn = lanes // tk // 8
        if ka % tk or na % tn:
            continue

        def run(x, y, tk=tk, lanes=lanes, warps=warps, tn=tn):
            grid = (x.shape[0] * (na // tn) * (ka // tk),)
            _swz[grid](x, y, n, k, tk, lanes, num_warps=warps)
        out.append((f"swz TK={tk} L={lanes} w={warps}", run))
    for tk, warps in ((8, 4), (16, 4), (16, 8), (32, 8)):
        if ka % tk:
            continue

        def run(x, y, tk=tk, warps=warps):
            _tile[(x.shape[0] * na * (ka // tk),)](x, y, n, k, tk, num_warps=warps)
        out.append((f"tile TK={tk} w={warps}", run))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default=DIMS)
    ap.add_argument("--tree", type=Path, default=Path("."))
    ap.add_argument("--check-only", action="store_true", help="compare with the eager converter, no timing")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import layoutc

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    compiled = layoutc.compile_file(args.tree / "specs" / "vllm_cutlass_w4a8.lyt")
    module = compiled.module if hasattr(compiled, "module") else None
    rows = []
    for dims_text in args.dims.split(";"):
        d = {a: int(b) for a, b in (p.split("=") for p in dims_text.split(","))}
        e, i, h = d["E"], d["I"], d["H"]
        for name, n, k in (("w13_weight_packed", 2 * i, h), ("w2_weight_packed", h, i)):
            gen = torch.Generator(device="cpu").manual_seed(n * 7 + k)
            x = torch.randint(-2**31, 2**31 - 1, (e, n, k // 8), dtype=torch.int32, generator=gen).to(device)
            ref = _reference(compiled, module, name, x, d)
            y = torch.empty_like(x)
            flat = x.view(-1)
            buf = torch.empty_like(flat)
            copy_b2b = None if args.check_only else _events(lambda b=buf, f=flat: b.copy_(f), calls=10)
            copy = None if args.check_only else _events(lambda b=buf, f=flat: b.copy_(f))
            for vname, run in variants(n, k):
                y.fill_(-1)
                run(x, y)
                same = bool(torch.equal(y, ref))
                row = {"dims": d, "tensor": name, "variant": vname, "same": same}
                if not args.check_only and same:
                    one = lambda run=run, x=x, y=y: run(x, y)  # noqa: E731
                    t, t2 = _events(one), _events(one, calls=10)
                    row.update(ms=t, b2b_ms=t2, pct=100 * copy / t, b2b_pct=100 * copy_b2b / t2)
                rows.append(row)
                print(f"{dims_text:24s} {name:18s} {vname:22s} same={same}"
                      + (f"  {row['ms']:.3f} ms ({row['pct']:.1f}%)  b2b {row['b2b_ms']:.3f} ms "
                         f"({row['b2b_pct']:.1f}%)" if "ms" in row else ""), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    for row in rows:
                        f.write(json.dumps(row) + "\n")
                rows = []
            x = y = ref = flat = buf = None
            if device == "cuda":
                torch.cuda.empty_cache()
    return 0


def _reference(compiled, module, name, x, d):
    """The shipped converter's output for tensor ``name`` (the other inputs: zeros of their shapes)."""
    e, i, h = d["E"], d["I"], d["H"]
    dev = x.device
    ins = {"w13_weight_packed": torch.zeros(e, 2 * i, h // 8, dtype=torch.int32, device=dev),
           "w13_weight_scale": torch.zeros(e, 2 * i, h // 128, dtype=torch.float8_e4m3fn, device=dev),
           "w2_weight_packed": torch.zeros(e, h, i // 8, dtype=torch.int32, device=dev),
           "w2_weight_scale": torch.zeros(e, h, i // 128, dtype=torch.float8_e4m3fn, device=dev)}
    ins[name] = x
    lowering = "eager" if dev.type == "cpu" else "fused"
    return compiled.convert(ins, lowering=lowering, fingerprint=False)[name]


if __name__ == "__main__":
    raise SystemExit(main())
