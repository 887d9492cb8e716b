"""A long prompt's prefill as one pass against passes of C tokens (the cache carried
between them), through the model's forward, in turns, one process. Why: on this Xeon's
AMX a bf16 product of 17920 x 1536 ran 749 GFLOPS at 256 rows against 543 at 1,024 (its
output 36 MB past the caches). Usage: python prefill_chunks.py quant len batch chunks..."""

import statistics
import sys
import time

import torch

from specdec import LLM

torch.set_num_threads(2)
QUANT, LEN, BATCH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHUNKS = [int(c) for c in sys.argv[4:]] or [LEN, 512, 256, 128]
llm = LLM("qwen2.5-coder-1.5b-instruct", quant=QUANT, speculate=0)
model = llm.model
cache = model.new_cache(BATCH, LEN + 8)
tokens = torch.tensor([[(7 * i + 13 * b) % 30000 + 100 for i in range(LEN)] for b in range(BATCH)])


@torch.inference_mode()
def prefill(chunk: int) -> torch.Tensor:
    for row in range(BATCH):
        cache.reset_row(row)
    for start in range(0, LEN, chunk):
        part = tokens[:, start : start + chunk]
        last = torch.full((BATCH, 1), part.shape[1] - 1)
        out = model(part, cache, logits_at=last)
    return out.logits[:, -1]


times = {c: [] for c in CHUNKS}
ref = prefill(LEN)
for turn in range(3):
    for c in CHUNKS if turn % 2 == 0 else CHUNKS[::-1]:
        t0 = time.perf_counter()
        logits = prefill(c)
        times[c].append(time.perf_counter() - t0)
        if turn == 0:
            same = bool((logits.argmax(-1) == ref.argmax(-1)).all())
            diff = float((logits - ref).abs().max())
            print(f"chunk {c}: argmax same {same}, max |logit diff| {diff:.3g}", flush=True)
for c, v in times.items():
    m = statistics.median(v)
    print(f"{QUANT} {BATCH} x {LEN}, passes of {c}: median {m:.2f} s ({BATCH * LEN / m:.0f} tok/s)")
