"""Forwards of ROWS tokens (default 5: a k = 4 verify pass) of the bf16 1.5B at a 250-token
context on THREADS threads (default 2), timed for SECONDS; prints its pid when warm, for
`perf record -p PID`.

    ROWS=5 python docs/bench-zen3-s50/scripts/target_step.py 40 &
    perf record -F 499 -p PID -o perf.data -- sleep 20
    perf report -i perf.data --no-children --sort dso,symbol
"""

import os
import statistics
import sys
import time

import torch

from specdec import LLM

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
rows = int(os.environ.get("ROWS", "5"))
model = LLM("qwen2.5-coder-1.5b-instruct").engine.model
cache = model.new_cache(1, 2048)
with torch.inference_mode():
    model(torch.randint(100, 20000, (1, 250)), cache)
    tokens = torch.tensor([[1234, 99, 100, 101, 102, 103, 104, 105][:rows]])
    for _ in range(10):
        model(tokens, cache)
        cache.truncate(torch.tensor([250]))
    print("ready", os.getpid(), flush=True)
    times = []
    end = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 20)
    while time.time() < end:
        start = time.perf_counter()
        model(tokens, cache)
        times.append(time.perf_counter() - start)
        cache.truncate(torch.tensor([250]))
    median = 1000 * statistics.median(times)
    print(f"{rows}-token forward: median {median:.2f} ms over {len(times)}")
