"""Plain against `auto` (SmolLM2 drafting for itself, int4 draft) on the bench's code or
synthetic prompts, a fresh engine per run, taking turns in one process: medians of the
per-turn ratios in wall and CPU time. Stop 26 read 0.984 / 0.986 on code at temperature 1
(`ab_code.py 0 1 9`), a point the quick preset flagged at 0.90x.

    .venv/bin/python docs/bench-zen3-s26/scripts/ab_code.py LENGTH TEMPERATURE TURNS
    (LENGTH 0: the code prompts with the chat template; else synthetic prompts of LENGTH)
"""

import statistics
import sys
import time

from specdec.bench.workloads import CODE_PROMPTS, synthetic_prompt
from specdec.config import SamplingParams
from specdec.engine import Engine
from specdec.llm import LLM, build_acceptor, build_window
from specdec.tokenization import encode_prompt

length, temperature, turns = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
llm = LLM("smollm2-135m-instruct", draft="smollm2-135m-instruct", speculate="auto")
tok = llm.tokenizer
if length:
    prompts = [synthetic_prompt(tok, length, seed=i) for i in range(4)]
else:
    prompts = [encode_prompt(tok, CODE_PROMPTS[i], True) for i in range(4)]
seeds = [i if temperature > 0 else None for i in range(4)]
params = [SamplingParams(temperature=temperature, max_tokens=32, seed=s) for s in seeds]


def engine(drafter: bool) -> Engine:
    return Engine(
        llm.model,
        tok,
        llm.eos_ids,
        1,
        llm.engine.drafter_factory if drafter else None,
        build_acceptor("rejection"),
        build_window("auto" if drafter else 0, 8),
        prefix_cache_tokens=4096,
        **llm.engine_options,
    )


for drafter in (False, True):  # warm-up
    engine(drafter).generate(prompts, params)
wall: dict[bool, list[float]] = {False: [], True: []}
cpu: dict[bool, list[float]] = {False: [], True: []}
for turn in range(turns):
    for drafter in (False, True) if turn % 2 == 0 else (True, False):
        e = engine(drafter)
        w, c = time.perf_counter(), time.process_time()
        e.generate(prompts, params)
        wall[drafter].append(time.perf_counter() - w)
        cpu[drafter].append(time.process_time() - c)


def ratio(times: dict[bool, list[float]]) -> float:
    return statistics.median(p / a for p, a in zip(times[False], times[True], strict=True))


print(f"auto / plain: {ratio(wall):.3f} wall, {ratio(cpu):.3f} CPU ({turns} turns)")
