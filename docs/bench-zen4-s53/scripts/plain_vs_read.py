"""Plain bf16 decoding of the 1.5B against the memory's read rate, taken in turns in one
process: the bandwidth bound of issue 13's first bar, measured beside the decoding it bounds.

Why: this host's `x.sum()` over 1 GiB reads 28-56 GB/s minutes apart (`specdec doctor`
keeps the best of five: one fast moment sets the bound), so a plain rate and a bound read
at different times can put the same engine at 60% or 90%. Each round here reads the
memory (five sums, median and best), decodes one code prompt (64 tokens, greedy), and reads
again; a round's fraction is the decode's GB/s (the model's bytes a token) over the median
read around it.

    python docs/bench-zen4-s53/scripts/plain_vs_read.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads
from specdec.doctor import decode_bytes

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
llm = LLM("qwen2.5-coder-1.5b-instruct", speculate=0)
engine = llm.plain_engine()
per_token = decode_bytes(llm.model.config)  # bf16 weights a plain step reads
prompts = [llm.encode(p, chat=True) for p in workloads.CODE_PROMPTS[:4]]
params = SamplingParams(max_tokens=64, temperature=0.0)
buffer = torch.ones(2**28)  # 1 GiB of fp32, as the doctor reads


def reads() -> list[float]:
    out = []
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        out.append(buffer.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return out


for ids in prompts:
    engine.generate([ids], SamplingParams(max_tokens=8, temperature=0.0))
print(f"{per_token / 1e9:.3f} GB a plain token", flush=True)
fractions, decodes, medians, bests = [], [], [], []
for r in range(rounds):
    before = reads()
    start = time.perf_counter()
    out = engine.generate([prompts[r % len(prompts)]], params)[0]
    decode = (len(out.token_ids) - 1) / (time.perf_counter() - start - out.ttft_s)
    after = reads()
    around = statistics.median(before + after)
    gbs = decode * per_token / 1e9
    fractions.append(gbs / around)
    decodes.append(decode)
    medians.append(around)
    bests.append(max(before + after))
    print(
        f"round {r}: decode {decode:.2f} tok/s = {gbs:.1f} GB/s; read median {around:.1f} "
        f"(best {max(before + after):.1f}) GB/s; {fractions[-1]:.0%} of the median read's bound",
        flush=True,
    )
print(
    f"{rounds} rounds, medians: decode {statistics.median(decodes):.2f} tok/s, read "
    f"{statistics.median(medians):.1f} GB/s (best of all {max(bests):.1f}), fraction of the "
    f"bound {statistics.median(fractions):.0%} (range {min(fractions):.0%}-{max(fractions):.0%})"
)
