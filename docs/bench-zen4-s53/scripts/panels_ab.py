"""Plain bf16 decoding of the 1.5B with the native kernel's weights in panels of 32 (the
AVX-512 layout of stop 53) against the row layout it read before, in turns in one process.

Two `LLM`s of the same model: the second is built with `native.bf16_panels` patched to
False, so its layers keep the row layout (the kernel plans and everything else are the
same). Each round decodes one code prompt (64 tokens, greedy) on both, in alternating
order; the ratio is decode tok/s, panels over rows, and the outputs are compared.

    python docs/bench-zen4-s53/scripts/panels_ab.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads
from specdec.models import native

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
MODEL = "qwen2.5-coder-1.5b-instruct"
panels = LLM(MODEL, speculate=0)
native_panels = native.bf16_panels
native.bf16_panels = lambda: False  # the second model's layers keep the row layout
rows = LLM(MODEL, speculate=0)
native.bf16_panels = native_panels
engines = {"panels": panels.plain_engine(), "rows": rows.plain_engine()}
prompts = [panels.encode(p, chat=True) for p in workloads.CODE_PROMPTS[:4]]
params = SamplingParams(max_tokens=64, temperature=0.0)
for engine in engines.values():
    for ids in prompts:
        engine.generate([ids], SamplingParams(max_tokens=8, temperature=0.0))
ratios, same = [], 0
for r in range(rounds):
    ids = prompts[r % len(prompts)]
    order = ["panels", "rows"] if r % 2 == 0 else ["rows", "panels"]
    decode, tokens = {}, {}
    for name in order:
        start = time.perf_counter()
        out = engines[name].generate([ids], params)[0]
        decode[name] = (len(out.token_ids) - 1) / (time.perf_counter() - start - out.ttft_s)
        tokens[name] = out.token_ids
    ratios.append(decode["panels"] / decode["rows"])
    same += tokens["panels"] == tokens["rows"]
    print(
        f"round {r} ({', '.join(order)}): rows {decode['rows']:.2f} tok/s, panels "
        f"{decode['panels']:.2f} tok/s, panels / rows {ratios[-1]:.3f}",
        flush=True,
    )
quartiles = statistics.quantiles(ratios, n=4)
print(
    f"{rounds} rounds: panels / rows median {statistics.median(ratios):.3f} (quartiles "
    f"{quartiles[0]:.3f}-{quartiles[2]:.3f}); same tokens in {same} of {rounds}"
)
