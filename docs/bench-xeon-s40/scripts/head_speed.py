"""Eagle heads side by side on the int4 Qwen 1.5B at k = 3: the bench's 4 held-out
ShareGPT prompts, greedy, 64 tokens, one process, heads in turn (3 rounds); tokens/s,
tokens per target pass and passes/s per round.

    python head_speed.py HEAD_DIR [HEAD_DIR ...]
"""

import sys
import time

from specdec import LLM
from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.tokenization import encode_prompt

heads = sys.argv[1:]
llms = [LLM("qwen2.5-coder-1.5b-instruct", quant="int4", draft=h, speculate=3) for h in heads]
tok = llms[0].tokenizer
prompts = [encode_prompt(tok, t, True) for t in workloads.sharegpt_prompts(4, seed=0)]
params = SamplingParams(temperature=0, max_tokens=64)
for llm in llms:
    llm.engine.generate(prompts[:1], params)
results: dict[str, list] = {h: [] for h in heads}
for _ in range(3):
    for h, llm in zip(heads, llms, strict=True):
        started, steps, generated = time.perf_counter(), 0, 0
        for p in prompts:
            out = llm.engine.generate([p], params)[0]
            steps += out.stats.steps
            generated += len(out.token_ids)
        seconds = time.perf_counter() - started
        results[h].append((generated / seconds, generated / steps, steps / seconds))
for h in heads:
    rounds = [f"{a:.1f} tok/s, {b:.2f} per pass, {c:.1f} passes/s" for a, b, c in results[h]]
    print(h, rounds)
