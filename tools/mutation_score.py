"""Print the verifier's mutation score for shipped specs (the table in README.md).

    .venv/bin/python tools/mutation_score.py                 # every spec of tests/verify/mutation.py
    .venv/bin/python tools/mutation_score.py marlin_nvfp4 …  # only these (one spec can take minutes)
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.verify.mutation import SPEC_CASES, run, score  # noqa: E402

names = sys.argv[1:] or sorted(SPEC_CASES)
unknown = [n for n in names if n not in SPEC_CASES]
if unknown:
    sys.exit(f"no mutation cases for {', '.join(unknown)}; known: {', '.join(sorted(SPEC_CASES))}")
print("| spec | mutants | rejected | equivalent | survived | score |")
print("|---|---|---|---|---|---|")
for name in names:
    outcomes = run(ROOT / "specs" / f"{name}.lyt")
    killed, survived, equivalent = score(outcomes)
    effective = killed + survived
    print(f"| {name} | {len(outcomes)} | {killed} | {equivalent} | {survived} | {killed / effective:.0%} |", flush=True)
    for o in outcomes:
        if o.verdict in ("SURVIVED", "equivalent"):
            print(f"|   {o.verdict}: {o.description} | | | | | |", flush=True)
