"""The speculator trainer's two costs on the machine at hand (stop 36, issue 15): the
target's states (`train.TargetStates`, a batch of 4 x 256 tokens, bf16 and fp32) and one
optimizer step of 3 heads over a 16,384-id draft vocabulary (`train.head_losses`,
backward, AdamW) in fp32 and under bf16 autocast; positions per second, medians of 3
after a warm-up, the variants taking turns twice.

    .venv/bin/python docs/bench-xeon-s36/scripts/train_speed.py [model]
"""

import json
import statistics
import sys
import time

import torch

from specdec.models.kernel_tuning import machine
from specdec.models.loading import load_transformer
from specdec.models.registry import resolve
from specdec.speculator.model import build_speculator
from specdec.speculator.train import TargetStates, head_losses

model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
B, T, N = 4, 256, 16384


def median_s(fn, repeats=3):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


report = {"machine": machine()["cpu"], "threads": torch.get_num_threads(), "target": {}}
targets = {d: load_transformer(resolve(model, d), d, torch.device("cpu")) for d in ("bf16", "fp32")}
V, E = targets["bf16"].config.vocab_size, targets["bf16"].config.hidden_size
ids = torch.randint(0, 30000, (B, T))
for _turn in range(2):
    for dtype, target in targets.items():
        states = TargetStates(target)
        with torch.inference_mode():
            s = median_s(lambda states=states: states(ids))
        report["target"].setdefault(dtype, []).append(round(B * T / s, 1))

torch.manual_seed(0)
vocab = torch.randperm(V)[:N]
spec = build_speculator(targets["bf16"], 3, draft_vocab=vocab).train()
del targets
hidden = torch.randn(B, T, E).bfloat16()
tokens = vocab[torch.randint(0, N, (B, T))]
valid = torch.ones(B, T, dtype=torch.bool)
opt = torch.optim.AdamW(spec.trainable, lr=1e-4)


def step(autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, _ = head_losses(spec, hidden, tokens, valid)
    opt.zero_grad()
    loss.backward()
    opt.step()


report["heads"] = {}
for _turn in range(2):
    for name, autocast in (("fp32", False), ("bf16 autocast", True)):
        s = median_s(lambda autocast=autocast: step(autocast))
        report["heads"].setdefault(name, []).append(round(B * T / s, 1))
print(json.dumps(report, indent=1))
