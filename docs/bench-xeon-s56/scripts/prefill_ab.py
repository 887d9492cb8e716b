"""Time to first token of one long prompt, int4 1.5B, plain against draft-auto (the int4
0.5B attached), in turns in one process: the sweep's 1024 x 1 point read draft-auto's TTFT
6.0 s against plain's 5.0 s while it never drafted. Then where a plain prefill's time goes
(torch profiler, top ops). Usage: python prefill_ab.py [prompt_len] [turns]"""

import statistics
import sys
import time

import torch

from specdec import LLM, SamplingParams

torch.set_num_threads(2)
LEN = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
TURNS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
plain = LLM("qwen2.5-coder-1.5b-instruct", quant="int4", speculate=0)
auto = LLM(
    "qwen2.5-coder-1.5b-instruct",
    quant="int4",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate="auto",
)
params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
seen = {"plain": [], "auto": []}
for turn in range(TURNS + 1):
    ids = [(7 * i + 13 * turn) % 30000 + 100 for i in range(LEN)]  # a fresh prompt each turn
    for name, llm in (("plain", plain), ("auto", auto))[:: 1 if turn % 2 else -1]:
        t0 = time.perf_counter()
        c = llm.engine.generate([ids], [params])[0]
        wall = time.perf_counter() - t0
        print(f"turn {turn} {name}: wall {wall:.2f} s, ttft {c.ttft_s:.2f} s", flush=True)
        if turn:  # turn 0 warms
            seen[name].append(c.ttft_s)
for name, v in seen.items():
    m = statistics.median(v)
    print(f"{name}: median ttft {m:.2f} s ({LEN / m:.0f} tok/s)")

ids = [(11 * i) % 30000 + 100 for i in range(LEN)]
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    plain.engine.generate([ids], [params])
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
