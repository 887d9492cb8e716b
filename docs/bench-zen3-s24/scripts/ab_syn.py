import statistics, time, sys
import torch
from specdec import sampling
from specdec.llm import LLM
from specdec.config import SamplingParams
from specdec.bench.workloads import synthetic_prompt
draft = sys.argv[1]
llm = LLM("smollm2-135m-instruct", draft=draft, speculate="auto", max_batch=4)
plain = llm.plain_engine()
prompts = [synthetic_prompt(llm.tokenizer, 256, seed=s) for s in range(4)]
p = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=1)
new = sampling.draw
old = lambda probs, g: torch.multinomial(probs, 1, generator=g)  # noqa: E731
res = {}
for rep in range(4):
    for dname, f in (("icdf", new), ("multinomial", old)):
        sampling.draw = f
        for ename, eng in (("plain", plain), ("auto", llm.engine)):
            t = time.perf_counter(); eng.generate(prompts, p)
            res.setdefault((dname, ename), []).append(4 * 32 / (time.perf_counter() - t))
for k, v in res.items():
    print(k, round(statistics.median(v), 1), [round(x, 1) for x in v])
