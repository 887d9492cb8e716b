"""What `auto` sees when it decides to start drafting: the int4 pair, 4 code prompts one
at a time on one LLM, greedy, 64 tokens; prints each start decision's inputs (catch-up
price, draft share, acceptance, predicted speedups) and each request's steps as k:accepted.

    SPECDEC_COST_CACHE=0 python auto_start.py
"""

import time

from specdec import LLM, SamplingParams
from specdec import cost_model as cm
from specdec.bench.workloads import CODE_PROMPTS

llm = LLM(
    "qwen2.5-coder-1.5b-instruct", quant="int4", draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4", speculate="auto",
)  # fmt: skip
w = llm.engine.window
decide = w._may_start


def may_start(rows, catch_up, remaining):
    c = w.costs
    said = decide(rows, catch_up, remaining)
    plain = c.verify_time(rows, 1)
    alpha = w.alpha if w._reached else w.prior_alpha()
    speedups = {}
    for k in (1, 2, 3, 4):
        draft = c.draft_seconds(rows, k) or k * c.draft_share(rows) * plain
        step = draft + (c.startup_verify_time(rows, k + 1) or plain)
        speedups[k] = round(cm.expected_tokens(alpha, k) * plain / step, 3)
    print(
        f"start? rows={rows} catch_up={catch_up} remaining={remaining} -> {said}; "
        f"plain {plain * 1e3:.1f} ms, catch-up {c.catch_up_time(catch_up):.3f} s, "
        f"draft share {c.draft_share(rows):.3f}, alpha {[round(a, 2) for a in alpha[:4]]}, "
        f"predicted {speedups}",
        flush=True,
    )
    return said


w._may_start = may_start
steps = []
observe = w.observe


def observed(rows, k, verify_s, draft_s, drafted, accepted, draft_first_s=None):
    steps.append(f"{k}:{sum(accepted)}")
    return observe(rows, k, verify_s, draft_s, drafted, accepted, draft_first_s=draft_first_s)


w.observe = observed
params = SamplingParams(temperature=0, max_tokens=64)
started, n = time.perf_counter(), 0
for text in CODE_PROMPTS[:4]:
    steps.clear()
    n += len(llm.generate(text, params, chat=True)[0].token_ids)
    print(" ".join(steps))
print(f"{n / (time.perf_counter() - started):.2f} tok/s")
