"""Issue 13's floor point with the eagle head: the int4 Qwen 1.5B on 4 synthetic
1024-token prompts as one batch, 64 tokens, plain against a cold `heads-auto` (a fresh
engine per run, as the bench builds them), in turns with the order reversed every second
turn. Logs, per `heads-auto` run, each step's window, verify width and ms, kept drafts,
and what `auto` priced then: the plain step and the k = 1 pass it had, its acceptance at
the first position, and the best window's predicted speedup.

    python heads_floor_trace.py HEADS [TURNS] [-v] [--len 1024]
"""

import statistics
import sys
import time

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.cost_model import predict_speedup

HEADS = sys.argv[1]
TURNS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
VERBOSE = "-v" in sys.argv
LENGTH = int(sys.argv[sys.argv.index("--len") + 1]) if "--len" in sys.argv else 1024

runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    None,
    "bf16",
    "cpu",
    k_max=8,
    max_tokens=64,
    prompts_per_point=4,
    quant="int4",
    heads=HEADS,
)


def point(method: str) -> Point:
    return Point("synthetic", LENGTH, 4, 0.0, method)


prompts = runner.prompts(point("plain"))
params = runner.params(point("plain"), len(prompts))


def run(method: str) -> tuple[float, list]:
    fresh = runner._engine(point(method))
    steps: list = []
    window, observe = fresh.window, fresh.window.observe

    def logged(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw):
        observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw)
        step = dict(k=k, rows=rows, ms=round(verify_s * 1e3, 1), draft_ms=round(draft_s * 1e3, 1))
        steps.append(step)
        if method == "plain":
            return
        costs, alpha = window.costs, window.alpha
        step["catch_up"] = [round(x, 3) for x in fresh._drafter.last_catch_up]
        v0, v1 = costs.verify_time(rows, 1), costs.verify_time(rows, 2)
        sp1 = predict_speedup(costs, rows, alpha, 1) if alpha else None
        step.update(
            kept=sum(accepted_at),
            v0=v0 and round(v0 * 1e3, 1),
            v1=v1 and round(v1 * 1e3, 1),
            a0=alpha and round(alpha[0], 2),
            sp1=sp1 and round(sp1, 3),
            off=window._off,
            pace=round(costs.pace, 3),
        )

    window.observe = logged
    started = time.perf_counter()
    fresh.generate(prompts, params)
    return time.perf_counter() - started - fresh.prefill_s, steps


run("plain")
run("heads-auto")
decode: dict[str, list] = {"plain": [], "heads-auto": []}
for turn in range(TURNS):
    for method in ["plain", "heads-auto"][:: -1 if turn % 2 else 1]:
        seconds, steps = run(method)
        decode[method].append(seconds)
        step_s = sum(s["ms"] + s["draft_ms"] for s in steps) / 1e3
        print(
            f"turn {turn} {method}: {len(steps)} steps, {step_s:.2f} s in steps, "
            f"{seconds - step_s:.2f} s between"
        )
        if method != "plain" and VERBOSE:
            for s in steps:
                print("  ", s)
    p, a = decode["plain"][-1], decode["heads-auto"][-1]
    print(f"turn {turn}: decode s plain {p:.2f} auto {a:.2f} -> {p / a:.3f}x", flush=True)
ratios = [p / a for p, a in zip(decode["plain"], decode["heads-auto"], strict=True)]
print("decode ratio per turn", [round(r, 3) for r in ratios], "median", statistics.median(ratios))
