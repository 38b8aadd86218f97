import numpy as np, numba

def groups_of(table):
    g = {}
    for i, s in enumerate(table):
        b, x = divmod(s, 8)
        g[(b, i - x)] = g.get((b, i - x), 0) | (1 << i)
    return sorted(g.items())

def expr(table, j):
    terms = []
    for (b, d), m in groups_of(table):
        net = d - 8 * j
        v = f"s{b}"
        if net < 0:
            v = f"({v} >> {-net})"
        elif net > 0:
            v = f"({v} << {net})"
        terms.append(f"({v} & {m:#x})")
    return " | ".join(terms)

TEMPLATE = '''
def kernel(src, qsrc, qdst, span, outer, shift, copies, out, lo, hi):
    n = src.shape[0]
    nq = qsrc.shape[0]
    blocks = outer.shape[0]
    s = np.empty((4, {T}), dtype=np.uint32)
    a = np.empty((4, {T}), dtype=np.uint32)
    for e in range(copies):
        for k in range(lo, hi):
            off = outer[k] + e * shift
            if span[0] + off < 0 or span[1] + off >= n:
                return 1
            base = (e * blocks + k) * 4 * nq
            for q0 in range(0, nq, {T}):
                m = min({T}, nq - q0)
                for t in range(m):
                    s[0, t] = src[qsrc[q0 + t, 0] + off]
                    s[1, t] = src[qsrc[q0 + t, 1] + off]
                    s[2, t] = src[qsrc[q0 + t, 2] + off]
                    s[3, t] = src[qsrc[q0 + t, 3] + off]
                s0v = s[0]
                s1v = s[1]
                s2v = s[2]
                s3v = s[3]
{body}
                for t in range(m):
                    q = q0 + t
                    out[base + qdst[q, 0]] = a[0, t]
                    out[base + qdst[q, 1]] = a[1, t]
                    out[base + qdst[q, 2]] = a[2, t]
                    out[base + qdst[q, 3]] = a[3, t]
    return 0
'''

def make(table, T=256):
    body = []
    for j in range(4):
        body.append(f"                aj = a[{j}]")
        body.append(f"                for t in range({T}):")
        body.append(f"                    s0 = s0v[t]\n                    s1 = s1v[t]\n                    s2 = s2v[t]\n                    s3 = s3v[t]")
        body.append(f"                    aj[t] = {expr(table, j)}")
    text = TEMPLATE.format(T=T, body="\n".join(body))
    ns = {"np": np}
    exec(text, ns)
    return numba.njit(nogil=True)(ns["kernel"]), text
