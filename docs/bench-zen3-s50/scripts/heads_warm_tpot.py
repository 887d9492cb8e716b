"""Plain against heads `auto` in one warm process, the int4 1.5B at batch 4 (4 ShareGPT
prompts, seed 5, 48 tokens, ignore EOS), 6 alternating turns: the running median of the
rows' decode ms a token. The bench starts each run from a fresh engine; here each method
keeps its engine, so `auto`'s cold start is paid once.

    python docs/bench-zen3-s50/scripts/heads_warm_tpot.py [HEADS_DIR]
"""

import statistics
import sys

import torch

from specdec import LLM
from specdec.bench.workloads import sharegpt_prompts
from specdec.config import SamplingParams

torch.set_num_threads(2)
heads_dir = sys.argv[1] if len(sys.argv) > 1 else "/root/.cache/specdec/runs/qwen15-heads-s50"
plain = LLM("qwen2.5-coder-1.5b-instruct", quant="int4")
heads = LLM("qwen2.5-coder-1.5b-instruct", quant="int4", draft=heads_dir, speculate="auto")
prompts = sharegpt_prompts(4, seed=5)
params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
ms = {"plain": [], "heads": []}
for turn in range(6):
    order = [("plain", plain), ("heads", heads)]
    for name, llm in order if turn % 2 == 0 else order[::-1]:
        for out in llm.generate(prompts, params, chat=True):
            decode_s = out.stats.elapsed_s - out.stats.ttft_s
            ms[name].append(1000 * decode_s / (len(out.token_ids) - 1))
    print(turn, {k: round(statistics.median(v), 2) for k, v in ms.items()}, flush=True)
