"""Where a speculative step's time goes (bf16 1.5B target, int4 0.5B draft, fixed k):
the draft's forwards, its sampling, the target's verify forward, the acceptor, and the
rest of `Engine._step`, in ms per step, next to a plain step's, on the bench's code prompts.

    python docs/bench-zen3-s49/scripts/step_breakdown.py [K] [TOKENS]
"""

import statistics
import sys
import time
from collections import defaultdict

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads

torch.set_num_threads(2)
K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 128
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate=K,
)
engine = llm.engine
totals: dict[str, float] = defaultdict(float)
counts: dict[str, int] = defaultdict(int)
widths: dict[tuple[str, int], list[float]] = defaultdict(list)  # (model, tokens a row): s


def timed(owner, attr, label):
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        totals[label] += time.perf_counter() - start
        counts[label] += 1
        return out

    setattr(owner, attr, wrapper)


from specdec.acceptors import GreedyAcceptor, RejectionSampler  # noqa: E402
from specdec.drafters.draft_model import DraftModelDrafter  # noqa: E402

target = engine.model
forward = type(target).forward


def labelled_forward(self, *args, **kwargs):
    label = "target forward" if self is target else "draft forward"
    start = time.perf_counter()
    out = forward(self, *args, **kwargs)
    seconds = time.perf_counter() - start
    totals[label] += seconds
    counts[label] += 1
    widths[label, args[0].shape[1]].append(seconds)
    return out


type(target).forward = labelled_forward
timed(engine, "_step", "step")
# The acceptors' classes, not the engine's instance: an all-greedy pass checks its type.
timed(RejectionSampler, "__call__", "rejection acceptor")
timed(GreedyAcceptor, "__call__", "greedy acceptor")
timed(DraftModelDrafter, "_distribution", "draft q")
timed(DraftModelDrafter, "propose", "propose")
timed(DraftModelDrafter, "commit", "draft commit")
timed(DraftModelDrafter, "observe_pass", "observe_pass")
timed(engine.window, "observe", "window observe")
import specdec.drafters.draft_model as dm  # noqa: E402
import specdec.engine as eng  # noqa: E402

timed(dm, "sample", "draft sample")
timed(eng, "request_probs", "target probs")

params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
for mode in ("spec", "plain", "spec", "plain"):
    engine.window.k_max = K if mode == "spec" else 0
    for prompt in workloads.CODE_PROMPTS[:4]:
        llm.generate(prompt, params, chat=True)  # warm-up per mode is the first prompt
    totals.clear()
    counts.clear()
    widths.clear()
    n = 0
    start = time.perf_counter()
    for prompt in workloads.CODE_PROMPTS[:4]:
        n += len(llm.generate(prompt, params, chat=True)[0].token_ids)
    wall = time.perf_counter() - start
    steps = counts["step"]
    print(
        f"{mode} k={engine.window.k_max}: {n} tok, {n / wall:.2f} tok/s, {steps} steps, "
        f"{n / max(steps, 1):.2f} tok/step, wall/step {1000 * wall / steps:.1f} ms"
    )
    for label in sorted(totals, key=lambda lab: -totals[lab]):
        print(
            f"   {label:16s} {1000 * totals[label] / steps:7.2f} ms/step "
            f"({counts[label] / steps:.2f} calls/step)"
        )
    for (label, width), times in sorted(widths.items()):
        if len(times) >= 3:
            print(
                f"   {label} of {width} tokens: median {1000 * statistics.median(times):.1f} "
                f"ms over {len(times)} calls"
            )
