"""One-token forwards of the int4 0.5B (the draft's step) at a 250-token context, timed for
SECONDS; prints its pid when warm, so that `perf record -p PID` can profile the steady state.

    python docs/bench-zen3-s49/scripts/draft_step.py 25 &
    perf record -F 999 -p PID -o perf.data -- sleep 15
    perf report -i perf.data --no-children --sort dso,symbol

THREADS (default 2), and MODEL, QUANT and ROWS (default the int4 0.5B, one token) time
other passes the same way: docs/bench-zen3-s50/scripts/target_step.py sets them for the
bf16 1.5B's verify pass.
"""

import os
import statistics
import sys
import time

import torch

from specdec import LLM

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
rows = int(os.environ.get("ROWS", "1"))
llm = LLM(
    os.environ.get("MODEL", "qwen2.5-coder-0.5b-instruct"),
    quant=os.environ.get("QUANT", "int4"),
)
model = llm.engine.model
cache = model.new_cache(1, 2048)
with torch.inference_mode():
    model(torch.randint(100, 20000, (1, 250)), cache)
    tokens = torch.tensor([[1234, 99, 100, 101, 102, 103, 104, 105][:rows]])
    for _ in range(20):
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
    width = "one-token" if rows == 1 else f"{rows}-token"
    median = 1000 * statistics.median(times)
    print(f"{width} forward: median {median:.2f} ms over {len(times)}")
