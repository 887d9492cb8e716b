"""Admission (prefill included) of one 1,024-token prompt by a fresh engine of each method,
built as the bench builds them (`runner_for`, the sweep's flags), in turns, the order
reversed every turn: whether an engine holding a drafter admits a request more slowly than
plain's. `admit_ab.py 1024 6` (prompt length, turns). A third argument names the methods
compared with the first: `admit_ab.py 1024 4 plain,plain+8` is the control, two plain
engines of which `plain+8` has cache rows 8 positions longer (the headroom a k_max = 8
window reserves), to see how far engines that differ in nothing else read apart."""

import statistics
import sys
import time

from specdec.bench.cli import runner_for
from specdec.bench.plan import Point

L = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
TURNS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
METHODS = (
    tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("plain", "draft-auto", "ngram-auto")
)
EXTRA_HEADROOM = {"plain+8": 8}  # a variant: the method before "+" with longer cache rows
FLAGS = (
    "--model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype bf16 "
    f"--quant int4 --workloads synthetic --prompt-lens {L} --batches 1 --temperatures 0 "
    "--max-tokens 64 --prompts-per-point 4 --k-max 8 --synthetic-source sharegpt"
)
runner = runner_for(*FLAGS.split())
points = {m: Point("synthetic", L, 1, 0.0, m.split("+")[0]) for m in METHODS}
prompts = runner.prompts(points[METHODS[0]])
params = runner.params(points[METHODS[0]], len(prompts))
seconds = {m: [] for m in METHODS}
for turn in range(TURNS):
    order = METHODS if turn % 2 == 0 else METHODS[::-1]
    prompt = prompts[turn % len(prompts)]
    for method in order:
        engine = runner._engine(points[method])
        engine.headroom += EXTRA_HEADROOM.get(method, 0)
        engine.add_request(prompt, params[0])
        started = time.perf_counter()
        engine.admit()
        seconds[method].append(time.perf_counter() - started)
        del engine
    print({m: round(s[-1], 2) for m, s in seconds.items()}, flush=True)
for method in METHODS[1:]:
    ratios = [p / s for p, s in zip(seconds[METHODS[0]], seconds[method], strict=True)]
    middle = statistics.median(ratios)
    print(f"{method}: {METHODS[0]}'s admission time over its own, per turn: {middle:.3f}", end="")
    print(f" (min {min(ratios):.3f}, max {max(ratios):.3f})")
