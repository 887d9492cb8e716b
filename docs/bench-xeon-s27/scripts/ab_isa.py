"""Decoding under one native build, for an A/B of the builds: plain, or with a draft model
and a fixed window when a draft and k follow.

    for i in 1 2 3; do for isa in avx512 avx2; do
        SPECDEC_NATIVE_ISA=$isa python ab_isa.py qwen2.5-coder-1.5b-instruct none; done; done
    ... python ab_isa.py qwen2.5-coder-1.5b-instruct none qwen2.5-coder-0.5b-instruct 4

Prints one JSON line: the build, the quantization, and tokens/s of 2 code prompts x 128
greedy tokens, one at a time (batch 1), after a warm-up request (the first process of a
build also tunes its kernels).
"""

import json
import os
import sys
import time

from specdec import LLM, SamplingParams

model, quant = sys.argv[1], sys.argv[2]
draft, k = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, 0)
llm = LLM(model, quant=quant, draft=draft, speculate=k if draft else None)
prompts = [
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring.",
    "Write a Python class implementing an LRU cache with get and put methods.",
]
llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))
params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
start = time.perf_counter()
tokens = sum(len(llm.generate([p], params)[0].token_ids) for p in prompts)  # batch 1
seconds = time.perf_counter() - start
isa = os.environ.get("SPECDEC_NATIVE_ISA", "widest")
result = {"isa": isa, "quant": quant, "k": k, "tokens": tokens, "tok_s": round(tokens / seconds, 2)}
print(json.dumps(result))
