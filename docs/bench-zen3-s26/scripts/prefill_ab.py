"""A prefill of ROWS new tokens (after a 24-token prefix) with the fp32 panel products'
rows padded to a multiple of 8 against unpadded, taking turns in one process (medians of
6). Stop 26 measured the 1.5B bf16 at 21 rows: 1.21x faster padded.

    .venv/bin/python docs/bench-zen3-s26/scripts/prefill_ab.py qwen2.5-coder-1.5b-instruct none 21
"""

import statistics
import sys
import time

import torch

from specdec.llm import LLM
from specdec.models import linear

name, quant, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = LLM(name, quant=quant).engine.model
cache = model.new_cache(1, 2048)
seconds: dict[int, list[float]] = {1: [], 8: []}


def prefill() -> None:
    model(torch.randint(0, 1000, (1, rows)), cache, logits_at=torch.tensor([[rows - 1]]))
    cache.truncate(torch.tensor([24]))


with torch.inference_mode():
    model(torch.randint(0, 1000, (1, 24)), cache)
    prefill()
    for _ in range(6):
        for padding in (1, 8):
            linear.PANEL_ROWS = padding
            start = time.perf_counter()
            prefill()
            seconds[padding].append(time.perf_counter() - start)
ratio = statistics.median(a / b for a, b in zip(seconds[1], seconds[8], strict=True))
medians = {k: round(statistics.median(v) * 1e3, 1) for k, v in seconds.items()}
print(f"{name} {quant} {rows} rows: ms unpadded / padded {medians}, ratio {ratio:.3f}")
