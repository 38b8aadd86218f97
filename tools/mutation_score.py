"""Print the verifier's mutation score for every shipped spec (the table in README.md).

    .venv/bin/python tools/mutation_score.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.verify.mutation import SPEC_CASES, run, score  # noqa: E402

print("| spec | mutants | rejected | equivalent | survived | score |")
print("|---|---|---|---|---|---|")
for name in sorted(SPEC_CASES):
    outcomes = run(ROOT / "specs" / f"{name}.lyt")
    killed, survived, equivalent = score(outcomes)
    effective = killed + survived
    print(f"| {name} | {len(outcomes)} | {killed} | {equivalent} | {survived} | {killed / effective:.0%} |")
    for o in outcomes:
        if o.verdict in ("SURVIVED", "equivalent"):
            print(f"|   {o.verdict}: {o.description} | | | | | |")
