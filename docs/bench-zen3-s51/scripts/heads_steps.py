"""Plain against heads `auto` step by step in fresh engines, as `specdec bench` runs them:
the int4 1.5B at batch 4 (4 ShareGPT prompts, seed 5, 48 tokens, ignore EOS), each turn
a new Engine per method (the bench's way), every step timed with the window it chose.
Stop 50 saw heads `auto` at 0.92x plain in decode there while drafting 4 tokens in all,
and the gap close in one warm process: which steps are slower?

    python docs/bench-zen3-s51/scripts/heads_steps.py [HEADS_DIR] [TURNS] [synthetic]

`synthetic`: the bench's 256-token synthetic prompts and 64 tokens instead (its
heads-256x4 point).
"""

import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.bench.workloads import sharegpt_prompts, synthetic_prompt
from specdec.config import SamplingParams
from specdec.engine import Engine
from specdec.llm import build_window

torch.set_num_threads(2)
heads_dir = sys.argv[1] if len(sys.argv) > 1 else "/root/.cache/specdec/runs/qwen15-heads-s50"
turns = int(sys.argv[2]) if len(sys.argv) > 2 else 3
llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4", draft=heads_dir, speculate="auto")
if len(sys.argv) > 3 and sys.argv[3] == "synthetic":
    prompts = [synthetic_prompt(llm.tokenizer, 256, seed=i) for i in range(4)]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
else:
    prompts = [llm.encode(p, chat=True) for p in sharegpt_prompts(4, seed=5)]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)

steps: list[tuple[int, float, float]] = []  # (k, seconds, capture/extra) of the current run
original = Engine._step


def timed_step(self, live, cache, drafter):
    t0 = time.perf_counter()
    original(self, live, cache, drafter)
    steps.append((self.last_window, time.perf_counter() - t0))


Engine._step = timed_step


def fresh(method: str) -> Engine:
    factory = None if method == "plain" else llm.engine.drafter_factory
    window = build_window(0 if method == "plain" else "auto", 8)
    return Engine(
        llm.model, llm.tokenizer, llm.eos_ids, 4, factory, None, window,
        prefix_cache_tokens=llm.prefix_cache_tokens, **llm.engine_options,
    )  # fmt: skip


for turn in range(turns):
    for method in ("plain", "heads") if turn % 2 == 0 else ("heads", "plain"):
        steps.clear()
        engine = fresh(method)
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        wall = time.perf_counter() - t0
        ms = [round(s * 1e3, 1) for _, s in steps]
        ks = [k for k, _ in steps]
        print(
            f"turn {turn} {method}: {len(steps)} steps, wall {wall:.2f} s (prefill "
            f"{engine.prefill_s:.2f}), step median {statistics.median(ms)} ms, sum "
            f"{sum(ms) / 1e3:.2f} s; k>0 at {[i for i, k in enumerate(ks) if k]}",
            flush=True,
        )
        print("   first 8 steps ms:", ms[:8], " slowest 5:", sorted(ms)[-5:], flush=True)
