"""A prefill of B prompts of N tokens, int4 1.5B: one pass against chunks of C tokens a row
(`prefill_chunks.py 4 512 512,128,256 2`), with the process's user and sys seconds and its
minor page faults, and the last position's logits compared to the first variant's."""

import resource
import sys
import time

import torch

from specdec.llm import LLM

torch.set_num_threads(2)
B, N = int(sys.argv[1]), int(sys.argv[2])
chunks = [int(c) for c in sys.argv[3].split(",")]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4")
m = llm.model
g = torch.Generator().manual_seed(0)
toks = torch.randint(100, 20000, (B, N), generator=g)
cache = m.new_cache(B, N + 8)


def run(chunk):
    cache.truncate(torch.zeros(B, dtype=torch.long))
    for s in range(0, N, chunk):
        t = toks[:, s : s + chunk]
        last = torch.full((B, 1), t.shape[1] - 1)
        out = m(t, cache, logits_at=last)
    return out.logits


with torch.inference_mode():
    run(64) if N >= 64 else None
    ref = None
    for _r in range(reps):
        for c in chunks:
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            lg = run(c)
            dt = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            if ref is None:
                ref = lg
            diff = (lg - ref).abs().max().item()
            user, sys_s = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
            faults = ru1.ru_minflt - ru0.ru_minflt
            print(
                f"chunk {c:5d}: {dt:7.2f} s  {B * N / dt:6.1f} tok/s  user {user:6.1f} "
                f"sys {sys_s:5.1f} minflt {faults:8d}  maxdiff {diff:.3g}",
                flush=True,
            )
