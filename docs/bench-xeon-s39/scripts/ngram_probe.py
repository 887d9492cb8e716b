"""Decode-phase cost of ngram-auto vs plain at 4 x 1024-token prompts, int4, alternated."""

import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.bench.workloads import synthetic_prompt
from specdec.config import SamplingParams

torch.set_num_threads(2)
M = "qwen2.5-coder-1.5b-instruct"
plain = LLM(M, quant="int4", max_batch=4, speculate=0)
ngram = LLM(M, quant="int4", draft="ngram", speculate="auto", max_batch=4)
tok = plain.tokenizer
prompts = [synthetic_prompt(tok, 1024, seed=s) for s in range(4)]
params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
rows = {"plain": [], "ngram": []}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for name, llm in (("plain", plain), ("ngram", ngram)):
        eng = llm.engine
        p0, t0 = eng.prefill_s, time.perf_counter()
        out = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        pre = eng.prefill_s - p0
        steps = max(c.stats.steps for c in out)
        drafts = sum(c.stats.drafts for c in out)
        drafted = sum(c.stats.drafted for c in out)
        acc = sum(c.stats.accepted for c in out)
        rows[name].append((wall - pre) / steps)
        print(
            f"{rep} {name}: wall {wall:.2f} prefill {pre:.2f} "
            f"decode/step {1e3 * (wall - pre) / steps:.1f} ms steps {steps} "
            f"drafts {drafts} drafted {drafted} acc {acc}",
            flush=True,
        )
r = [n / p for n, p in zip(rows["ngram"], rows["plain"], strict=True)]
print(
    "per-step ratio ngram/plain per pair:",
    [round(x, 3) for x in r],
    "median",
    round(statistics.median(r), 3),
)
