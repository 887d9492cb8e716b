"""Greedy output on a real pair, checked token for token: speculative against plain for each
prompt alone, and N concurrent streams (plain and speculative) against each prompt alone.

What "the same tokens whatever the batch" asks of bf16 on a CPU
(`specdec.kernels.invariance`); `SPECDEC_BF16_INVARIANT=0` runs the tuned kernels of before
for the comparison. Prompts: the bench's code prompts, then held-out-style ones written for
this check (never tuned on). Streams cycle through the prompts when there are more of them.

    flock /tmp/specdec-real.lock python scripts/check_bf16_invariance.py --prompts 8 --streams 16
    python scripts/check_bf16_invariance.py --model smollm2-135m-instruct --draft ngram
"""

from __future__ import annotations

import argparse
import time

HELD_OUT = [
    "Write a Python function that rotates a matrix 90 degrees clockwise in place.",
    "Write a Go function that reverses a linked list.",
    "Write a Rust function that returns the longest common prefix of a slice of strings.",
    "Write a Python generator that yields prime numbers indefinitely.",
    "Write a bash script that renames every .txt file in a folder to .md.",
    "Write a Python function that validates an IPv4 address string.",
    "Write a C function that counts the set bits in a 32-bit integer.",
    "Write a Python function that groups anagrams from a list of words.",
    "Write a TypeScript interface and a function that sorts users by age.",
    "Write a Python function that computes the edit distance between two strings.",
    "Write a Python context manager that times the code inside it.",
    "Write a Java method that checks whether parentheses in a string are balanced.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Python function that finds all permutations of a list without itertools.",
    "Write a SQL query that lists departments with more than ten employees.",
    "Write a Python function that serializes a binary tree to a string and back.",
    "Write a Python function that returns the k most frequent elements of a list.",
    "Write a JavaScript function that deep-clones a plain object.",
    "Write a Python function that checks whether a Sudoku board is valid.",
    "Write a Python function that computes the moving average of a list with a window.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--speculate", default="auto")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--prompts", type=int, default=8, help="prompts checked alone")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (0: none)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    from specdec import LLM, SamplingParams
    from specdec.data import CODE_PROMPTS

    prompts = (CODE_PROMPTS + HELD_OUT)[: args.prompts]
    start = time.time()
    llm = LLM(
        args.model,
        draft=args.draft,
        speculate=args.speculate,
        dtype=args.dtype,
        max_batch=max(args.streams, 1),
    )
    print(f"loaded in {time.time() - start:.0f} s", flush=True)
    plain = llm.plain_engine()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    ids = [llm.encode(p, chat=True) for p in prompts]
    alone, same = [], 0
    for i, p in enumerate(ids):
        alone.append(plain.generate([p], params)[0].token_ids)
        equal = llm.engine.generate([p], params)[0].token_ids == alone[-1]
        same += equal
        print(f"prompt {i}: speculative == plain: {equal}", flush=True)
    print(f"speculative == plain, each prompt alone: {same}/{len(ids)}", flush=True)
    if not args.streams:
        return
    batch = [ids[i % len(ids)] for i in range(args.streams)]
    for name, engine in (("plain", plain), (args.speculate, llm.engine)):
        start = time.time()
        out = engine.generate(batch, params)
        equal = sum(c.token_ids == alone[i % len(ids)] for i, c in enumerate(out))
        took = time.time() - start
        print(
            f"{name}, {args.streams} concurrent streams == alone: {equal}/{args.streams}"
            f" ({took:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
