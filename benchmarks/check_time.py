"""How long `layoutc check` and `layoutc check --probe` take per shipped spec (issue 23's target: check under
10 s and check --probe under 60 s for every shipped spec on the 2-core CPU machine).

    .venv/bin/python benchmarks/check_time.py [--no-probe] [--before DIR] [SPEC ...]

Each command runs as the user runs it (``python -m layoutc check -q specs/X.lyt``, a fresh process: imports
included). Prints one line per spec: wall seconds and the CPU seconds of the process (user + system) for
check and for check --probe, and the load average before and after: on a shared machine the wall time
grows with the load, the CPU time much less. ``--before DIR`` also times check with the layoutc package of
another checkout (an older commit), spec by spec in the same run: a before/after comparison under one load."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK_TARGET_S, PROBE_TARGET_S = 10.0, 60.0


def _run(args: list[str], code: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit status) of ``python -m layoutc ARGS`` with ``code`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(code))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # cwd too: ``python -m`` puts the current folder before PYTHONPATH.
    done = subprocess.run([sys.executable, "-m", "layoutc", *args], cwd=code, env=env, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode:  # what failed, on stderr: the table says only the exit status
        sys.stderr.write(done.stderr.decode(errors="replace")[-2000:])
    return wall, cpu, done.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="*", type=Path, help="spec files (default: specs/*.lyt)")
    ap.add_argument("--no-probe", action="store_true", help="time check only")
    ap.add_argument("--before", type=Path, help="a checkout whose layoutc check is timed too, spec by spec")
    args = ap.parse_args()
    specs = [p.resolve() for p in args.specs] or sorted((ROOT / "specs").glob("*.lyt"))
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    print(f"{now}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}" + (f", before: {args.before}" if args.before else ""))
    print(f"{'spec':40}" + (f" {'before s':>8} {'cpu s':>6}" if args.before else "") + f" {'check s':>8} {'cpu s':>6}"
          + ("" if args.no_probe else f" {'probe s':>8} {'cpu s':>6}"))
    worst = [0.0, 0.0]
    for spec in specs:
        line = f"{spec.stem:40}"
        if args.before:
            bwall, bcpu, brc = _run(["check", "-q", str(spec)], args.before)
            line += f" {bwall:8.1f} {bcpu:6.1f}" + ("" if brc == 0 else f" (exit {brc})")
        wall, cpu, rc = _run(["check", "-q", str(spec)], ROOT)
        line += f" {wall:8.1f} {cpu:6.1f}" + ("" if rc == 0 else f" (exit {rc})")
        worst[0] = max(worst[0], cpu)
        if not args.no_probe:
            pwall, pcpu, prc = _run(["check", "-q", "--probe", str(spec)], ROOT)
            line += f" {pwall:8.1f} {pcpu:6.1f}" + ("" if prc == 0 else f" (exit {prc})")
            worst[1] = max(worst[1], pcpu)
        print(line, flush=True)
    probe = "" if args.no_probe else f", probe {worst[1]:.1f} (target {PROBE_TARGET_S:.0f})"
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; slowest CPU s: check {worst[0]:.1f} "
          f"(target {CHECK_TARGET_S:.0f})" + probe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
