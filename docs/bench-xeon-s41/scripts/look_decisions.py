"""Issue 13's floor point, every step of a cold `ngram-auto` run with what `auto` saw when it
chose: the window, the pass's width and milliseconds, the rows' kept drafts, and the priced
plain step (v1), two-token pass (v2), first-position acceptance and host pace after it.
Plain runs between, in turns, as the bench orders them; decode seconds (all but prefill).

    python docs/bench-xeon-s41/scripts/look_decisions.py [TURNS]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench-xeon-s40" / "scripts"))
from floor_point import plain_against_auto  # noqa: E402


def record(steps, window, rows, k, verify_s, accepted_at, **kw):
    costs = window.costs
    v1, v2 = costs.verify_time(rows, 1), costs.verify_time(rows, 2)
    steps.append(
        (
            k,
            round(verify_s * 1e3),
            sum(accepted_at),
            round(v1 * 1e3) if v1 else None,
            round(v2 * 1e3) if v2 else None,
            round(window.alpha[0], 2) if window.alpha else None,
            round(costs.pace, 2),
        )
    )


def report(turn, steps):
    drafting = sum(1 for s in steps if s[0])
    print(f"turn {turn}: {len(steps)} steps, {drafting} drafting")
    print("  (k, ms, kept, v1, v2, alpha1, pace)")
    for i, s in enumerate(steps):
        mark = " <-" if s[0] else ""
        print(f"  {i:2d} {s}{mark}")


plain_against_auto(int(sys.argv[1]) if len(sys.argv) > 1 else 4, record, report)
