"""How does this host's speed move, and which kind of work moves with it? Every ~1.5 s for
SECONDS, three fixed workloads are timed back to back, 0.3 s each: a bf16 matrix product
(AMX on this Xeon: a prefill's kind of work), an fp32 one (AVX-512 FMA) and a read of
1 GiB (`x.sum()`: a decode step's kind of work). Prints each reading, then each series'
spread and the correlations between them.

    python host_probe.py [seconds]
"""

import statistics
import sys
import time

import torch

torch.set_num_threads(2)
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 180
a16 = torch.randn(1024, 1536, dtype=torch.bfloat16)
b16 = torch.randn(1536, 8960, dtype=torch.bfloat16)
a32, b32 = a16.float(), b16.float()
big = torch.ones(1 << 28)  # 1 GiB of fp32


def rate(work, amount: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        work()
        n += 1
    return n * amount / (time.perf_counter() - t0)


flops = 2 * 1024 * 1536 * 8960 / 1e9
series = {"bf16 GFLOP/s": [], "fp32 GFLOP/s": [], "read GB/s": []}
start = time.perf_counter()
while time.perf_counter() - start < SECONDS:
    readings = (
        rate(lambda: torch.mm(a16, b16), flops),
        rate(lambda: torch.mm(a32, b32), flops),
        rate(lambda: big.sum(), big.numel() * 4 / 1e9),
    )
    for xs, x in zip(series.values(), readings, strict=True):
        xs.append(x)
    line = " ".join(f"{x:8.1f}" for x in readings)
    print(f"{time.perf_counter() - start:6.1f} s {line}", flush=True)
    time.sleep(0.5)
for name, xs in series.items():
    print(f"{name}: median {statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]")
names = list(series)
for i in range(3):
    for j in range(i + 1, 3):
        r = statistics.correlation(series[names[i]], series[names[j]])
        print(f"correlation {names[i]} / {names[j]}: {r:.2f}")
