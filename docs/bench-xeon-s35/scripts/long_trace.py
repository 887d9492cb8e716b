"""Every step of a cold `auto` over four 1024-token synthetic prompts, int4 pair (stop 35):
k:verify ms+draft ms, and the catch-up with its price. SPECDEC_COST_CACHE=0 python long_trace.py"""

import time

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    quant="int4",
    speculate="auto",
)
w = llm.engine.window
obs, occ, choose = w.observe, w.observe_catch_up, w.choose
log = []


def observe(rows, k, verify_s, draft_s, *a, **kw):
    obs(rows, k, verify_s, draft_s, *a, **kw)
    log.append(f"{k}:{verify_s * 1e3:.0f}+{(draft_s or 0) * 1e3:.0f}")


def observe_catch_up(tokens, seconds):
    occ(tokens, seconds)
    log.append(f"CATCHUP {tokens} {seconds:.2f}s (priced {w.costs.catch_up_time(tokens)})")


w.observe, w.observe_catch_up = observe, observe_catch_up
tok = llm.tokenizer
prompts = [workloads.synthetic_prompt(tok, 1024, seed=i) for i in range(4)]
for p in prompts:
    log.clear()
    pre = w.costs.catch_up_time(1024)
    t = time.perf_counter()
    out = llm.engine.generate([p], [SamplingParams(temperature=0.0, max_tokens=64)])[0]
    dt = time.perf_counter() - t
    print(
        f"{len(out.token_ids) / dt:.2f} tok/s  catch-up priced before {pre}",
        f"unlooked {w._unlooked_s:.2f}",
        " ".join(log),
    )
