"""Plain greedy decoding: the native engine vs transformers `generate`, same process.

Both run the same converted checkpoint in the same dtype on the same prompt, alternating
native / transformers in each repeat so drift in machine load hits both alike. Reports
medians, the ratio, and how close each is to the memory-bandwidth bound (bytes of weights
read per token / measured read bandwidth).

    .venv/bin/python scripts/bench_plain.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import transformers

from specdec.bench.peers import hf_greedy
from specdec.engine import Engine
from specdec.host import read_bandwidth_gbs
from specdec.hub import resolve
from specdec.kernels.tuning import tune_kernels
from specdec.models.loading import load_transformer, torch_dtype
from specdec.params import SamplingParams
from specdec.tokenization import encode_prompt, eos_token_ids, load_tokenizer

PROMPT = "Write a Python function that merges two sorted lists into one sorted list."


def bytes_per_token(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: everything except the embedding table (one row
    of it is read), counting a tied lm_head once."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if "embed_tokens" in name and not getattr(model.config, "tie_word_embeddings", False):
            continue
        total += p.numel() * p.element_size()
    return total


def time_native(engine: Engine, prompt: list[int], n: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    out = engine.generate([prompt], params)[0]
    elapsed = time.perf_counter() - t0
    assert out.num_generated == n
    return elapsed


def time_hf(model, prompt: list[int], n: int) -> float:
    t0 = time.perf_counter()
    out = hf_greedy(model, prompt, n)
    elapsed = time.perf_counter() - t0
    assert len(out) == n
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve(args.model, args.dtype)
    tokenizer = load_tokenizer(path)
    prompt = encode_prompt(tokenizer, PROMPT, chat=True)
    native = load_transformer(path, args.dtype)
    tune_kernels(native)  # the kernels measured fastest on this machine (cached)
    engine = Engine(native, tokenizer, eos_token_ids(path, tokenizer), max_batch=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(args.dtype)
    ).eval()

    with torch.inference_mode():
        time_native(engine, prompt, 8)  # warm-up: kernels, allocator
        time_hf(hf, prompt, 8)
        native_s, hf_s = [], []
        for _ in range(args.repeats):
            native_s.append(time_native(engine, prompt, args.tokens))
            hf_s.append(time_hf(hf, prompt, args.tokens))

    bandwidth = read_bandwidth_gbs()
    weight_bytes = bytes_per_token(native)
    bound = bandwidth * 1e9 / weight_bytes
    native_tps = args.tokens / statistics.median(native_s)
    hf_tps = args.tokens / statistics.median(hf_s)
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "prompt_tokens": len(prompt),
        "new_tokens": args.tokens,
        "repeats": args.repeats,
        "native_tok_s": round(native_tps, 2),
        "transformers_tok_s": round(hf_tps, 2),
        "ratio_native_over_transformers": round(native_tps / hf_tps, 3),
        "native_runs_s": [round(t, 3) for t in native_s],
        "transformers_runs_s": [round(t, 3) for t in hf_s],
        "read_bandwidth_gb_s": round(bandwidth, 1),
        "weight_bytes_per_token": weight_bytes,
        "bandwidth_bound_tok_s": round(bound, 2),
        "native_fraction_of_bound": round(native_tps / bound, 3),
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
