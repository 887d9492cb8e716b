"""Plain decoding at temperature 1, the inverse-CDF draw against torch.multinomial, taking turns."""
import statistics, sys, time
import torch
from specdec import sampling
from specdec.llm import LLM
from specdec.config import SamplingParams
from specdec.bench.workloads import sharegpt_prompts
model, quant, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(model, quant=quant, max_batch=batch)
plain = llm.plain_engine()
prompts = [llm.encode(p, chat=True) for p in sharegpt_prompts(batch, seed=3)]
p = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=1)
new = sampling.draw
old = lambda probs, g: torch.multinomial(probs, 1, generator=g)  # noqa: E731
plain.generate(prompts, p)
res = {"inverse-cdf": [], "multinomial": []}
for rep in range(5):
    for name, f in (("inverse-cdf", new), ("multinomial", old)):
        sampling.draw = f
        t = time.perf_counter(); plain.generate(prompts, p); res[name].append(batch * 64 / (time.perf_counter() - t))
m = {k: statistics.median(v) for k, v in res.items()}
print(model, quant, "batch", batch, {k: round(v, 2) for k, v in m.items()}, "ratio", round(m["inverse-cdf"] / m["multinomial"], 3))
