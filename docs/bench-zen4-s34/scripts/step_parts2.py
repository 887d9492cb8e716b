"""Engine k-step parts vs the bench's up-front costs, in one process, in turns."""

import statistics as st
import sys
import time

from specdec.bench import workloads
from specdec.bench.costs import forward_seconds
from specdec.config import SamplingParams
from specdec.llm import LLM

k = int(sys.argv[1])
wl = sys.argv[2]
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    quant="int4",
    speculate=k,
    draft_vocab=65536,
)
calls = {"draft": [], "target": []}


def wrap(m, key):
    f = m.forward

    def g(tokens, *a, **kw):
        t = time.perf_counter()
        out = f(tokens, *a, **kw)
        calls[key].append((tokens.shape[1], time.perf_counter() - t))
        return out

    m.forward = g


eng = llm.engine
steps = []
orig_step = eng._step


def step(*a, **kw):
    t = time.perf_counter()
    orig_step(*a, **kw)
    steps.append(time.perf_counter() - t)


eng._step = step
if wl == "code":
    prompts = [llm.encode(p, False) for p in workloads.CODE_PROMPTS[:4]]
else:
    prompts = [llm.encode(p, True) for p in workloads.sharegpt_prompts(4)]
params = SamplingParams(temperature=0.0, max_tokens=64)
plain = llm.plain_engine()
pst = []
po = plain._step


def pstep(*a, **kw):
    t = time.perf_counter()
    po(*a, **kw)
    pst.append(time.perf_counter() - t)


plain._step = pstep
wrap(llm.model, "target")
wrap(llm.draft_model, "draft")
for rep in range(3):
    for key in calls:
        calls[key].clear()
    steps.clear()
    pst.clear()
    for p in prompts:
        eng.generate([p], [params])
    d = [t for n, t in calls["draft"] if n <= 2]
    v = [t for n, t in calls["target"] if n == k + 1]
    for p in prompts:
        plain.generate([p], [params])
    pv = [t for n, t in calls["target"] if n == 1]
    up_t = forward_seconds(llm.model, 1, (1, k + 1), 64, repeats=5)
    up_d = forward_seconds(llm.draft_model, 1, (1,), 64, repeats=5)

    def med(xs):
        return st.median(xs) * 1e3

    print(
        f"rep {rep}: spec step {med(steps):.1f} ms (n {len(steps)}), "
        f"draft call {med(d):.2f} (n {len(d)}), verify call {med(v):.2f} (n {len(v)}); "
        f"plain step {med(pst):.2f}, plain fwd {med(pv):.2f} | up-front min: "
        f"v1 {up_t[1] * 1e3:.2f} v{k + 1} {up_t[k + 1] * 1e3:.2f} draft {up_d[1] * 1e3:.2f}",
        flush=True,
    )
