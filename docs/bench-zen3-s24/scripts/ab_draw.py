"""Plain decoding at temperature 1, `sampling.draw` (inverse CDF) against torch.multinomial
put back in its place, taking turns in one process (medians of 5).

    .venv/bin/python \
        docs/bench-zen3-s24/scripts/ab_draw.py qwen2.5-coder-1.5b-instruct int4 1
"""

import sys

from turns import in_turn, multinomial, with_draw

from specdec import sampling
from specdec.bench.workloads import sharegpt_prompts
from specdec.config import SamplingParams
from specdec.llm import LLM

model, quant, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(model, quant=quant, max_batch=batch)
generate = llm.plain_engine().generate
arms = {
    "inverse-cdf": with_draw(sampling.draw, generate),
    "multinomial": with_draw(multinomial, generate),
}
prompts = [llm.encode(p, chat=True) for p in sharegpt_prompts(batch, seed=3)]
params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=1)
m = in_turn(arms, prompts, params, repeats=5)
ratio = round(m["inverse-cdf"] / m["multinomial"], 3)
print(model, quant, "batch", batch, {k: round(v, 2) for k, v in m.items()}, "ratio", ratio)
