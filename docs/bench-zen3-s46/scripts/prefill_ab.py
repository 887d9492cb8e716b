"""Prefill of one 1024-token prompt: specdec int4 (its own int4 weights) vs llama.cpp on the
Q4_K_M file, 2 threads each, in turns."""

import sys
import time
from pathlib import Path

import torch
from llama_cpp import Llama

from specdec.llm import LLM

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4")
m = llm.model
lc = Llama(
    str(Path.home() / ".cache/specdec/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    n_ctx=n + 64,
    n_threads=2,
    n_threads_batch=2,
    n_batch=512,
    verbose=False,
)
g = torch.Generator().manual_seed(0)
toks = torch.randint(100, 20000, (1, n), generator=g)
last = torch.tensor([[n - 1]])
cache = m.new_cache(1, n + 8)
res = {"specdec": [], "llamacpp": []}
with torch.inference_mode():
    for _ in range(3):
        t = time.perf_counter()
        m(toks, cache, logits_at=last)
        res["specdec"].append(time.perf_counter() - t)
        cache.truncate(torch.zeros(1, dtype=torch.long))
        lc.reset()
        t = time.perf_counter()
        lc.eval(toks[0].tolist())
        res["llamacpp"].append(time.perf_counter() - t)
        print({k: round(v[-1], 2) for k, v in res.items()}, flush=True)
for k, v in res.items():
    print(k, "median", round(sorted(v)[1], 2), "s =", round(n / sorted(v)[1], 1), "tok/s")
