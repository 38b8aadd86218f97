"""Write tests/slow_tests.txt from a timed run of the fast suite, so `make test` stays under five minutes.

    .venv/bin/python -m pytest -n auto -m "not slow and not flashinfer" --junitxml=/tmp/fast.xml
    python tools/slow_tests.py /tmp/fast.xml --over 1.0 [--scale 0.25]

Every test whose measured time (setup, call and teardown, as the JUnit report gives it) times
``--scale`` exceeds ``--over`` seconds is added to the list; ``--scale`` corrects for a machine busier
than the idle 2-core one the budget is stated for (a run at load 8 on 2 cores: about 0.25). Lines
already in the list are kept (a test leaves it only by hand, after it was made faster). A function all
of whose cases are listed is written once, as the function. tests/conftest.py marks what is listed as
`slow`; `make test-slow` and CI still run it.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "slow_tests.txt"
HEADER = """\
# Tests over the fast suite's per-test budget on the 2-core machine: tests/conftest.py marks them `slow`,
# so `make test` leaves them to `make test-slow` (which CI runs too). Written by tools/slow_tests.py
# from a timed run; a line is a node id (one case) or a function (all its cases).
"""


def node_id(classname: str, name: str) -> str:
    """JUnit's dotted class name back to pytest's node id (a test class inside the module is kept)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).exists():
            return "::".join([path.as_posix(), *parts[cut:], name])
    raise SystemExit(f"slow_tests: no test file for {classname!r}")


def timings(reports: list[Path]) -> dict[str, float]:
    times: dict[str, float] = defaultdict(float)
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            times[node_id(case.get("classname", ""), case.get("name", ""))] += float(case.get("time", 0))
    return dict(times)


def read_list() -> set[str]:
    if not LIST.exists():
        return set()
    return {line.split("#", 1)[0].strip() for line in LIST.read_text().splitlines()} - {""}


def collapse(ids: set[str], all_ids: set[str]) -> list[str]:
    """Node ids, a parametrized function whose every measured case is listed written once."""
    cases: dict[str, set[str]] = defaultdict(set)
    for i in all_ids:
        if "[" in i:
            cases[i.split("[", 1)[0]].add(i)
    out = set(ids)
    for function, members in cases.items():
        if members <= ids:
            out = (out - members) | {function}
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="JUnit XML reports of the fast suite")
    ap.add_argument("--over", type=float, default=1.0, help="seconds a test may take on the idle machine")
    ap.add_argument("--scale", type=float, default=1.0, help="measured seconds times this = idle seconds")
    args = ap.parse_args(argv)
    times = timings(args.reports)
    slow = {i for i, t in times.items() if t * args.scale > args.over}
    kept = read_list()
    lines = collapse(slow | {i for i in kept if "[" in i}, set(times)) + sorted(i for i in kept if "[" not in i)
    LIST.write_text(HEADER + "".join(f"{line}\n" for line in sorted(set(lines))))
    total = sum(times.values()) * args.scale
    left = sum(t for i, t in times.items() if i not in slow and i.split("[", 1)[0] not in kept) * args.scale
    print(f"{len(slow)} of {len(times)} tests over {args.over} s; the fast suite: {total:.0f} s -> {left:.0f} s "
          f"of test time (scaled), {LIST.relative_to(ROOT)} has {len(set(lines))} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
