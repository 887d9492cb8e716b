"""Admission of one 1,024-token prompt by two fresh plain engines, one of them with cache
rows 8 positions longer (the headroom a k_max = 8 window reserves), in turns, the order
reversed every turn: how far two engines that differ in nothing else read apart on this
host. `headroom_ab.py 1024 4`."""

import statistics
import sys
import time

from specdec.bench.cli import runner_for
from specdec.bench.plan import Point

L = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
TURNS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
METHODS = ("plain", "plain+8")
FLAGS = (
    "--model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype bf16 "
    f"--quant int4 --workloads synthetic --prompt-lens {L} --batches 1 --temperatures 0 "
    "--max-tokens 64 --prompts-per-point 4 --k-max 8 --synthetic-source sharegpt"
)
runner = runner_for(*FLAGS.split())
points = {m: Point("synthetic", L, 1, 0.0, "plain") for m in METHODS}
prompts = runner.prompts(points["plain"])
params = runner.params(points["plain"], len(prompts))
seconds = {m: [] for m in METHODS}
for turn in range(TURNS):
    order = METHODS if turn % 2 == 0 else METHODS[::-1]
    prompt = prompts[turn % len(prompts)]
    for method in order:
        engine = runner._engine(points[method])
        if method == "plain+8":
            engine.headroom += 8  # the rows a k_max = 8 window reserves
        engine.add_request(prompt, params[0])
        started = time.perf_counter()
        engine.admit()
        seconds[method].append(time.perf_counter() - started)
        del engine
    print({m: round(s[-1], 2) for m, s in seconds.items()}, flush=True)
for method in METHODS[1:]:
    ratios = [p / s for p, s in zip(seconds["plain"], seconds[method], strict=True)]
    middle = statistics.median(ratios)
    print(f"{method}: plain's admission time over its own, per turn: median {middle:.3f}", end="")
    print(f" (min {min(ratios):.3f}, max {max(ratios):.3f})")
