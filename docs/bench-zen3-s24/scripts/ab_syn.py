"""SmolLM2, batch 4, synthetic 256-token prompts, 32 tokens at temperature 1: plain and
`auto` with the given drafter, each with the inverse-CDF draw and with torch.multinomial,
taking turns in one process (medians of 4).

    .venv/bin/python docs/bench-zen3-s24/scripts/ab_syn.py ngram
"""

import sys

from turns import in_turn, multinomial, with_draw

from specdec import sampling
from specdec.bench.workloads import synthetic_prompt
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM("smollm2-135m-instruct", draft=sys.argv[1], speculate="auto", max_batch=4)
engines = {"plain": llm.plain_engine().generate, "auto": llm.engine.generate}
draws = {"icdf": sampling.draw, "multinomial": multinomial}
arms = {
    f"{d}/{e}": with_draw(draw, generate)
    for d, draw in draws.items()
    for e, generate in engines.items()
}
prompts = [synthetic_prompt(llm.tokenizer, 256, seed=s) for s in range(4)]
params = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=1)
for name, rate in in_turn(arms, prompts, params, repeats=4).items():
    print(name, round(rate, 1))
