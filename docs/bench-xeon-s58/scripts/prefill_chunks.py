"""A long prompt's prefill as one pass against passes of C tokens a row (the cache carried
between them), through the model's forward, in turns, one process, with the kernel CPU
time and page faults of each: a bf16 prefill of 4 x 1,024 tokens took 2.3-2.8 million
minor faults (9-11 GB of fresh pages) and 5.4-8.1 s of kernel time in 36-44 CPU seconds
(`prefill_ab.py`), its largest activations ([4096, 17920] for the fused gate and up
projection, 147 MB) past glibc's largest mmap threshold (32 MB), so mapped and unmapped in
every layer. Stop 56's version of this script, at int4 1 x 1,024: 1.12x in passes of 512.
Usage: python prefill_chunks.py quant len batch turns chunks..."""

import resource
import statistics
import sys
import time

import torch

from specdec import LLM

torch.set_num_threads(2)
QUANT, LEN, BATCH, TURNS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
CHUNKS = [int(c) for c in sys.argv[5:]] or [LEN, 512, 256]
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


seen = {c: [] for c in CHUNKS}
ref = prefill(LEN)
for turn in range(TURNS):
    for c in CHUNKS if turn % 2 == 0 else CHUNKS[::-1]:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        logits = prefill(c)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        row = dict(
            wall=wall,
            user=r1.ru_utime - r0.ru_utime,
            sys=r1.ru_stime - r0.ru_stime,
            faults_k=(r1.ru_minflt - r0.ru_minflt) / 1e3,
        )
        seen[c].append(row)
        print(turn, c, " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        if turn == 0:
            same = bool((logits.argmax(-1) == ref.argmax(-1)).all())
            diff = float((logits - ref).abs().max())
            print(f"chunk {c}: argmax same {same}, max |logit diff| {diff:.3g}", flush=True)
for c, rows in seen.items():
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratios = [r["wall"] / w["wall"] for r, w in zip(rows, seen[CHUNKS[0]], strict=True)]
    print(
        f"{QUANT} {BATCH} x {LEN}, passes of {c}: "
        + " ".join(f"{k} {v:.3f}" for k, v in med.items())
        + f" ({BATCH * LEN / med['wall']:.0f} tok/s; per-turn time over one pass "
        f"{statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}])"
    )
