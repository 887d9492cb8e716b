"""Is draft-auto's first token dearer than plain's when it never drafts? At int4 1024 x 1
its TTFT median read above plain's in every sweep of stops 56-58 (by 2-21%), where both
run the same target prefill. Here each method's engine, as the bench builds it, runs one
prompt to its first token (max_tokens = 1) in turns that rotate the methods' order, the
same prompt within a turn; per run: the whole call, the cache and drafter set-up
(`_ensure_cache`), the target's prefill (`_prefill`), kernel CPU time and page faults.
`plain+drafter` is plain holding the drafter draft-auto builds (its caches), unused.
`plain-h10` is plain with auto's cache headroom (k_max + 2 = 10 positions past a row's
end, plain's own is 2): at bf16 1024 x 4 plain's TTFT read above both autos' in stops
57-58 for the same prefill.
`max tokens` past 1 takes the drafter's admission (and that many - 1 decode steps) in.
Usage: python prefill_ab.py [turns] [len] [batch] [quant] [methods, comma-separated]
[max tokens]"""

import resource
import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.config import SamplingParams
from specdec.engine import Engine

torch.set_num_threads(2)
TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
LEN = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 1
QUANT = sys.argv[4] if len(sys.argv) > 4 else "int4"
METHODS = (
    tuple(sys.argv[5].split(",")) if len(sys.argv) > 5 else ("plain", "draft-auto", "ngram-auto")
)
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
points = {
    m: Point("synthetic", LEN, BATCH, 0.0, m.removesuffix("-h10").removesuffix("+drafter"))
    for m in METHODS
}
prompts = runner.prompts(points["plain"])


def engine_for(method: str) -> Engine:
    engine = runner._engine(points[method])
    if method.endswith("-h10"):
        engine.headroom = 10
    if method == "plain+drafter":  # plain, holding the drafter draft-auto builds, unused
        ensure = engine._ensure_cache

        def with_drafter() -> None:
            ensure()
            cache = engine._cache
            engine.idle_drafter = runner.llm.engine.drafter_factory(cache.max_batch, cache.max_len)

        engine._ensure_cache = with_drafter
    return engine


timed: dict[str, float] = {}


def timing(name, method):
    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            timed[name] = timed.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


Engine._prefill = timing("prefill", Engine._prefill)
Engine._ensure_cache = timing("ensure", Engine._ensure_cache)
seen = {m: [] for m in METHODS}
NEW = int(sys.argv[6]) if len(sys.argv) > 6 else 1
sampling = SamplingParams(temperature=0.0, max_tokens=NEW, seed=0)
for m in METHODS:  # warm-up: short prompts, every method's shapes once
    engine_for(m).generate([p[:64] for p in prompts[:BATCH]], [sampling] * BATCH)
for turn in range(TURNS):
    shift = turn % len(METHODS)
    order = METHODS[shift:] + METHODS[:shift]
    order = order[::-1] if (turn // len(METHODS)) % 2 else order
    chosen = [prompts[(turn + j) % len(prompts)] for j in range(BATCH)]
    for method in order:
        engine = engine_for(method)
        timed.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0, t0 = time.process_time(), time.perf_counter()
        outs = engine.generate(chosen, [sampling] * BATCH)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        del engine
        row = dict(
            wall=wall,
            cpu=cpu,
            prefill=timed.get("prefill", 0.0),
            ensure=timed.get("ensure", 0.0),
            sys=r1.ru_stime - r0.ru_stime,
            faults=(r1.ru_minflt - r0.ru_minflt) / 1e3,
            ttft=statistics.median(o.ttft_s for o in outs),
        )
        seen[method].append(row)
        print(turn, method.ljust(10), " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
print("medians (faults in thousands); per-turn ratio of wall and cpu over plain's")
for method, rows in seen.items():
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratios = ""
    if method != "plain":
        for key in ("wall", "cpu", "prefill"):
            xs = [r[key] / p[key] for r, p in zip(rows, seen["plain"], strict=True)]
            ratios += f" {key}-ratio {statistics.median(xs):.3f} [{min(xs):.2f}-{max(xs):.2f}]"
    print(method.ljust(10), " ".join(f"{k} {v:.3f}" for k, v in med.items()) + ratios)
