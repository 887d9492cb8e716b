"""A cold `auto` on SmolLM2 drafting for itself, 4 code requests of 32 tokens: each start
decision with its catch-up price and budget, and every step k:verify+draft ms (stop 34)."""

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM("smollm2-135m-instruct", draft="smollm2-135m-instruct", speculate="auto")
w = llm.engine.window
dec = w._may_start


def may_start(rows, catch_up, remaining):
    c = w.costs
    said = dec(rows, catch_up, remaining)
    print(
        f"start? catch_up={catch_up} remaining={remaining} -> {said}; "
        f"plain {c.verify_time(rows, 1) * 1e3:.1f} ms catch-up {c.catch_up_time(catch_up)} "
        f"share {c.draft_share(rows):.3f} ratio {c.draft_ratio} "
        f"cheap_look {w._cheap_look(rows, catch_up, remaining)} "
        f"verify5 {c.startup_verify_time(rows, 5)}",
        flush=True,
    )
    return said


w._may_start = may_start
obs = w.observe
log = []


def observe(rows, k, verify_s, draft_s, *a, **kw):
    obs(rows, k, verify_s, draft_s, *a, **kw)
    log.append(f"{k}:{verify_s * 1e3:.0f}+{draft_s * 1e3:.0f}")


w.observe = observe
for p in workloads.CODE_PROMPTS[:4]:
    log.clear()
    llm.engine.generate([llm.encode(p, False)], [SamplingParams(temperature=0.0, max_tokens=32)])
    print(" ".join(log))
