"""What one MLP speculator head's drafting costs, as loaded before and after
`MLPSpeculator.for_drafting` (the heads trained at stop 50 on the int4 Qwen 1.5B): ms per
`propose_greedy` of 1..3 tokens at batch 1 and 4, the forms taking turns, medians of 5
rounds of 10 calls; and the target's int4 step at those batches for scale.

    python docs/bench-zen3-s51/scripts/heads_cost.py [HEADS_DIR]
"""

import copy
import statistics
import sys
import time

import torch

from specdec.bench.costs import forward_seconds
from specdec.llm import _tuned, tuned_layers
from specdec.models.loading import load_transformer
from specdec.models.quant import quantize
from specdec.models.registry import resolve
from specdec.speculator import load_speculator

torch.set_num_threads(2)
heads_dir = sys.argv[1] if len(sys.argv) > 1 else "/root/.cache/specdec/runs/qwen15-heads-s50"
target = load_transformer(resolve("qwen2.5-coder-1.5b-instruct", "bf16"), "bf16")
target = _tuned(quantize(target, "int4"))  # as LLM runs it
loaded = load_speculator(heads_dir, target, target.dtype)
forms = {
    "as loaded (nn.Linear, bf16)": loaded,
    "for_drafting('none'), tuned": tuned_layers(copy.deepcopy(loaded).for_drafting("none")),
    "for_drafting('int4'), tuned": tuned_layers(copy.deepcopy(loaded).for_drafting("int4")),
}
for rows in (1, 4):
    hidden = torch.randn(rows, target.config.hidden_size, dtype=target.dtype)
    last = torch.arange(rows) + 100
    for n in (1, 3):
        times = {name: [] for name in forms}
        for _ in range(5):
            for name, spec in forms.items():
                spec.propose_greedy(hidden, last, n)
                t0 = time.perf_counter()
                for _ in range(10):
                    spec.propose_greedy(hidden, last, n)
                times[name].append((time.perf_counter() - t0) / 10 * 1e3)
        for name, ts in times.items():
            print(f"batch {rows}, {n} token(s), {name}: {statistics.median(ts):.2f} ms", flush=True)
    step = forward_seconds(target, rows, (1,), 256, repeats=5)[1]
    print(f"batch {rows}: the int4 target's step {step * 1e3:.1f} ms", flush=True)
