"""The int4 tile layout against the row layout, paired request by request in one process:
decoding with the tiles where `tuning.tune_layout` kept them (A) and with rows in every
layer (B), the layout switched between the two runs of each request (the decode stack
rebuilt, the kernel plans re-read), in ABBA order. Prints each pair's decode tokens/s, the
geometric mean of A / B and its 95% interval.

Why: the tiles make a verify pass of several rows cheaper but a one-row step dearer on a CPU
without VNNI, and a model runs one layout for every pass width (the two round differently,
and a row's result must not depend on how many rows share its pass).

    python scripts/bench_int4_layout.py --requests 36
    python scripts/bench_int4_layout.py --draft qwen2.5-coder-0.5b-instruct --speculate 3
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from specdec.bench.analysis import ratio_interval
from specdec.data import CODE_PROMPTS, sharegpt_prompts
from specdec.kernels import decode_stack, tuning
from specdec.kernels.quantize import with_decode_stack
from specdec.llm import LLM
from specdec.params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--speculate", default="0", help="K (with --draft)")
    ap.add_argument("--requests", type=int, default=36, help="half ShareGPT, half code")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the pairs as JSON here")
    args = ap.parse_args()
    llm = LLM(args.model, quant="int4", draft=args.draft, speculate=int(args.speculate))
    model = llm.model
    tiled = tuning._tiled_int4(model)
    tiles = [layer.tiles for layer in tiled]
    rows_only = torch.empty(0, dtype=torch.uint8)

    def lay(kind: str) -> None:
        for layer, t in zip(tiled, tiles, strict=True):
            layer.tiles = t if kind == "A" else rows_only
        with_decode_stack(model)
        tuning.tune_kernels(model)
        decode_stack.tune_stack(model)

    lay("B")  # the rows' plans and stack timed once where they are not yet
    half = args.requests // 2
    prompts = sharegpt_prompts(half, seed=1) + CODE_PROMPTS[: args.requests - half]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"{len(tiled)} layers hold tiles; {len(prompts)} requests", flush=True)

    def decode_rate(prompt: str) -> tuple[float, list[int]]:
        out = llm.generate([prompt], params, chat=True)[0]
        s = out.stats
        return (s.generated - 1) / (s.elapsed_s - s.ttft_s), out.token_ids

    pairs = []
    for i, prompt in enumerate(prompts):
        got = {}
        for kind in "AB" if i % 2 == 0 else "BA":
            lay(kind)
            got[kind] = decode_rate(prompt)
        (a, a_ids), (b, b_ids) = got["A"], got["B"]
        pairs.append({"a": a, "b": b, "same_tokens": a_ids == b_ids})
        print(f"{i:3d}  A {a:6.2f}  B {b:6.2f}  A/B {a / b:.3f}", flush=True)
    mean, low, high = ratio_interval([p["a"] / p["b"] for p in pairs])
    print(
        f"A/B {mean:.3f} (95% {low:.3f}-{high:.3f}) over {len(pairs)} pairs; median "
        f"A {statistics.median(p['a'] for p in pairs):.2f}, "
        f"B {statistics.median(p['b'] for p in pairs):.2f} tok/s; "
        f"same tokens in {sum(p['same_tokens'] for p in pairs)} of {len(pairs)}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "pairs": pairs}, f, indent=1)


if __name__ == "__main__":
    main()
