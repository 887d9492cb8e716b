"""Which windows `auto` takes on the bench's code prompts (bf16 1.5B, int4 0.5B draft), step
by step, over two turns of the four prompts in one process: the first turn cold, as the
bench's `draft-auto` runs, the second on what the first learned. Prints each request's
windows (one digit a step) and its mean step time per window.

    python docs/bench-zen3-s48/scripts/auto_trace.py [auto | K]
"""

import sys
import time

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads

torch.set_num_threads(2)
spec = sys.argv[1] if len(sys.argv) > 1 else "auto"
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate=spec if spec == "auto" else int(spec),
)
engine = llm.engine
steps: list[tuple[int, float]] = []  # (k, seconds) of each step
step = engine._step


def timed_step(*args, **kwargs):
    start = time.perf_counter()
    result = step(*args, **kwargs)
    steps.append((engine.last_window, time.perf_counter() - start))
    return result


engine._step = timed_step
params = SamplingParams(max_tokens=128, temperature=0.0)
for turn in range(2):
    for i, prompt in enumerate(workloads.CODE_PROMPTS[:4]):
        steps.clear()
        start = time.perf_counter()
        out = llm.generate(prompt, params, chat=True)[0]
        seconds = time.perf_counter() - start
        ks = [k for k, _ in steps]
        n = len(out.token_ids)
        print(
            f"turn {turn} prompt {i}: {n} tok {seconds:.2f}s {n / seconds:.2f} tok/s "
            f"steps {len(steps)} ks {''.join(map(str, ks))}",
            flush=True,
        )
        per_k = {k: sum(s for kk, s in steps if kk == k) / ks.count(k) for k in sorted(set(ks))}
        print("   step ms by k:", {k: round(1000 * s, 1) for k, s in per_k.items()}, flush=True)
