"""The first plain and k = 3 steps of fresh requests, int4 pair, chat (stop 34): the host's
two states, plain 23-25 ms or 33-36 ms while k = 3 steps stay near 65 ms."""

import time

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import LLM

llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    quant="int4",
    speculate=3,
    draft_vocab=65536,
)
prompts = [llm.encode(p, True) for p in workloads.sharegpt_prompts(4)]
for rep in range(4):
    for name, eng in (("plain", llm.plain_engine()), ("k3", None)):
        if eng is None:
            eng = llm.engine
        ts = []
        o = eng._step

        def step(*a, _o=o, _ts=ts, **kw):
            t = time.perf_counter()
            _o(*a, **kw)
            _ts.append(time.perf_counter() - t)

        eng._step = step
        for i, p in enumerate(prompts[:2]):
            ts.clear()
            eng.generate([p], [SamplingParams(temperature=0.0, max_tokens=12)])
            print(rep, name, i, " ".join(f"{t * 1e3:.0f}" for t in ts), flush=True)
        eng._step = o
