"""Seconds per `OnlineLearner` micro-step on the Qwen 1.5B's eagle head, fp32 or bf16
autocast, on a buffer of random states (the cost does not depend on their values).

    python learner_speed.py HEAD_DIR fp32|bf16 [MICRO_BATCH] [--profile]
"""

import statistics
import sys
import time

import torch

from specdec.models.loading import load_transformer
from specdec.models.registry import resolve
from specdec.speculator.eagle import load_eagle
from specdec.speculator.online import LearnConfig, OnlineLearner

torch.manual_seed(0)
target = load_transformer(resolve("qwen2.5-coder-1.5b-instruct", "bf16"), "bf16").eval()
head = load_eagle(sys.argv[1], target, target.dtype)
E = target.config.hidden_size
autocast = sys.argv[2] == "bf16"
mb = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 2
learner = OnlineLearner(head, LearnConfig(micro_batch=mb, batch_size=8, autocast=autocast))
for _ in range(20):
    n = 200
    learner.buffer.add(torch.randint(0, 30000, (n,)), torch.randn(n - 1, E).to(torch.bfloat16))
times = []
for _ in range(12):
    t = time.perf_counter()
    learner._micro_step()
    times.append(time.perf_counter() - t)
median = statistics.median(times[2:])
print(
    f"autocast={autocast} micro_batch={mb}: median {median:.3f} s per micro-step, "
    f"{mb * 64 / median:.0f} positions/s"
)
if "--profile" in sys.argv:
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        for _ in range(3):
            learner._micro_step()
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="cpu_time_total", row_limit=30, max_name_column_width=30
    )
    print(table)
