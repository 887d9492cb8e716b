"""The cold `ngram-auto` engine of issue 13's floor point (int4 Qwen 1.5B, 4 synthetic
1024-token prompts as one batch, 64 tokens), step by step: the window chosen, the
acceptance estimate and verify costs it chose with, the guard and probe state, and each
step's verify seconds and counts. Prints the drafting steps (and the step after each) of
TURNS fresh engines.

    python look_trace.py [TURNS]
"""

import sys

from floor_point import engine as fresh_engine
from floor_point import params, prompts

fresh_engine("plain").generate(prompts, params)  # warm-up
for turn in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    engine = fresh_engine("ngram-auto")
    window = engine.window
    log: list[str] = []
    choose, observe = window.choose, window.observe

    def logged_choose(rows, catch_up=0, remaining=None, w=window, choose=choose, log=log):
        k = choose(rows, catch_up, remaining)
        v1, v2 = w.costs.verify_time(rows, 1), w.costs.verify_time(rows, 2)
        alpha = round(w.alpha[0], 2) if w._reached else None
        ms = "/".join(str(v and round(v * 1e3)) for v in (v1, v2))
        log.append(
            f"k={k} alpha={alpha} plain/k1 ms={ms} off={w._off} probe gap={w._probe_gap} "
            f"since probe={w._since_probe}"
        )
        return k

    def logged_observe(
        rows, k, verify_s, draft_s, drafted_at, accepted_at, log=log, observe=observe, **kw
    ):
        log[-1] += (
            f" | {round(verify_s * 1e3)} ms, tested {drafted_at} kept {accepted_at} "
            f"of {kw.get('judged')} rows"
        )
        observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw)

    window.choose, window.observe = logged_choose, logged_observe
    engine.generate(prompts, params)
    drafting = [i for i, line in enumerate(log) if not line.startswith("k=0")]
    print(f"turn {turn}: {len(drafting)} drafting steps of {len(log)}")
    for i, line in enumerate(log):
        if i < 2 or i in drafting or i - 1 in drafting:
            print(f"  {i} {line}")
