"""Plain bf16 decoding against the memory-bandwidth bound read beside it, and against
transformers `generate`, in paired turns of one process.

The two questions the results table's transformers column and "% of the bound" answer: how
close plain decoding comes to the weight bytes a step must stream, and how it compares with
transformers on the same prompt and threads. Each turn reads the bandwidth
(`host.read_bandwidth_gbs`: 1 GiB, best of 3), runs specdec plain and transformers greedy
on the same prompt in alternating order, and reads the bandwidth again; the turn's bound is
the mean of its two reads over the bytes one step streams (`doctor.decode_bytes`). Rates are
the decode phase's: tokens after the first over the time after the first token
(transformers': end to end less a 1-token `generate` of the same prompt, its prefill).

    python scripts/bench_bound.py --turns 6 --max-tokens 128
    python scripts/bench_bound.py --model smollm2-135m-instruct --turns 4

Results: docs/results/xeon-amx/2026-11-28-bound-paired.log (docs/benchmarks.md, AMX).
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPTS = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Explain what a hash map is and write a small one in Python.",
    "Write a C function that reverses a singly linked list in place.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a registry model")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import torch
    import transformers

    from specdec import LLM, SamplingParams
    from specdec.bench.peers import hf_greedy
    from specdec.doctor import decode_bytes
    from specdec.host import read_bandwidth_gbs
    from specdec.hub import cache_root
    from specdec.models.config import ModelConfig

    torch.set_num_threads(args.threads)
    directory = cache_root() / "models" / args.model / "bf16"
    step_bytes = decode_bytes(ModelConfig.from_dir(directory))
    llm = LLM(args.model)  # plain, bf16
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    hf.eval()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    def ours(prompt: str) -> tuple[float, list[int]]:
        c = llm.generate([prompt], params)[0]
        return (c.num_generated - 1) / (c.elapsed_s - c.ttft_s), c.token_ids

    def theirs(ids: list[int]) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        hf_greedy(hf, ids, 1)
        t1 = time.perf_counter()
        out = hf_greedy(hf, ids, args.max_tokens)
        t2 = time.perf_counter()
        return (len(out) - 1) / ((t2 - t1) - (t1 - t0)), out

    ours(PROMPTS[0])  # warm both
    theirs(llm.encode(PROMPTS[0], False))
    print(
        f"{args.model}: bytes a step {step_bytes / 1e9:.3f} GB; "
        f"{args.turns} turns x {args.max_tokens} tokens",
        flush=True,
    )
    rows = []
    for turn in range(args.turns):
        prompt = PROMPTS[turn % len(PROMPTS)]
        ids = llm.encode(prompt, False)
        before = read_bandwidth_gbs(1.0, 3)
        if turn % 2 == 0:  # alternate the order, so neither is always second
            ours_rate, ours_ids = ours(prompt)
            hf_rate, hf_ids = theirs(ids)
        else:
            hf_rate, hf_ids = theirs(ids)
            ours_rate, ours_ids = ours(prompt)
        after = read_bandwidth_gbs(1.0, 3)
        bound = (before + after) / 2 * 1e9 / step_bytes
        same = sum(a == b for a, b in zip(ours_ids, hf_ids, strict=False)) / len(ours_ids)
        rows.append((ours_rate / bound, ours_rate / hf_rate))
        print(
            f"turn {turn}: read {before:.1f}/{after:.1f} GB/s, bound {bound:.2f} tok/s; "
            f"specdec {ours_rate:.2f} tok/s ({ours_rate / bound:.0%} of bound), "
            f"transformers {hf_rate:.2f} ({ours_rate / hf_rate:.2f}x); same tokens {same:.2f}",
            flush=True,
        )
    print(
        f"median: {statistics.median(r[0] for r in rows):.0%} of the bound, "
        f"{statistics.median(r[1] for r in rows):.2f}x transformers"
    )


if __name__ == "__main__":
    main()
