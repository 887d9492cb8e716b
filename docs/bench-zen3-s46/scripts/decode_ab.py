"""Decode steps of plain against draft-auto at the sweep's 1024 x 4 point: one engine each,
built as the bench builds them (`runner_for`, the sweep's flags), one prefill each, then 60
steps taken in turns, one step of each engine at a time, the order reversed every step:
the per-step ratio, which a host's drift cannot bias as it biases whole runs 100 s apart.
`decode_ab.py 1024`."""

import statistics
import sys
import time

from specdec.bench.cli import runner_for
from specdec.bench.plan import Point

L = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
FLAGS = (
    "--model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype bf16 "
    f"--quant int4 --workloads synthetic --prompt-lens {L} --batches 4 --temperatures 0 "
    "--max-tokens 64 --prompts-per-point 4 --k-max 8 --synthetic-source sharegpt"
)
runner = runner_for(*FLAGS.split())
engines = {}
for method in ("plain", "draft-auto"):
    point = Point("synthetic", L, 4, 0.0, method)
    prompts = runner.prompts(point)
    params = runner.params(point, len(prompts))
    eng = runner._engine(point)
    for p, sp in zip(prompts, params, strict=True):
        eng.add_request(p, sp)
    t = time.perf_counter()
    eng.admit()
    print(method, "prefill", round(time.perf_counter() - t, 1), flush=True)
    engines[method] = eng
ratios, pt, dt = [], [], []
for step in range(60):
    order = list(engines.items()) if step % 2 == 0 else list(engines.items())[::-1]
    got = {}
    for method, eng in order:
        t = time.perf_counter()
        eng.decode()
        got[method] = time.perf_counter() - t
    pt.append(got["plain"])
    dt.append(got["draft-auto"])
    ratios.append(got["plain"] / got["draft-auto"])
print(
    "plain step median ms",
    round(statistics.median(pt) * 1e3, 1),
    "draft-auto",
    round(statistics.median(dt) * 1e3, 1),
)
print(
    "per-step ratio plain/draft-auto median",
    round(statistics.median(ratios), 3),
    "quartiles",
    [round(q, 3) for q in statistics.quantiles(ratios, n=4)],
)
print("k", engines["draft-auto"].last_window)
