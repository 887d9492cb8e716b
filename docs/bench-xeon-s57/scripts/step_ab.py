"""The sweep's long points as the bench runs them (a fresh engine per run on one loaded
LLM with the draft; the point's synthetic ShareGPT prompts, 64 greedy tokens), plain,
draft-auto and ngram-auto in rotating turns, with each run's decode-step median, its
kernel (system) CPU seconds and minor page faults: at int4 1024 x 4 the sweep read
TPOT 69.5 ms plain, 87.2 draft-auto and 95.0 ngram-auto, neither auto drafting.
Usage: python step_ab.py [turns] [len] [batch] [quant] [profile: method to cProfile]"""

import cProfile
import pstats
import resource
import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.engine import Engine

torch.set_num_threads(2)
TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
LEN = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 4
QUANT = sys.argv[4] if len(sys.argv) > 4 else "int4"
PROFILE = sys.argv[5] if len(sys.argv) > 5 else None
METHODS = ("plain", "draft-auto", "ngram-auto")
runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "bf16",
    "cpu",
    8,
    64,
    4,
    quant=QUANT,
    draft_quant="int4",
)
points = {m: Point("synthetic", LEN, BATCH, 0.0, m) for m in METHODS}
prompts = runner.prompts(points["plain"])
params = runner.params(points["plain"], len(prompts))
steps: list[float] = []
_step = Engine._step


def timed_step(self, live, cache, drafter):
    t0 = time.perf_counter()
    _step(self, live, cache, drafter)
    steps.append(time.perf_counter() - t0)


Engine._step = timed_step
seen = {m: [] for m in METHODS}


def run(method: str, profile: bool = False) -> None:
    engine = runner._engine(points[method])
    steps.clear()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    outs = []
    for i in range(0, len(prompts), BATCH):
        outs += engine.generate(prompts[i : i + BATCH], params[i : i + BATCH])
    if prof:
        prof.disable()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    del engine
    row = dict(
        wall=wall,
        step_ms=1e3 * statistics.median(steps),
        user=r1.ru_utime - r0.ru_utime,
        sys=r1.ru_stime - r0.ru_stime,
        faults=r1.ru_minflt - r0.ru_minflt,
        drafted=sum(o.stats.drafted for o in outs),
        ttft=statistics.median(o.ttft_s for o in outs),
    )
    seen[method].append(row)
    print(method.ljust(10), " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


run("plain")  # warm
for turn in range(TURNS):
    shift = turn % len(METHODS)
    order = METHODS[shift:] + METHODS[:shift]
    for m in order[::-1] if turn % 2 else order:
        run(m)
for m, rows in seen.items():
    print(m, {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]})
if PROFILE:
    run("plain", profile=True)
    run(PROFILE, profile=True)
