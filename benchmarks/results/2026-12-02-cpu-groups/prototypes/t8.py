import sys; sys.path.insert(0, "/tmp/vec")
from cap import *
import gen2, re
from collections import Counter
torch.set_num_threads(1)
spec, x, got = capture(sys.argv[1])
k = spec.module._nb()
TABLE = eval(sys.argv[2])
kern, text = gen2.make(TABLE)
for kname, args, total, weight in got:
    old = k[kname]
    src, qsrc, qdst, span, outer, shift, copies, luts, out = args
    out2 = out.copy()
    a2 = (src.view(np.uint32), qsrc, qdst, span, outer, shift, copies, out2)
    old(*args, 0, total); kern(*a2, 0, total)
    print("equal", np.array_equal(out, out2))
    c = torch.from_numpy(src)
    print(kname, "old / gen / clone", bench([lambda: old(*args, 0, total), lambda: kern(*a2, 0, total), lambda: c.clone()]))
asm = kern.inspect_asm(kern.signatures[0])
print(Counter(re.findall(r"\n\s+(v\w+)\s", asm)).most_common(20))
