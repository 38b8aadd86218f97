"""The table of benchmarks/single_run.sh's before_after.py rows (issue 25, single calls), as in BENCHMARKS.md.

    python benchmarks/single_summary.py ba.jsonl

Per spec and layer, % of a device copy of the same bytes: the conversion alone (fingerprint=False, no out=)
single, old / new; with out= (new); the default call (fingerprint on, no out=: what an engine that does not hand
its own tensors calls) single and 10 back to back, old / new; then same bytes old == new, fused == eager,
out= == the allocating call. Last, the lines under the targets (85% at E=128, 80% at E=32).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    rows = [json.loads(line) for line in open(sys.argv[1])]
    print("| spec (parameters) | E | conversion single: old / new | out= single | default single: old / new "
          "| default b2b: old / new | same bytes / fused == eager / out= == new |")
    print("|---|---|---|---|---|---|---|")
    under = {}
    for r in rows:
        name = r["spec"] + (f" ({', '.join(f'{k}={v}' for k, v in r['params'].items())})" if r["params"] else "")
        if "error" in r:
            print(f"| {name} | {r['dims']['E']} | error: {r['error'][:80]} |")
            continue

        def pc(key):
            return f"{100 * r[key]:.1f}" if key in r else "-"

        e = r["dims"]["E"]
        print(f"| {name} | {e} | {pc('old_fraction_of_copy')} / **{pc('new_fraction_of_copy')}** | "
              f"**{pc('new_out_fraction_of_copy')}** | {pc('old_fingerprinted_fraction_of_copy')} / "
              f"**{pc('new_fingerprinted_fraction_of_copy')}** | {pc('old_fingerprinted_b2b_fraction_of_copy')} / "
              f"**{pc('new_fingerprinted_b2b_fraction_of_copy')}** | {r.get('same_output')} / "
              f"{r.get('new_fused_equals_eager')} / {r.get('new_out_same_output')} |")
        target = 0.85 if e == 128 and r["dims"]["I"] == 2944 else 0.80 if e == 32 else None
        if target is None:
            continue
        for key in ("new_fraction_of_copy", "new_out_fraction_of_copy", "new_fingerprinted_fraction_of_copy"):
            if r.get(key, 1) < target:
                under.setdefault((e, key), []).append(f"{name} {100 * r[key]:.1f}")
    for (e, key), names in sorted(under.items()):
        print(f"\nE={e}, {key} under the target: {len(names)}: " + "; ".join(names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
