import sys; sys.path.insert(0, "/tmp/vec")
from cap import *
torch.set_num_threads(1)
spec, x, got = capture(sys.argv[1])
k = spec.module._nb()
for kname, args, total, weight in got:
    src, rows, quads, step, unread, luts, out = args
    order = np.argsort(rows[:, 0], kind="stable")
    rows2 = np.ascontiguousarray(rows[order])
    o2 = out.copy()
    a2 = (src, rows2, quads, step, unread, luts, o2)
    print(kname, rows.shape, quads, step, "rows[:4]", rows[:4].tolist(), "sorted already", bool((order == np.arange(len(order))).all()))
    print(" orig / sorted rows", bench([lambda: k[kname](*args, 0, total), lambda: k[kname](*a2, 0, total)], reps=11))
