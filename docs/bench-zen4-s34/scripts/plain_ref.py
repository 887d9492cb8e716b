"""Every step of a cold `auto` on 4 chat requests, int4 pair: k:verify ms/plain reference ms
(stop 34). SPECDEC_COST_CACHE=0 python plain_ref.py"""

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    quant="int4",
    speculate="auto",
    draft_vocab=65536,
)
w = llm.engine.window
obs = w.observe
log = []


def observe(rows, k, verify_s, draft_s, *a, **kw):
    obs(rows, k, verify_s, draft_s, *a, **kw)
    log.append(
        (k, verify_s, draft_s, w.costs.verify_s[1].get(1), w.costs.pace, w.costs.verify_time(1, 1))
    )


w.observe = observe
prompts = [llm.encode(p, True) for p in workloads.sharegpt_prompts(4)]
for p in prompts:
    log.clear()
    llm.engine.generate([p], [SamplingParams(temperature=0.0, max_tokens=64)])
    print(" ".join(f"{k}:{v * 1e3:.0f}/{(ref or 0) * 1e3:.0f}" for k, v, d, t, pace, ref in log))
    print(
        "pace",
        round(w.costs.pace, 3),
        "table",
        {t: round(s * 1e3, 1) for t, s in w.costs.verify_s[1].items()},
    )
