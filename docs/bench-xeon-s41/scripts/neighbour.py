"""A noisy neighbour for the 2-vCPU machine: one thread that streams a 1 GiB tensor
(memory-bound, as another tenant's inference would be) in bursts of 0.2-2 s separated by
idle gaps of 0.2-2 s (seeded), until killed. Run beside a bench to see what a busy host
does to `auto`'s timings.

    python neighbour.py &  ...  kill %1
"""

import random
import time

import torch

torch.set_num_threads(1)
x = torch.ones(256 * 1024 * 1024)  # 1 GiB fp32
rng = random.Random(0)
while True:
    until = time.perf_counter() + rng.uniform(0.2, 2.0)
    while time.perf_counter() < until:
        x.sum()
    time.sleep(rng.uniform(0.2, 2.0))
