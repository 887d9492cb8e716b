"""The engine's greedy verdict on logits against the acceptor on one-hot p, in one process,
taking turns: plain decoding and k = 4 (bf16 1.5B, int4 0.5B draft), decode tok/s of two
code prompts, 128 tokens. Off = `engine._ARGMAX_WHEN_GREEDY` emptied, so every pass builds
p and calls the rejection sampler, as before commit 825569d (the draft's argmax stays).

    python docs/bench-zen3-s49/scripts/verdict_ab.py [TURNS]
"""

import statistics
import sys
import time

import torch

import specdec.engine as engine_module
from specdec import LLM, SamplingParams
from specdec.bench import workloads

torch.set_num_threads(2)
turns = int(sys.argv[1]) if len(sys.argv) > 1 else 3
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    draft_quant="int4",
    speculate=4,
)
params = SamplingParams(max_tokens=128, temperature=0.0)
llm.generate(workloads.CODE_PROMPTS[3], SamplingParams(max_tokens=8, temperature=0.0), chat=True)
fast = engine_module._ARGMAX_WHEN_GREEDY


def decode_tok_s(k: int) -> tuple[float, list[list[int]]]:
    llm.engine.window.k_max = k
    tokens = seconds = 0.0
    outputs = []
    for prompt in workloads.CODE_PROMPTS[:2]:
        start = time.perf_counter()
        out = llm.generate(prompt, params, chat=True)[0]
        tokens += len(out.token_ids) - 1
        seconds += time.perf_counter() - start - out.ttft_s
        outputs.append(out.token_ids)
    return tokens / seconds, outputs


results: dict[tuple[str, int], list[float]] = {}
reference: dict[int, list[list[int]]] = {}
for turn in range(turns):
    for on in (True, False) if turn % 2 == 0 else (False, True):
        engine_module._ARGMAX_WHEN_GREEDY = fast if on else ()
        for k in (0, 4):
            rate, outputs = decode_tok_s(k)
            assert reference.setdefault(k, outputs) == outputs, "outputs differ"
            results.setdefault(("on" if on else "off", k), []).append(rate)
            print(turn, "on" if on else "off", k, f"{rate:.2f} tok/s", flush=True)
for k in (0, 4):
    on, off = results["on", k], results["off", k]
    ratios = ", ".join(f"{a / b:.3f}" for a, b in zip(on, off, strict=True))
    print(
        f"k = {k}: on {statistics.median(on):.2f} tok/s, off {statistics.median(off):.2f}; "
        f"on / off per turn {ratios}"
    )
