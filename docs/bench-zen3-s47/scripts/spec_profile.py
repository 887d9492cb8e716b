"""Where a bf16 speculative pass's time goes: one 128-token code request at batch 1, the bf16
Qwen 1.5B verifying the int4 0.5B's drafts at a fixed window, under cProfile after one
warm-up request. The stack's native call, the vocabulary heads and the draft's `propose`
show the verify / draft split; the rest is Python.

    python docs/bench-zen3-s47/scripts/spec_profile.py [K]   # K defaults to 3
"""

import cProfile
import pstats
import sys
import time

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads

torch.set_num_threads(2)
k = int(sys.argv[1]) if len(sys.argv) > 1 else 3
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate=k,
)
params = SamplingParams(max_tokens=128, temperature=0.0)
llm.generate(workloads.CODE_PROMPTS[0], params, chat=True)  # warm-up
start = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
out = llm.generate(workloads.CODE_PROMPTS[1], params, chat=True)
profile.disable()
print(f"{len(out[0].token_ids)} tokens in {time.perf_counter() - start:.2f} s")
pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
