"""Plain int4 decoding of 4 code prompts (64 greedy tokens each, 4 repeats) in one process,
for an A/B of PyTorch's transparent-huge-page allocations (THP_MEM_ALLOC_ENABLE=1) against
none, processes taking turns:

    for i in 1 2 3; do for thp in 1 0; do THP_MEM_ALLOC_ENABLE=$thp python thp_plain.py; done; done
"""

import os
import statistics
import time

from specdec import LLM, SamplingParams
from specdec.bench.workloads import CODE_PROMPTS

llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4", speculate=0)
ids = [llm.encode(t, chat=True) for t in CODE_PROMPTS[:4]]
params = SamplingParams(temperature=0, max_tokens=64)
rates = []
for _ in range(4):
    started = time.perf_counter()
    n = sum(len(llm.engine.generate([i], [params])[0].token_ids) for i in ids)
    rates.append(n / (time.perf_counter() - started))
with open("/proc/meminfo") as info:
    huge = next(line for line in info if line.startswith("AnonHugePages")).split()[1]
print(
    os.environ.get("THP_MEM_ALLOC_ENABLE", "0"),
    [round(r, 1) for r in rates],
    "median of the last 3",
    round(statistics.median(rates[1:]), 2),
    "AnonHugePages kB",
    huge,
)
