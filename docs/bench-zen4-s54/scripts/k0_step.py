"""A step at k = 0 with the int4 draft attached (draft-auto, not drafting) against a plain
step, batch 4, 251-token prompts, int4 pair, in one process: does a non-drafting drafter
cost a batch-4 step anything? Then a cProfile of one drafting-enabled run.
Usage: python k0_step.py"""

import cProfile
import io
import pstats
import statistics
import time

import torch

from specdec import LLM, SamplingParams

torch.set_num_threads(2)
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    quant="int4",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate="auto",
)
eng = llm.engine
prompts = [" ".join(["word"] * 250) + f" {i}" for i in range(4)]
params = SamplingParams(max_tokens=48, temperature=0.0)
steps = {}
orig = type(eng)._step


def timed(self, live, cache, drafter):
    t0 = time.perf_counter()
    orig(self, live, cache, drafter)
    steps.setdefault(self._tag, []).append((time.perf_counter() - t0, self.last_window))


type(eng)._step = timed
for _turn in range(3):
    for tag, k in (("plain", 0), ("auto", 8)):
        eng.window.k_max = k
        eng._tag = f"{tag}"
        llm.generate(prompts, params)
for tag, v in steps.items():
    ts = [t for t, k in v if k == 0]
    print(
        tag,
        "k=0 steps",
        len(ts),
        "median ms",
        round(1000 * statistics.median(ts), 2),
        "windows",
        sorted(set(k for _, k in v)),
    )
eng.window.k_max = 8
eng._tag = "prof"
pr = cProfile.Profile()
pr.enable()
llm.generate(prompts, params)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
print(s.getvalue()[:3000])
