"""Issue 13's floor point step by step: the int4 Qwen 1.5B on 4 synthetic 1024-token
prompts as one batch, 64 tokens, plain against a cold `ngram-auto` (a fresh engine per run,
as the bench builds them), in turns with the order reversed every second turn. Logs, per
run, the window `auto` chose at each step, its verify pass's width and seconds, and the
rows' kept drafts; and the decode seconds (all but the prefill) of each run.

    python ngram_floor_trace.py [TURNS]
"""

import statistics
import sys
import time

from floor_point import engine as fresh_engine
from floor_point import params, prompts

turns = int(sys.argv[1]) if len(sys.argv) > 1 else 4


def run(method: str) -> tuple[float, list]:
    engine = fresh_engine(method)
    steps: list = []
    window = engine.window
    if method != "plain":
        observe = window.observe

        def logged(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw):
            steps.append((k, kw.get("width"), round(verify_s * 1e3, 1), sum(accepted_at)))
            observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw)

        window.observe = logged
    started = time.perf_counter()
    engine.generate(prompts, params)
    wall = time.perf_counter() - started
    return wall - engine.prefill_s, steps


run("plain")  # warm-up
run("ngram-auto")
decode: dict[str, list] = {"plain": [], "ngram-auto": []}
for turn in range(turns):
    order = ["plain", "ngram-auto"][:: -1 if turn % 2 else 1]
    for method in order:
        seconds, steps = run(method)
        decode[method].append(seconds)
        if steps:
            drafting = [s for s in steps if s[0]]
            print(f"turn {turn} ngram-auto: {len(steps)} steps, {len(drafting)} drafting:")
            print("  (k, width, verify ms, kept)", drafting)
            plain_ms = [s[2] for s in steps if not s[0]]
            print(f"  its k = 0 steps: median {statistics.median(plain_ms):.1f} ms")
    ratio = decode["plain"][-1] / decode["ngram-auto"][-1]
    print(
        f"turn {turn}: decode s plain {decode['plain'][-1]:.2f} "
        f"auto {decode['ngram-auto'][-1]:.2f} -> {ratio:.3f}x",
        flush=True,
    )
ratios = [p / a for p, a in zip(decode["plain"], decode["ngram-auto"], strict=True)]
print("decode ratio per turn", [round(r, 3) for r in ratios], "median", statistics.median(ratios))
