"""Why draft-auto drafted one step in a run at the bf16 sweep's 256 x 4 point (4 tokens,
3 accepted) and never again, where at 256 x 1 it drafted 5.1 tokens a pass: the window's
choice each step of one run as the bench makes it (a fresh engine, 4 synthetic ShareGPT
prompts of 256 tokens in one batch, 64 greedy tokens), with what it priced.
Usage: python auto_trace_256x4.py [len] [batch]"""

import sys

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.cost_model import AdaptiveWindow

torch.set_num_threads(2)
LEN = int(sys.argv[1]) if len(sys.argv) > 1 else 256
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 4
runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "bf16",
    "cpu",
    8,
    64,
    4,
    quant="none",
    draft_quant="int4",
)
point = Point("synthetic", LEN, BATCH, 0.0, "draft-auto")
prompts = runner.prompts(point)
params = runner.params(point, len(prompts))
choose = AdaptiveWindow.choose
log = []


def traced(self, rows, catch_up=0, remaining=None):
    k = choose(self, rows, catch_up, remaining)
    c = self.costs
    alpha = [round(a, 2) for a in self.alpha[:4]]
    best = c.best_window(rows, self.alpha, self.k_max) if c.draft_time(rows) else None
    log.append(
        f"rows {rows} catch_up {catch_up} remaining {remaining} -> k {k}; off {self._off} "
        f"alpha {alpha} plain {c.verify_time(rows, 1)} draft {c.draft_time(rows)} "
        f"v(2) {c.verify_time(rows, 2)} v(4) {c.verify_time(rows, 4)} best {best}"
    )
    return k


AdaptiveWindow.choose = traced
for attempt in range(2):
    log.clear()
    engine = runner._engine(point)
    outs = engine.generate(prompts[:BATCH], params[:BATCH])
    print(f"--- run {attempt}: drafted {sum(o.stats.drafted for o in outs)}")
    for line in log[:12] + ["..."] + log[-3:]:
        print(line)
