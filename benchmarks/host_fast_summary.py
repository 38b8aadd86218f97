"""Tables of benchmarks/h200_host_fast_run.sh (issue 25, the one-lookup warm call): host time per warm call
before and after, with and without out=, and single calls against a device copy, old and new with and without
out=, from before_after.py's rows (one process, old and new in alternation).

    python benchmarks/host_fast_summary.py RESULTS_FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAN = float("nan")
TARGET_HOST_US = 30.0


def _name(r: dict) -> str:
    return r["spec"] + (" " + ",".join(f"{k}={v}" for k, v in r["params"].items()) if r["params"] else "")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def host(rows: list[dict]) -> None:
    print("== host us per warm call, E=2 I=H=256, fingerprint=False (medians of rounds of 100 calls), one process")
    print(f"{'spec':58s} {'before':>7s} {'after':>7s} | out=: {'before':>7s} {'after':>7s} | default: "
          f"{'before':>7s} {'after':>7s}")
    worst = 0.0
    for r in rows:
        if "error" in r:
            print(f"{_name(r):58s} ERROR {r['error'][:80]}")
            continue
        worst = max(worst, r.get("host_new_out_us", NAN))
        print(f"{_name(r):58s} {r['host_old_us']:7.1f} {r['host_new_us']:7.1f} | {r.get('host_old_out_us', NAN):13.1f} "
              f"{r.get('host_new_out_us', NAN):7.1f} | {r['host_old_fingerprinted_us']:16.1f} "
              f"{r['host_new_fingerprinted_us']:7.1f}")
    print(f"worst after with out=: {worst:.1f} us (target under {TARGET_HOST_US:.0f} us: "
          f"{'reached' if worst < TARGET_HOST_US else 'NOT reached'})")


def single(rows: list[dict]) -> None:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(",".join(f"{k}={v}" for k, v in r["dims"].items()), []).append(r)
    for dims, group in groups.items():
        print(f"== single calls, {dims}: % of a device copy of the same bytes (median of rounds), old / new / "
              f"old out= / new out= | 10 back to back, same | same bytes, fused == eager, out= == new, old out= == new")
        for r in group:
            if "error" in r:
                print(f"{_name(r):58s} ERROR {r['error'][:80]}")
                continue
            pct = [100 * r.get(f"{t}_fraction_of_copy", NAN) for t in ("old", "new", "old_out", "new_out")]
            b2b = [100 * r.get(f"{t}_b2b_fraction_of_copy", NAN) for t in ("old", "new", "old_out", "new_out")]
            print(f"{_name(r):58s} " + " / ".join(f"{v:5.1f}" for v in pct) + " | "
                  + " / ".join(f"{v:5.1f}" for v in b2b) + f" | {r['same_output']!s} {r['new_fused_equals_eager']!s} "
                  f"{r.get('new_out_same_output')!s} {r.get('old_out_same_output')!s}")


def main() -> int:
    folder = Path(sys.argv[1])
    if (folder / "ba_host.jsonl").exists():
        host(_rows(folder / "ba_host.jsonl"))
    if (folder / "ba.jsonl").exists():
        single(_rows(folder / "ba.jsonl"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
