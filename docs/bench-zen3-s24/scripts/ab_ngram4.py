"""SmolLM2, batch 4, ShareGPT prompts, 64 tokens: `ngram-auto` against plain decoding,
greedy and at temperature 1, taking turns in one process (medians of 5).

    .venv/bin/python docs/bench-zen3-s24/scripts/ab_ngram4.py
"""

from turns import in_turn

from specdec.bench.workloads import sharegpt_prompts
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM("smollm2-135m-instruct", draft="ngram", speculate="auto", max_batch=4)
arms = {"plain": llm.plain_engine().generate, "auto": llm.engine.generate}
prompts = [llm.encode(p, chat=True) for p in sharegpt_prompts(4, seed=3)]
for temperature in (0.0, 1.0):
    params = SamplingParams(temperature=temperature, max_tokens=64, ignore_eos=True, seed=1)
    m = in_turn(arms, prompts, params, repeats=5)
    ratio = round(m["auto"] / m["plain"], 3)
    print(temperature, {k: round(v, 1) for k, v in m.items()}, "auto/plain", ratio, flush=True)
