"""Time OnlineLearner micro-steps on the Qwen 1.5B eagle head: fp32 vs bf16 autocast."""
import statistics, sys, time
import torch
from specdec.models.loading import load_transformer
from specdec.models.registry import resolve
from specdec.speculator.eagle import load_eagle
from specdec.speculator.online import LearnConfig, OnlineLearner

torch.manual_seed(0)
target = load_transformer(resolve("qwen2.5-coder-1.5b-instruct", "bf16"), "bf16").eval()
head = load_eagle(sys.argv[1], target, target.dtype)
E = target.config.hidden_size
autocast = len(sys.argv) > 2 and sys.argv[2] == "bf16"
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 2
learner = OnlineLearner(head, LearnConfig(micro_batch=mb, batch_size=8))
for _ in range(20):
    n = 200
    learner.buffer.add(torch.randint(0, 30000, (n,)), torch.randn(n - 1, E).to(torch.bfloat16))
times = []
for i in range(12):
    t = time.perf_counter()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        learner._micro_step()
    times.append(time.perf_counter() - t)
print(f"autocast={autocast} micro_batch={mb}: median {statistics.median(times[2:]):.3f} s "
      f"per micro-step, {mb*64/statistics.median(times[2:]):.0f} positions/s")
if "--profile" in sys.argv:
    from torch.profiler import profile
    with profile(record_shapes=True) as prof:
        for _ in range(3):
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                learner._micro_step()
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=30, max_shapes_column_width=90))
