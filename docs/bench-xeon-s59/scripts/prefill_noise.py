"""Is the int4 4 x 256 prefill's spread (2.0-6.7 s for the same call in stop 59's traced
sweeps) the code's or the host's? One plain engine as the bench builds it prefills the
same 4 prompts (max_tokens = 1) N times; around each, a fixed reference workload (a bf16
matrix product of the prefill's shape class, [1024, 1536] x [1536, 8960], repeated for
~0.3 s) is timed. If the reference's speed follows the prefill's, the host moved.
Per call: wall, CPU, page faults, and the reference's GFLOP/s before and after.

    python prefill_noise.py [N] [quant] [len] [batch]
"""

import resource
import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.config import SamplingParams

torch.set_num_threads(2)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
QUANT = sys.argv[2] if len(sys.argv) > 2 else "int4"
LEN = int(sys.argv[3]) if len(sys.argv) > 3 else 256
BATCH = int(sys.argv[4]) if len(sys.argv) > 4 else 4
runner = Runner(
    "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "bf16", "cpu", 8, 64, 4,
    quant=QUANT, draft_quant="int4",
)  # fmt: skip
point = Point("synthetic", LEN, BATCH, 0.0, "plain")
prompts = runner.prompts(point)[:BATCH]
sampling = [SamplingParams(temperature=0.0, max_tokens=1, seed=0)] * BATCH
a = torch.randn(1024, 1536, dtype=torch.bfloat16)
b = torch.randn(1536, 8960, dtype=torch.bfloat16)


def reference() -> float:
    """GFLOP/s of a fixed bf16 product, repeated for ~0.3 s."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        torch.mm(a, b)
        n += 1
    return n * 2 * 1024 * 1536 * 8960 / (time.perf_counter() - t0) / 1e9


runner._engine(point).generate([p[:64] for p in prompts], sampling)  # warm-up
rows = []
for i in range(N):
    before = reference()
    engine = runner._engine(point)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = time.process_time(), time.perf_counter()
    engine.generate(prompts, sampling)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    del engine
    after = reference()
    row = dict(
        wall=wall, cpu=cpu, sys=r1.ru_stime - r0.ru_stime,
        faults_k=(r1.ru_minflt - r0.ru_minflt) / 1e3, ref_before=before, ref_after=after,
    )  # fmt: skip
    rows.append(row)
    print(i, " ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
walls = [r["wall"] for r in rows]
refs = [(r["ref_before"] + r["ref_after"]) / 2 for r in rows]
print(f"wall median {statistics.median(walls):.2f} [{min(walls):.2f}-{max(walls):.2f}]")
print(f"reference GFLOP/s median {statistics.median(refs):.0f} [{min(refs):.0f}-{max(refs):.0f}]")
if len(rows) > 2:
    r = statistics.correlation(walls, [1 / ref for ref in refs])
    print(f"correlation of wall and 1/reference: {r:.2f}")
