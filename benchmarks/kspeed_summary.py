"""The table of a before_after.py run (jsonl): per spec and layer, % of a copy old / new, single and b2b.

    python benchmarks/kspeed_summary.py ba.jsonl
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    print("spec | params | E | single old / new | b2b old / new | ms b2b old / new | same bytes | fused == eager")
    for line in open(path):
        r = json.loads(line)
        if "error" in r:
            print(r["spec"], r["params"], r["dims"].get("E"), "error", r["error"][:200])
            continue
        print(f"{r['spec']} | {r['params']} | {r['dims']['E']} | {100 * r['old_fraction_of_copy']:.1f} / "
              f"{100 * r['new_fraction_of_copy']:.1f} | {100 * r['old_b2b_fraction_of_copy']:.1f} / "
              f"{100 * r['new_b2b_fraction_of_copy']:.1f} | {r['old_b2b_median_ms']:.3f} / {r['new_b2b_median_ms']:.3f}"
              f" | {r['same_output']} | {r['new_fused_equals_eager']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
