import sys; sys.path.insert(0, "/tmp/vec")
from cap import *
import numba, gen2
torch.set_num_threads(1)
spec, x, got = capture(sys.argv[1])
k = spec.module._nb()
TABLE = eval(sys.argv[2])
body = "\n".join(f"                out[d + {j} * qs] = {gen2.expr(TABLE, j)}" for j in range(4))
text = f'''
def kern(src, qsrc, qd0, qs, span, outer, shift, copies, out, lo, hi):
    n = src.shape[0]; nq = qsrc.shape[0]; blocks = outer.shape[0]
    for e in range(copies):
        for k in range(lo, hi):
            off = outer[k] + e * shift
            if span[0] + off < 0 or span[1] + off >= n:
                return 1
            base = (e * blocks + k) * 4 * nq
            for q in range(nq):
                s0 = src[qsrc[q, 0] + off]; s1 = src[qsrc[q, 1] + off]; s2 = src[qsrc[q, 2] + off]; s3 = src[qsrc[q, 3] + off]
                d = base + qd0[q]
{body}
    return 0
'''
ns = {}; exec(text, ns); kern = numba.njit(nogil=True)(ns["kern"])
for kname, args, total, weight in got:
    old = k[kname]
    src, qsrc, qdst, span, outer, shift, copies, luts, out = args
    qs = int(qdst[0, 1] - qdst[0, 0])
    o1 = out.copy()
    a1 = (src.view(np.uint32), qsrc, qdst[:, 0].copy(), qs, span, outer, shift, copies, o1)
    old(*args, 0, total); kern(*a1, 0, total)
    print("equal", np.array_equal(out, o1))
    print(kname, "old / gen-scalar", bench([lambda: old(*args, 0, total), lambda: kern(*a1, 0, total)]))
