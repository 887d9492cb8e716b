"""What prefilling in passes costs: one plain engine as the bench builds it prefills the
same `batch` prompts of `len` tokens (max_tokens = 1) with each `--prefill-chunk` in turn,
the order rotated every round; per round, each chunk's time over the one-pass prefill's
of the same round. Prints per-call wall, CPU and system seconds and minor page faults,
and the median ratios.

    python chunk_cost.py [rounds] [quant] [len] [batch] [chunks, comma-separated]

With NO_DRAFT=1 the process loads the target alone (`specdec generate` without --draft),
not the bench's target and draft.
"""

import os
import resource
import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.config import SamplingParams

torch.set_num_threads(2)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
QUANT = sys.argv[2] if len(sys.argv) > 2 else "int4"
LEN = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
BATCH = int(sys.argv[4]) if len(sys.argv) > 4 else 4
CHUNKS = [int(c) for c in (sys.argv[5] if len(sys.argv) > 5 else "256,128").split(",")]
DRAFT = None if os.environ.get("NO_DRAFT") == "1" else "qwen2.5-coder-0.5b-instruct"
runner = Runner(
    "qwen2.5-coder-1.5b-instruct", DRAFT, "bf16", "cpu", 8, 64, 4,
    quant=QUANT, draft_quant="int4" if DRAFT else None,
)  # fmt: skip
point = Point("synthetic", LEN, BATCH, 0.0, "plain")
prompts = runner.prompts(point)[:BATCH]
sampling = [SamplingParams(temperature=0.0, max_tokens=1, seed=0)] * BATCH
variants = [None, *CHUNKS]


def prefill(chunk: int | None) -> tuple[float, float, float, int, list[int]]:
    """(wall s, CPU s, system s, minor page faults, first tokens) of one admission."""
    engine = runner._engine(point)
    engine.prefill_chunk = chunk
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = time.process_time(), time.perf_counter()
    out = engine.generate(prompts, sampling)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    faults = r1.ru_minflt - r0.ru_minflt
    return wall, cpu, r1.ru_stime - r0.ru_stime, faults, [o.token_ids[0] for o in out]


for chunk in variants:  # warm-up: every pass shape once, on short prompts
    engine = runner._engine(point)
    engine.prefill_chunk = chunk
    engine.generate([p[:192] for p in prompts], sampling)
ratios: dict[int, list[float]] = {c: [] for c in CHUNKS}
firsts = set()
for r in range(ROUNDS):
    order = variants[r % len(variants) :] + variants[: r % len(variants)]
    times = {}
    for chunk in order:
        wall, cpu, system, faults, first = prefill(chunk)
        times[chunk] = wall
        firsts.add(tuple(first))
        print(
            f"round {r} chunk {chunk}: wall {wall:.2f} s cpu {cpu:.2f} s (system {system:.2f}) "
            f"faults {faults / 1e3:.1f}k",
            flush=True,
        )
    for c in CHUNKS:
        ratios[c].append(times[c] / times[None])
for c in CHUNKS:
    xs = ratios[c]
    print(
        f"{QUANT} {BATCH}x{LEN} chunk {c}: time over one pass, median {statistics.median(xs):.3f} "
        f"[{min(xs):.2f}-{max(xs):.2f}] over {len(xs)} rounds"
    )
print(f"first tokens the same in every call: {len(firsts) == 1}")
