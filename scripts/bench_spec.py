"""Batch-1 speculative decoding on the default pair: every method, one process, one run.

Methods, on code prompts and on ShareGPT chat prompts (greedy, chat template):
plain decoding; speculative with the draft model (int4 weights, the CPU default) at fixed
k (a sweep, best reported) and `auto`, and `auto` with the draft in bf16; n-gram prompt
lookup (`auto`); transformers `generate` and its assisted generation with the same draft
model (bf16). For each fixed k it also prints the speedup DESIGN.md's formula
predicts from the measured acceptance a, draft cost c and verify cost v(k):
S = (1 - a^(k+1)) / ((1 - a) (k c + v(k))).

    .venv/bin/python scripts/bench_spec.py --out bench-out/spec.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import transformers

from specdec.acceptors import RejectionSampler
from specdec.bench.peers import hf_greedy
from specdec.bench.workloads import CODE_PROMPTS, sharegpt_prompts
from specdec.config import SamplingParams
from specdec.cost_model import AdaptiveWindow, FixedWindow
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import Engine
from specdec.metrics import SpecStats
from specdec.models.loading import load_transformer, torch_dtype
from specdec.models.quant import quantize_int4
from specdec.models.registry import resolve
from specdec.tokenization import encode_prompt, eos_token_ids, load_tokenizer


def forward_seconds(model, tokens_per_row: int, context: int = 200, repeats: int = 5) -> float:
    """Median seconds of one batch-1 pass of `tokens_per_row` tokens after `context`
    (after two unmeasured passes: the first calls of a shape are slower)."""
    cache = model.new_cache(1, context + tokens_per_row + 1)
    with torch.inference_mode():
        model(torch.randint(0, 1000, (1, context)), cache)
        times = []
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            model(torch.randint(0, 1000, (1, tokens_per_row)), cache)
            if i >= 2:
                times.append(time.perf_counter() - t0)
            cache.truncate(torch.tensor([context]))
    return statistics.median(times)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def predicted_speedup(a: float, k: int, c: float, v: float) -> float:
    if a >= 1:
        return (k + 1) / (k * c + v)
    return (1 - a ** (k + 1)) / ((1 - a) * (k * c + v))


def run_engine(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """All prompts, `engine.max_batch` at a time; tokens/s over the wall time."""
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    stats = sum((o.stats for o in outs), SpecStats())
    tokens = sum(o.num_generated for o in outs)
    return {
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tok_s": round(tokens / wall, 3),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_accepted_length": round(stats.mean_accepted_length, 4),
        "acceptance_per_position": [round(x, 3) for x in stats.acceptance_per_position],
        "token_ids": [o.token_ids for o in outs],
    }


def run_hf(model, prompts, max_tokens: int, eos: list[int], assistant=None) -> dict:
    t0 = time.perf_counter()
    token_ids = []
    for p in prompts:
        token_ids.append(hf_greedy(model, p, max_tokens, eos, assistant))
    wall = time.perf_counter() - t0
    tokens = sum(len(t) for t in token_ids)
    return {
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tok_s": round(tokens / wall, 3),
        "token_ids": token_ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ks", default="3,5,8", help="fixed windows to sweep")
    parser.add_argument("--sets", default="code,chat")
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--out", default="bench-out/spec.json")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]

    target_path, draft_path = resolve(args.target, args.dtype), resolve(args.draft, args.dtype)
    tok = load_tokenizer(target_path)
    target = load_transformer(target_path, args.dtype)
    draft_bf16 = load_transformer(draft_path, args.dtype)
    draft = quantize_int4(load_transformer(draft_path, args.dtype))  # the CPU default
    eos = eos_token_ids(target_path, tok)
    vocab, tok_size = target.config.vocab_size, len(tok)

    def draft_factory(b, n):
        return DraftModelDrafter(draft, vocab, tok_size, b, n)

    def draft_bf16_factory(b, n):
        return DraftModelDrafter(draft_bf16, vocab, tok_size, b, n)

    def engine(factory=None, window=None) -> Engine:
        window = window or FixedWindow(0)
        return Engine(target, tok, eos, args.batch, factory, RejectionSampler(), window)

    costs = {
        "target_step_s": forward_seconds(target, 1),
        "draft_step_s": forward_seconds(draft, 1),
        "draft_bf16_step_s": forward_seconds(draft_bf16, 1),
    }
    costs["c"] = costs["draft_step_s"] / costs["target_step_s"]
    costs["c_bf16"] = costs["draft_bf16_step_s"] / costs["target_step_s"]
    costs["v"] = {k: forward_seconds(target, k + 1) / costs["target_step_s"] for k in range(17)}
    print(
        json.dumps(
            {
                "c": round(costs["c"], 3),
                "c_bf16": round(costs["c_bf16"], 3),
                "v": {k: round(v, 3) for k, v in costs["v"].items()},
            }
        ),
        flush=True,
    )

    hf_target = hf_draft = None
    if not args.skip_hf and args.batch == 1:
        dtype = torch_dtype(args.dtype)
        hf_target = transformers.AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype)
        hf_draft = transformers.AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype)

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    prompt_sets = {
        "code": CODE_PROMPTS[: args.prompts],
        "chat": sharegpt_prompts(args.prompts, seed=0),
    }
    results = {"costs": costs, "sets": {}}
    for set_name in args.sets.split(","):
        prompts = [encode_prompt(tok, p, chat=True) for p in prompt_sets[set_name]]
        engine(draft_factory, FixedWindow(2)).generate(prompts[:1], params)  # warm-up
        rows = {"plain": run_engine(engine(), prompts, params)}
        for k in ks:
            rows[f"draft k={k}"] = run_engine(
                engine(draft_factory, FixedWindow(k)), prompts, params
            )
        rows["draft auto"] = run_engine(
            engine(draft_factory, AdaptiveWindow(k_max=max(ks))), prompts, params
        )
        rows["draft-bf16 auto"] = run_engine(
            engine(draft_bf16_factory, AdaptiveWindow(k_max=max(ks))), prompts, params
        )
        rows["ngram auto"] = run_engine(
            engine(lambda b, n: NgramDrafter(), AdaptiveWindow(k_max=max(ks))), prompts, params
        )
        if hf_target is not None:
            eos_list = sorted(eos)
            rows["transformers generate"] = run_hf(hf_target, prompts, args.max_tokens, eos_list)
            rows["transformers assisted"] = run_hf(
                hf_target, prompts, args.max_tokens, eos_list, assistant=hf_draft
            )
        plain = rows["plain"]
        plain_ids = plain["token_ids"]
        for name, row in rows.items():
            row["speedup"] = round(row["tok_s"] / plain["tok_s"], 3)
            ids = row.pop("token_ids")
            row["same_output_as_plain"] = ids == plain_ids
            # Where a greedy output first departs from plain (bf16 kernels of different
            # shapes round differently, so near-ties can flip): None = identical.
            pairs = zip(ids, plain_ids, strict=True)
            row["first_divergence"] = [_first_difference(a, b) for a, b in pairs]
            if name.startswith("draft k="):
                k = int(name.split("=")[1])
                cost = k * costs["c"] + costs["v"][k]
                row["predicted_speedup"] = round(
                    predicted_speedup(row["acceptance_rate"], k, costs["c"], costs["v"][k]), 3
                )
                # The same costs with the measured tokens per pass instead of i.i.d. a:
                row["predicted_from_tokens_per_pass"] = round(row["mean_accepted_length"] / cost, 3)
        results["sets"][set_name] = rows
        fixed = {n: r for n, r in rows.items() if n.startswith("draft k=")}
        best = max(fixed, key=lambda n: fixed[n]["tok_s"])
        print(
            f"\n## {set_name} ({len(prompts)} prompts, batch {args.batch}, "
            f"{args.max_tokens} max tokens, greedy)"
        )
        print(
            "| method | tok/s | speedup | predicted (iid a) | predicted (tokens/pass) "
            "| acceptance | tokens/pass | same output |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, r in rows.items():
            mark = " (best k)" if name == best else ""
            print(
                f"| {name}{mark} | {r['tok_s']:.2f} | {r['speedup']:.2f}x | "
                f"{r.get('predicted_speedup', '')} | "
                f"{r.get('predicted_from_tokens_per_pass', '')} | {r.get('acceptance_rate', '')} | "
                f"{r.get('mean_accepted_length', '')} | {r['same_output_as_plain']} |",
                flush=True,
            )
    results["machine"] = (
        f"{platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {args.dtype}"
    )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
