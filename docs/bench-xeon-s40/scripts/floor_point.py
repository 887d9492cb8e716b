"""Issue 13's floor point as the bench builds it, for the trace scripts beside this one:
the int4 Qwen 1.5B, 4 synthetic 1024-token prompts as one batch, 64 tokens, `auto` up to
k = 8. `point(method)` is its bench point; `engine(method)` a fresh engine for a run."""

from specdec.bench.plan import Point
from specdec.bench.runner import Runner

runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    None,
    "bf16",
    "cpu",
    k_max=8,
    max_tokens=64,
    prompts_per_point=4,
    quant="int4",
)


def point(method: str) -> Point:
    return Point("synthetic", 1024, 4, 0.0, method)


prompts = runner.prompts(point("plain"))
params = runner.params(point("plain"), len(prompts))


def engine(method: str):
    return runner._engine(point(method))
