"""The int4 tile layout's two prefetch levels end to end, in one process (stop 35): the int4
pair loaded once, the level switched between requests, methods and levels taking turns
request by request; tok/s over each method's requests, per-turn ratios of level 1 over 0.

    python ab_prefetch.py [--turns 3] [--workload code|sharegpt]
"""

import argparse
import json
import statistics
import time

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.cost_model import FixedWindow
from specdec.llm import LLM
from specdec.models import native

ap = argparse.ArgumentParser()
ap.add_argument("--turns", type=int, default=3)
ap.add_argument("--workload", default="code")
ap.add_argument("--max-tokens", type=int, default=64)
args = ap.parse_args()

llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    quant="int4",
    speculate=3,
    prefix_cache_tokens=0,  # each request prefills its whole prompt: the levels see the same
)
if args.workload == "code":
    texts = workloads.CODE_PROMPTS[:4]
else:
    texts = workloads.sharegpt_prompts(4)
prompts = [llm.encode(p, True) for p in texts]
params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
methods = {"plain": 0, "k3": 3}
seconds = {(m, lv, t): 0.0 for m in methods for lv in (0, 1) for t in range(args.turns)}
tokens = dict.fromkeys(seconds, 0)
outputs = {}
for turn in range(args.turns):
    for prompt in prompts:
        for method, k in methods.items():
            for level in (0, 1) if turn % 2 == 0 else (1, 0):
                native.set_tile_prefetch(level)
                llm.engine.window = FixedWindow(k)
                start = time.perf_counter()
                out = llm.engine.generate([prompt], [params])[0]
                seconds[method, level, turn] += time.perf_counter() - start
                tokens[method, level, turn] += len(out.token_ids)
                outputs[method, tuple(prompt), turn, level] = out.token_ids
rate = {key: tokens[key] / seconds[key] for key in seconds}
summary = {}
for method in methods:
    per_turn = [rate[method, 1, t] / rate[method, 0, t] for t in range(args.turns)]
    summary[method] = {
        "level0_tok_s": [round(rate[method, 0, t], 2) for t in range(args.turns)],
        "level1_tok_s": [round(rate[method, 1, t], 2) for t in range(args.turns)],
        "level1_over_0_per_turn": [round(r, 3) for r in per_turn],
        "median": round(statistics.median(per_turn), 3),
    }
# With no prefix cache every request of a prompt computes the same passes: the two levels'
# tokens must agree.
same = all(outputs[m, p, t, 0] == outputs[m, p, t, 1] for (m, p, t, level) in outputs if level == 0)
print(json.dumps({"workload": args.workload, "levels_agree": same, **summary}, indent=1))
