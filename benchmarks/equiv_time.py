"""How long `layoutc equiv` takes per shipped spec against its reference recipe (issue 13's target:
under 10 s for four sampled shapes on the 2-core CPU machine, every optional input given).

    .venv/bin/python benchmarks/equiv_time.py [--variants full|all]

Prints one line per spec: seconds, shapes compared, verdict; then the date and the machine."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from layoutc.equiv.compare import equivalent  # noqa: E402
from layoutc.reference import cpu  # noqa: E402

TARGET_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="full", help="which optional-input combinations (full: all given)")
    args = ap.parse_args()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}, variants={args.variants}")
    worst = 0.0
    for spec in sorted((ROOT / "specs").glob("*.lyt")):
        start = time.perf_counter()
        result = equivalent(spec, getattr(cpu, spec.stem), variants=args.variants)
        took = time.perf_counter() - start
        worst = max(worst, took)
        print(f"{spec.stem:36s} {took:6.2f} s  {len(result.shapes)} shapes  {result.verdict()}")
    print(f"slowest {worst:.2f} s; target under {TARGET_S:.0f} s: {'reached' if worst < TARGET_S else 'NOT reached'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
