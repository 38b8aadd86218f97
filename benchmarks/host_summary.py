"""Tables of an issue 25 run (benchmarks/h200_host_run.sh final): host time per warm call before and after
(benchmarks/host_time.py, tiny layer) and single calls of the FlashInfer specs against a device copy
(benchmarks/before_after.py --out-arg, gpt-oss-120b and -20b layers).

    python benchmarks/host_summary.py RESULTS_FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _name(r: dict) -> str:
    return r["spec"] + (" " + ",".join(f"{k}={v}" for k, v in r["params"].items()) if r["params"] else "")


def host(folder: Path) -> None:
    before = {(r["spec"], str(r["params"]), r["shape"]): r
              for r in json.loads((folder / "host_before.json").read_text())}
    print(f"{'spec':58s} host us, fingerprint=False: before / after / after out= | default call: before / after")
    for r in json.loads((folder / "host_after.json").read_text()):
        b = before.get((r["spec"], str(r["params"]), r["shape"]), {})
        print(f"{_name(r):58s} {b.get('host_us', float('nan')):6.1f} / {r['host_us']:6.1f} / "
              f"{r.get('host_out_us', float('nan')):6.1f} | {b.get('host_fingerprint_us', float('nan')):6.1f} / "
              f"{r['host_fingerprint_us']:6.1f}")


def single(path: Path) -> None:
    groups: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        groups.setdefault(",".join(f"{k}={v}" for k, v in r["dims"].items()), []).append(r)
    for dims, rows in groups.items():
        print(f"== single calls, {dims}")
        _single(rows)


def _single(rows: list[dict]) -> None:
    if all("host_old_us" in r for r in rows if "error" not in r):
        print(f"{'spec':58s} host us, one process, old/new alternating: fingerprint=False old / new / new out= | "
              f"default call old / new")
        for r in rows:
            if "error" not in r:
                print(f"{_name(r):58s} {r['host_old_us']:6.1f} / {r['host_new_us']:6.1f} / "
                      f"{r.get('host_new_out_us', float('nan')):6.1f} | {r['host_old_fingerprinted_us']:6.1f} / "
                      f"{r['host_new_fingerprinted_us']:6.1f}")
    print(f"{'spec':58s} {'old ms':>7s} {'new ms':>7s} {'out= ms':>7s} | % of copy: {'old':>5s} {'new':>5s} "
          f"{'out=':>5s} | b2b %: {'old':>5s} {'new':>5s} {'out=':>5s} | same f==e out==new")
    for r in rows:
        if "error" in r:
            print(f"{_name(r):58s} ERROR {r['error'][:80]}")
            continue
        nan = float("nan")
        print(f"{_name(r):58s} {r['old_median_ms']:7.3f} {r['new_median_ms']:7.3f} "
              f"{r.get('new_out_median_ms', nan):7.3f} | "
              f"{100 * r['old_fraction_of_copy']:16.1f} {100 * r['new_fraction_of_copy']:5.1f} "
              f"{100 * r.get('new_out_fraction_of_copy', nan):5.1f} | {100 * r['old_b2b_fraction_of_copy']:12.1f} "
              f"{100 * r['new_b2b_fraction_of_copy']:5.1f} {100 * r.get('new_out_b2b_fraction_of_copy', nan):5.1f} | "
              f"{r['same_output']!s:5s} {r['new_fused_equals_eager']!s:5s} {r.get('new_out_same_output')!s:5s}")


def main() -> int:
    folder = Path(sys.argv[1])
    if (folder / "host_after.json").exists() and (folder / "host_before.json").exists():
        host(folder)
    for name in ("ba.jsonl", "ba_host.jsonl", "ba_other.jsonl"):
        if (folder / name).exists():
            single(folder / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
