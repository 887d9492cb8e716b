import sys
import time

import torch

from specdec import LLM
from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.tokenization import encode_prompt

torch.set_num_threads(2)
quant, draft = sys.argv[1], sys.argv[2]
llm = LLM("qwen2.5-coder-1.5b-instruct", quant=quant, draft=draft, speculate="auto", max_batch=1)
tok = llm.tokenizer
prompts = [encode_prompt(tok, t, True) for t in workloads.sharegpt_prompts(4, seed=0)]
params = SamplingParams(temperature=0, max_tokens=64)
w = llm.engine.window
ks = []
orig = w.choose


def choose(*a, **kw):
    k = orig(*a, **kw)
    ks.append(k)
    return k


w.choose = choose
for rnd in range(int(sys.argv[3]) if len(sys.argv) > 3 else 2):
    t0 = time.perf_counter()
    toks = 0
    for p in prompts:
        ks.clear()
        c = llm.engine.generate([p], params)[0]
        toks += len(c.token_ids)
        print(
            "".join(str(d) for d in ks),
            f"accepted {c.stats.accepted}/{c.stats.drafted} steps {c.stats.steps}",
        )
    print(f"round {rnd}: {toks / (time.perf_counter() - t0):.2f} tok/s")
cm = w.costs
print("alpha", [round(a, 3) for a in w.alpha])
print("verify ms", [round((cm.verify_time(1, t) or 0) * 1e3, 2) for t in range(1, 6)])
print("draft ms", round((cm.draft_time(1) or 0) * 1e3, 2), "off", w._off)
