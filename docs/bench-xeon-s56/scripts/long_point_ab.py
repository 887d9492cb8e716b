"""The sweep's 1024 x 1 point as the bench runs it (a fresh engine per run on one loaded
LLM with the draft, 4 synthetic ShareGPT prompts of 1,024 tokens in sequence, 64 greedy
tokens each), plain against draft-auto in turns (AB, BA, ...), with each request's time to
first token and decode time: the sweep read draft-auto 0.91x end to end (TTFT 6.0 s
against 5.0) while it never drafted. Usage: python long_point_ab.py [turns] [len]"""

import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.engine import Engine

torch.set_num_threads(2)
TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
LEN = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "bf16",
    "cpu",
    8,
    64,
    4,
    quant="int4",
    draft_quant="int4",
)
points = {m: Point("synthetic", LEN, 1, 0.0, m) for m in ("plain", "draft-auto")}
prompts = runner.prompts(points["plain"])
params = runner.params(points["plain"], len(prompts))
seen = {m: {"ttft": [], "decode": [], "wall": [], "step": []} for m in points}
steps: list[float] = []
_step = Engine._step


def timed_step(self, live, cache, drafter):  # each decode step's wall time
    t0 = time.perf_counter()
    _step(self, live, cache, drafter)
    steps.append(time.perf_counter() - t0)


Engine._step = timed_step


def run(method: str) -> None:
    engine = runner._engine(points[method])
    steps.clear()
    t0 = time.perf_counter()
    outs = [engine.generate([p], [q])[0] for p, q in zip(prompts, params, strict=True)]
    wall = time.perf_counter() - t0
    ttft = [o.ttft_s for o in outs]
    decode = [o.elapsed_s - o.ttft_s for o in outs]
    drafted = sum(o.stats.drafted for o in outs)
    seen[method]["ttft"] += ttft
    seen[method]["decode"] += decode
    seen[method]["wall"].append(wall)
    seen[method]["step"] += steps
    print(
        f"{method:10s} wall {wall:6.2f} s; ttft "
        + " ".join(f"{t:.2f}" for t in ttft)
        + "; decode "
        + " ".join(f"{d:.2f}" for d in decode)
        + f"; drafted {drafted}"
        + f"; step median {1e3 * statistics.median(steps):.1f} ms",
        flush=True,
    )


run("plain")  # warm
for turn in range(TURNS):
    for m in ("plain", "draft-auto")[:: 1 if turn % 2 == 0 else -1]:
        run(m)
for m, v in seen.items():
    print(
        f"{m}: median wall {statistics.median(v['wall']):.2f} s, ttft "
        f"{statistics.median(v['ttft']):.2f} s, decode {statistics.median(v['decode']):.2f} s, "
        f"step {1e3 * statistics.median(v['step']):.2f} ms "
        f"(mean {1e3 * statistics.mean(v['step']):.2f})"
    )

# Where a draft-auto run's host time goes beyond plain's: one run of each under cProfile,
# the functions of the window, the drafter and the engine's step by their own time.
import cProfile  # noqa: E402
import pstats  # noqa: E402

for m in ("plain", "draft-auto"):
    prof = cProfile.Profile()
    prof.enable()
    run(m)
    prof.disable()
    print(f"--- {m}: top functions by cumulative time")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(r"specdec", 25)
