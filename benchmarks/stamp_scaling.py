"""Host time of the provenance stamp with many converted layers alive (issue 15, host time).

    python benchmarks/stamp_scaling.py [--device cpu]

Every ``convert`` records its outputs in a process-wide registry (layoutc.runtime.guard_rt._stamp);
a model's converted layers stay alive, so the registry holds six records per layer. With 0, 36,
200 and 1000 layers' records alive, ``--reps`` more layers are stamped and kept: the median, mean
(sweeps included) and longest stamp of six outputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from layoutc.runtime import guard_rt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    reg = guard_rt._provenance_registry()
    for layers in (0, 36, 200, 1000):
        reg.records.clear()
        reg.sweep_at = 0  # as in a fresh process
        alive = [{f"t{j}": torch.empty(4, device=args.device) for j in range(6)} for _ in range(layers)]
        for out in alive:
            guard_rt._stamp(out, "s", "h", {}, ())
        # Then `reps` more layers, each stamped once and kept: the registry grows, and the sweeps
        # it triggers are in the mean (the cost per layer of converting a model).
        more = [{f"x{j}": torch.empty(4, device=args.device) for j in range(6)} for _ in range(args.reps)]
        times = []
        for out in more:
            t0 = time.perf_counter()
            guard_rt._stamp(out, "s", "h", {}, ())
            times.append(time.perf_counter() - t0)
        print(f"{layers:5d} layers alive, {args.reps} more stamped: median {statistics.median(times) * 1e6:7.1f} us, "
              f"mean {statistics.fmean(times) * 1e6:7.1f} us, max {max(times) * 1e6:8.1f} us", flush=True)
    reg.records.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
