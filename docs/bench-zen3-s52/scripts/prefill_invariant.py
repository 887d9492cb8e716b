"""bf16 prefills through the tuned plan against the batch-invariant native stack at every
length, taking turns (bf16 1.5B, 2 threads; medians of ROUNDS). Why: with the tuned plan a
prefill's kernel depends on how many tokens it computes, so a prompt whose prefix the
prefix cache holds is prefilled by another kernel than the same prompt cold, and greedy
bf16 output can differ at a near-tie (stop 52). With the native stack everywhere it does
not. (Scratch, not landed.)

    python docs/bench-zen3-s52/scripts/prefill_invariant.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.models.linear import Linear

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
llm = LLM("qwen2.5-coder-1.5b-instruct")
m = llm.model
layers = [mod for mod in m.modules() if isinstance(mod, Linear) and mod.plan]
tuned = [dict(mod.plan) for mod in layers]


def use(way: str) -> None:
    for mod, plan in zip(layers, tuned, strict=True):
        mod.plan = dict(plan) if way == "tuned" else {b: "native_bf16" for b in plan}
    m.decode_stack.forced = None if way == "tuned" else True


times = {(w, n): [] for w in ("tuned", "native") for n in (46, 128, 256)}
with torch.inference_mode():
    for r in range(rounds):
        for n in (46, 128, 256):
            for way in ("tuned", "native"):
                use(way)
                cache = m.new_cache(1, 512)
                tokens = torch.randint(
                    100, 20000, (1, n), generator=torch.Generator().manual_seed(n)
                )
                start = time.perf_counter()
                m(tokens, cache, logits_at=torch.tensor([[n - 1]]))
                times[way, n].append(time.perf_counter() - start)
        print(
            f"round {r}: " + ", ".join(f"{w} {n}: {t[-1]:.2f} s" for (w, n), t in times.items()),
            flush=True,
        )
for n in (46, 128, 256):
    a, b = statistics.median(times["tuned", n]), statistics.median(times["native", n])
    print(f"{n} tokens: tuned {a:.2f} s, native everywhere {b:.2f} s ({b / a:.2f}x)")
