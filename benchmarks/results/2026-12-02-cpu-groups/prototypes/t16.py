import sys; sys.path.insert(0, "/tmp/vec")
from cap import *
import numba
torch.set_num_threads(1)
spec, x, got = capture(sys.argv[1])
m = spec.module
k = m._nb()

@numba.njit(nogil=True)
def pairs_chunked(src, qsrc, qdst, span, outer, order, chunks, shift, copies, luts, out, lo, hi):
    n = src.shape[0]; nq = qsrc.shape[0]; blocks = outer.shape[0]
    for e in range(copies):
        for c in range(lo, hi):
            for i in range(chunks[c], chunks[c + 1]):
                off = outer[order[i]] + e * shift
                if span[0] + off < 0 or span[1] + off >= n:
                    return 1
            for q in range(nq):
                a0 = qsrc[q, 0] + e * shift
                a1 = qsrc[q, 1] + e * shift
                d0 = qdst[q, 0]
                d1 = qdst[q, 1]
                for i in range(chunks[c], chunks[c + 1]):
                    kk = order[i]
                    off = outer[kk]
                    base = (e * blocks + kk) * 2 * nq
                    s0 = src[a0 + off]
                    s1 = src[a1 + off]
                    out[base + d0] = luts[0, s0 & 255] | luts[1, (s0 >> 8) & 255] | luts[2, s1 & 255] | luts[3, (s1 >> 8) & 255]
                    out[base + d1] = luts[0, (s0 >> 16) & 255] | luts[1, (s0 >> 24) & 255] | luts[2, (s1 >> 16) & 255] | luts[3, (s1 >> 24) & 255]
    return 0

@numba.njit(nogil=True)
def quads_chunked(src, qsrc, qdst, span, outer, order, chunks, shift, copies, luts, out, lo, hi):
    n = src.shape[0]; nq = qsrc.shape[0]; blocks = outer.shape[0]
    for e in range(copies):
        for c in range(lo, hi):
            for i in range(chunks[c], chunks[c + 1]):
                off = outer[order[i]] + e * shift
                if span[0] + off < 0 or span[1] + off >= n:
                    return 1
            for q in range(nq):
                a0 = qsrc[q, 0] + e * shift; a1 = qsrc[q, 1] + e * shift; a2 = qsrc[q, 2] + e * shift; a3 = qsrc[q, 3] + e * shift
                for i in range(chunks[c], chunks[c + 1]):
                    kk = order[i]
                    off = outer[kk]
                    base = (e * blocks + kk) * 4 * nq
                    s0 = src[a0 + off]; s1 = src[a1 + off]; s2 = src[a2 + off]; s3 = src[a3 + off]
                    for j in range(4):
                        sh = 8 * j
                        out[base + qdst[q, j]] = (luts[0, (s0 >> sh) & 255] | luts[1, (s1 >> sh) & 255] | luts[2, (s2 >> sh) & 255] | luts[3, (s3 >> sh) & 255])
    return 0

def chunking(outer_w, cap):
    order = torch.argsort(outer_w, stable=True)
    so = outer_w[order]
    near = torch.diff(so) < 16  # words: within a 64-byte line
    cuts = [0]
    run = 1
    for i, nb in enumerate(near.tolist()):
        if not nb or run >= cap:
            cuts.append(i + 1); run = 1
        else:
            run += 1
    cuts.append(len(so))
    return order.to(torch.int32).numpy(), np.array(cuts, dtype=np.int32)

for kname, args, total, weight in got:
    src, qsrc, qdst, span, outer, shift, copies, luts, out = args
    for cap in (64, 16, 8):
        order, chunks = chunking(torch.from_numpy(outer), cap)
        o2 = out.copy()
        f = pairs_chunked if kname == "wpairs" else quads_chunked
        a2 = (src, qsrc, qdst, span, outer, order, chunks, shift, copies, luts, o2)
        k[kname](*args, 0, total); f(*a2, 0, len(chunks) - 1)
        print(kname, "cap", cap, "chunks", len(chunks) - 1, "equal", np.array_equal(out, o2), "plain / chunked", bench([lambda: k[kname](*args, 0, total), lambda: f(*a2, 0, len(chunks) - 1)]))
