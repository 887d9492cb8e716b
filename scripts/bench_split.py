"""Prefill and decode timed apart, for specdec's int4 target or llama.cpp on the same GGUF
file: one engine per process (run it once per engine, alternating), greedy, 64 new tokens
without stopping at end of text, on 2 code prompts and 2 ShareGPT chats (`bench_base.py`'s).

    .venv/bin/python scripts/bench_split.py specdec-int4
    .venv/bin/python scripts/bench_split.py llamacpp
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.data import CODE_PROMPTS, sharegpt_prompts
from specdec.hub import gguf_source, resolve
from specdec.tokenization import encode_prompt, load_tokenizer

TARGET = "qwen2.5-coder-1.5b-instruct"


def llamacpp(tokens: int):
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf_source(TARGET)),
        n_ctx=4096,
        n_threads=torch.get_num_threads(),
        verbose=False,
    )

    def run(ids):  # -> (prefill s, decode s, tokens)
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        prefilled, n = time.perf_counter(), 0
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):  # reuses the evaluated prompt
            n += 1
            if n >= tokens:
                break
        return prefilled - start, time.perf_counter() - prefilled, n

    return run


def specdec_int4(tokens: int):
    from specdec.llm import LLM
    from specdec.params import SamplingParams

    llm = LLM(TARGET, quant="int4")
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)

    def run(ids):
        start = time.perf_counter()
        out = llm.engine.generate([ids], params)[0]
        total = time.perf_counter() - start
        return out.stats.ttft_s, total - out.stats.ttft_s, out.num_generated

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("engine", choices=["specdec-int4", "llamacpp"])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    tokenizer = load_tokenizer(resolve(TARGET))
    prompts = CODE_PROMPTS[:2] + sharegpt_prompts(2, seed=1)
    ids = [encode_prompt(tokenizer, p, chat=True) for p in prompts]
    run = (llamacpp if args.engine == "llamacpp" else specdec_int4)(args.tokens)
    run(ids[0][:16])  # warm-up
    for prompt in ids:
        prefill, decode, n = run(prompt)
        print(
            f"{args.engine}: prompt {len(prompt)} tokens, prefill {prefill:.2f} s "
            f"({len(prompt) / prefill:.0f} tok/s), decode {n} tokens in {decode:.2f} s "
            f"({(n - 1) / decode:.1f} tok/s after the first)",
            flush=True,
        )


if __name__ == "__main__":
    main()
