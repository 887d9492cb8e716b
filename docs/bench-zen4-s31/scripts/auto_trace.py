"""What `auto` decides, request by request: the int4 pair, 4 chat (or code) prompts one
after another on one LLM, greedy, 64 tokens. Prints each start decision's inputs and each
request's steps as k:accepted, with the window's acceptance and costs after it.

    SPECDEC_COST_CACHE=0 python auto_trace.py chat|code
"""

import sys
import time

from specdec import LLM, SamplingParams
from specdec import cost_model as cm
from specdec.bench.workloads import CODE_PROMPTS, sharegpt_prompts

prompts = sharegpt_prompts(4, seed=0) if sys.argv[1] == "chat" else CODE_PROMPTS[:4]
llm = LLM(
    "qwen2.5-coder-1.5b-instruct", quant="int4", draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4", speculate="auto",
)  # fmt: skip
w = llm.engine.window
decide, observe = w._may_start, w.observe
steps = []


def ms(seconds):
    return round(seconds * 1e3, 1)


def may_start(rows, catch_up, remaining):
    c = w.costs
    said = decide(rows, catch_up, remaining)
    plain = c.verify_time(rows, 1)
    alpha = w.alpha if w._reached else w.prior_alpha()
    predicted = {}
    for k in (1, 2, 3, 4):
        draft = c.draft_seconds(rows, k) or k * c.draft_share(rows) * plain
        step = draft + (c.startup_verify_time(rows, k + 1) or plain)
        predicted[k] = round(cm.expected_tokens(alpha, k) * plain / step, 3)
    print(
        f"start? catch_up={catch_up} remaining={remaining} -> {said}; plain {ms(plain)} ms, "
        f"catch-up {c.catch_up_time(catch_up):.3f} s, alpha {[round(a, 2) for a in alpha[:4]]}, "
        f"predicted {predicted}",
        flush=True,
    )
    return said


def observed(rows, k, verify_s, draft_s, drafted, accepted, draft_first_s=None):
    steps.append(f"{k}:{sum(accepted)}")
    return observe(rows, k, verify_s, draft_s, drafted, accepted, draft_first_s=draft_first_s)


w._may_start, w.observe = may_start, observed
params = SamplingParams(temperature=0, max_tokens=64)
started, n = time.perf_counter(), 0
for text in prompts:
    steps.clear()
    n += len(llm.generate(text, params, chat=True)[0].token_ids)
    c = w.costs
    print(" ".join(steps))
    print(
        "  alpha", [round(a, 2) for a in w.alpha], "plain", ms(c.verify_time(1, 1)),
        "verify", {t: ms(c.verify_time(1, t)) for t in sorted(c.verify_s.get(1, {}))},
        "draft", ms(c.draft_time(1) or 0), "pace", round(c.pace, 2), flush=True,
    )  # fmt: skip
print(f"{n / (time.perf_counter() - started):.2f} tok/s")
