"""Issue 13's floor point, every step of a cold `ngram-auto` run with what `auto` saw when it
chose: the window, the pass's width and milliseconds, the rows' kept drafts, and the priced
plain step (v1), two-token pass (v2), first-position acceptance and host pace after it.
Plain runs between, in turns, as the bench orders them; decode seconds (all but prefill).

    python docs/bench-xeon-s41/scripts/look_decisions.py [TURNS]
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench-xeon-s40" / "scripts"))
from floor_point import engine as fresh_engine  # noqa: E402
from floor_point import params, prompts  # noqa: E402

turns = int(sys.argv[1]) if len(sys.argv) > 1 else 4


def run(method: str) -> tuple[float, list]:
    engine = fresh_engine(method)
    steps: list = []
    window = engine.window
    if method != "plain":
        observe = window.observe

        def logged(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw):
            observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw)
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

        window.observe = logged
    started = time.perf_counter()
    engine.generate(prompts, params)
    wall = time.perf_counter() - started
    return wall - engine.prefill_s, steps


run("plain")  # warm-up
run("ngram-auto")
decode: dict[str, list] = {"plain": [], "ngram-auto": []}
for turn in range(turns):
    for method in ["plain", "ngram-auto"][:: -1 if turn % 2 else 1]:
        seconds, steps = run(method)
        decode[method].append(seconds)
        if steps:
            drafting = sum(1 for s in steps if s[0])
            print(f"turn {turn}: {len(steps)} steps, {drafting} drafting")
            print("  (k, ms, kept, v1, v2, alpha1, pace)")
            for i, s in enumerate(steps):
                mark = " <-" if s[0] else ""
                print(f"  {i:2d} {s}{mark}")
    ratio = decode["plain"][-1] / decode["ngram-auto"][-1]
    print(
        f"turn {turn}: decode s plain {decode['plain'][-1]:.2f} "
        f"auto {decode['ngram-auto'][-1]:.2f} -> {ratio:.3f}x",
        flush=True,
    )
ratios = [p / a for p, a in zip(decode["plain"], decode["ngram-auto"], strict=True)]
print("decode ratio per turn", [round(r, 3) for r in ratios], "median", statistics.median(ratios))
