import time, statistics
from specdec.llm import LLM
from specdec.config import SamplingParams
from specdec.bench.workloads import sharegpt_prompts
llm = LLM("smollm2-135m-instruct", draft="ngram", speculate="auto", max_batch=4)
plain = llm.plain_engine()
prompts = [llm.encode(p, chat=True) for p in sharegpt_prompts(4, seed=3)]
for T in (0.0, 1.0):
    p = SamplingParams(temperature=T, max_tokens=64, ignore_eos=True, seed=1)
    res = {"plain": [], "auto": []}
    for rep in range(5):
        for name, eng in (("plain", plain), ("auto", llm.engine)):
            t = time.perf_counter(); eng.generate(prompts, p); res[name].append(4 * 64 / (time.perf_counter() - t))
    m = {k: statistics.median(v) for k, v in res.items()}
    print(T, {k: round(v, 1) for k, v in m.items()}, "auto/plain", round(m["auto"] / m["plain"], 3), flush=True)
