"""The batch-1 base table, side by side in one process: specdec plain bf16, plain
int4 / int8 targets, speculative (draft model, `auto`) on bf16 and int4 targets, and
transformers `generate`, on the same code and ShareGPT chat prompts, greedy, same threads.
(llama.cpp is `specdec bench`'s llamacpp peer, with the `.[llamacpp]` extra.)

Methods take turns within each repeat (prompt by prompt), so drift in machine load hits
them alike; tokens/s are total generated tokens over total time per method and workload,
median over repeats. Also prints the read bandwidth and the bf16 bandwidth bound.

    .venv/bin/python scripts/bench_base.py --out bench-out/base.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from specdec.bench.costs import forward_seconds
from specdec.bench.peers import hf_greedy
from specdec.data import CODE_PROMPTS, sharegpt_prompts
from specdec.doctor import decode_bytes
from specdec.host import read_bandwidth_gbs
from specdec.hub import gguf_source, resolve
from specdec.kernels.tuning import machine
from specdec.llm import LLM
from specdec.models.config import ModelConfig
from specdec.params import SamplingParams
from specdec.tokenization import encode_prompt, load_tokenizer

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def llamacpp_runner(lookup: bool, tokens: int):
    """Greedy llama.cpp on the target's GGUF file (the file specdec converted), one prompt
    at a time: ids -> number of tokens generated (stops at end of text, like specdec)."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    llm = llama_cpp.Llama(
        model_path=str(gguf_source(TARGET)),
        n_ctx=4096,
        n_threads=torch.get_num_threads(),
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4) if lookup else None,
        verbose=False,
    )

    def run(ids):
        n = 0
        for token in llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
            n += 1
            if token == llm.token_eos() or n >= tokens:
                break
        return n

    return run


def eager(run, models):
    """`run` with the models' decode stacks detached: their layers op by op, as before the
    stack (`specdec.kernels.decode_stack`), for a side-by-side comparison in one process."""

    def run_eager(ids):
        stacks = [m.decode_stack for m in models]
        for m in models:
            m.decode_stack = None
        try:
            return run(ids)
        finally:
            for m, stack in zip(models, stacks, strict=True):
                m.decode_stack = stack

    return run_eager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4, help="per workload")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--methods",
        default="plain-bf16,plain-int4,spec-bf16,spec-int4,ngram-int4,hf,llamacpp,llamacpp-lookup",
        help="llamacpp*: llama.cpp on the target's GGUF file (the `.[llamacpp]` extra); "
        "-lookup: with its prompt-lookup speculation, 4 tokens; plain-int4-eager, "
        "spec-int4-eager: the int4 engines with their layers run op by op (no decode stack)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--curve-context", type=int, default=256, help="context of the v(k) passes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = args.methods.split(",")

    # One target per weight format: plain decoding is the speculative LLM's plain engine.
    engines, base, models = {}, None, {}
    wanted = {m.removesuffix("-eager") for m in methods}
    for quant in ("bf16", "int4", "int8"):
        if not {f"plain-{quant}", f"spec-{quant}"} & wanted:
            continue
        spec = f"spec-{quant}" in wanted
        llm = LLM(
            TARGET,
            quant="none" if quant == "bf16" else quant,
            draft=DRAFT if spec else None,
            speculate="auto" if spec else 0,
        )
        base = base or llm
        engines[f"plain-{quant}"] = llm.plain_engine() if spec else llm.engine
        if spec:
            engines[f"spec-{quant}"] = llm.engine
        models[quant] = [llm.engine.model] + ([llm.draft_model] if spec else [])

    # The verify-cost curve of each target format: v(k) = a pass of k + 1 tokens over a
    # one-token pass, at batch 1 after `--curve-context` tokens, logits at every position.
    def curve(model) -> dict:
        seconds = forward_seconds(model, 1, tuple(range(1, 10)), args.curve_context)
        return {
            "plain_step_ms": round(seconds[1] * 1e3, 2),
            "v": {k: round(seconds[k + 1] / seconds[1], 3) for k in range(9)},
        }

    curves = {}
    for name, engine in engines.items():
        if name.startswith("plain-"):
            curves[name[6:]] = curve(engine.model)
            print(name[6:], curves[name[6:]], flush=True)
            if f"{name}-eager" in methods:
                eager_curve = eager(lambda _, m=engine.model: curve(m), [engine.model])
                curves[f"{name[6:]}-eager"] = eager_curve(None)
                print(f"{name[6:]}-eager", curves[f"{name[6:]}-eager"], flush=True)
    runners = {}
    for name, engine in engines.items():
        run = lambda ids, engine=engine: (  # noqa: E731
            engine.generate([ids], SamplingParams(temperature=0, max_tokens=args.tokens))[
                0
            ].num_generated
        )
        if name in methods:
            runners[name] = run
        if f"{name}-eager" in methods:
            runners[f"{name}-eager"] = eager(run, models[name.split("-")[1]])
    if "ngram-int4" in methods:
        ngram = LLM(TARGET, quant="int4", draft="ngram", speculate="auto").engine
        runners["ngram-int4"] = lambda ids: (
            ngram.generate([ids], SamplingParams(temperature=0, max_tokens=args.tokens))[
                0
            ].num_generated
        )
    for name in ("llamacpp", "llamacpp-lookup"):
        if name in methods:
            runners[name] = llamacpp_runner(name.endswith("lookup"), args.tokens)
    if "hf" in methods:
        import transformers

        hf = transformers.AutoModelForCausalLM.from_pretrained(
            resolve(TARGET, "bf16"), dtype=torch.bfloat16
        ).eval()
        runners["hf"] = lambda ids: len(hf_greedy(hf, ids, args.tokens))
    # Without a specdec engine in the run (a peer alone, in its own process), the tokenizer.
    tokenizer = base.tokenizer if base else load_tokenizer(resolve(TARGET, "bf16"))

    def encode(prompt: str, chat: bool) -> list[int]:
        return encode_prompt(tokenizer, prompt, chat)

    workloads = {
        "code": [encode(p, chat=True) for p in CODE_PROMPTS[: args.prompts]],
        "chat": [encode(p, chat=True) for p in sharegpt_prompts(args.prompts, seed=1)],
    }
    with torch.inference_mode():
        for run in runners.values():  # warm-up
            run(workloads["code"][0][:32])
        results = {w: {m: [] for m in runners} for w in workloads}
        for repeat in range(args.repeats):
            for w, prompts in workloads.items():
                spent = {m: [0.0, 0] for m in runners}
                for ids in prompts:
                    for m, run in runners.items():
                        t0 = time.perf_counter()
                        n = run(ids)
                        spent[m][0] += time.perf_counter() - t0
                        spent[m][1] += n
                for m, (seconds, n) in spent.items():
                    results[w][m].append(n / seconds)
                print(repeat, w, {m: round(v[-1], 2) for m, v in results[w].items()}, flush=True)

    bandwidth = read_bandwidth_gbs()
    bound = bandwidth * 1e9 / decode_bytes(ModelConfig.from_dir(resolve(TARGET, "bf16")))
    table = {
        w: {m: round(statistics.median(v), 2) for m, v in r.items()} for w, r in results.items()
    }
    report = {
        "machine": machine(),
        "processor": platform.processor(),
        "read_bandwidth_gb_s": round(bandwidth, 1),
        "bf16_bound_tok_s": round(bound, 2),
        "threads": torch.get_num_threads(),
        "tokens": args.tokens,
        "prompts_per_workload": args.prompts,
        "repeats": args.repeats,
        "tok_s": table,
        "verify_curves": curves,
        "runs": results,
    }
    print(
        json.dumps(
            {
                k: report[k]
                for k in ("read_bandwidth_gb_s", "bf16_bound_tok_s", "tok_s", "verify_curves")
            },
            indent=1,
        )
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
