"""The suffix drafter's own cost per engine step (propose + commit, one row) over a 60K-token
store: with no match and while copying 16 tokens a step (docs/benchmarks.md, "Suffix decoding").
Prints the 10th percentile of 200 steps: the step's own cost, less a shared host's noise."""

import random
import time

import torch

from specdec.drafters.suffix import SuffixDrafter, SuffixStore

random.seed(0)
base = [random.randrange(30000) for _ in range(2000)]


def bench(history, store, steps=200):
    d = SuffixDrafter(store, calibrated=False)
    d.admit([history])
    best = []
    for _ in range(steps):
        t = time.perf_counter()
        d.propose(16, None, None)
        n = len(d._last[0])
        d.commit(torch.tensor([n]), torch.tensor([base[(len(d.tokens(0)) + n) % 2000]]))
        best.append((time.perf_counter() - t, n))
    best.sort()
    return best[len(best) // 10]  # 10th percentile: the step's own cost, less the neighbours'


store = SuffixStore(1 << 16)
for _ in range(60):  # 60K tokens of past requests, distinct
    store.close(store.open([random.randrange(30000) for _ in range(1000)]))
print(
    "no match (random history), 60K-token store:",
    bench([random.randrange(30000) for _ in range(500)], store),
)
print("copying (repeated history), 60K-token store:", bench(base * 2, store))
