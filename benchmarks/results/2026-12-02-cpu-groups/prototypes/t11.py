import numpy as np, numba, time, statistics, re
from collections import Counter
import llvmlite.binding as ll
print(ll.get_host_cpu_name(), numba.config.CPU_NAME)
@numba.njit(nogil=True)
def f(s, l0, l1, out):
    for t in range(s.shape[0]):
        v = s[t]
        out[t] = l0[v & 255] | l1[(v >> 8) & 255]
s = np.random.randint(0, 2**31, 1 << 20).astype(np.uint32); l = np.random.randint(0, 2**31, 256).astype(np.uint32)
out = np.empty_like(s)
f(s, l, l, out)
asm = f.inspect_asm(f.signatures[0])
print(Counter(re.findall(r"\n\s+(v\w+)\s", asm)).most_common(12))
