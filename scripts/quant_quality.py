"""How far the int4 target is from bf16, next to llama.cpp on the same GGUF file.

Two measures, each for specdec bf16, specdec int4 and llama.cpp (Q4_K_M file as it is):
- perplexity on a fixed text: the assistant turns of the last ShareGPT conversations in the
  package's file (not among the benchmark prompts, which come from its first turns), cut
  into `--windows` windows of `--window` tokens, each scored from an empty context;
- teacher-forced greedy agreement on the held-out-style prompts (the code prompts and
  ShareGPT chats of `bench_base.py`): along bf16's greedy continuation, the share of
  positions where the model's own greedy token is the same.

specdec runs the text in passes of `--chunk` tokens (the regime of decode and verify steps,
so int4 runs its packed kernel); llama.cpp evaluates in batches of 512.

    .venv/bin/python scripts/quant_quality.py --out bench-out/quant-quality.json
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from specdec.data import CODE_PROMPTS, sharegpt_conversations, sharegpt_prompts
from specdec.hub import gguf_source
from specdec.kernels.tuning import machine
from specdec.llm import LLM
from specdec.params import SamplingParams

TARGET = "qwen2.5-coder-1.5b-instruct"


def fixed_text(conversations: int = 60) -> str:
    """The assistant turns of the file's last conversations, joined."""
    turns = []
    for conv in sharegpt_conversations()[-conversations:]:
        turns += [t["value"] for t in conv.get("conversations", []) if t.get("from") == "gpt"]
    return "\n\n".join(turns)


def specdec_scores(model, ids: list[int], chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(negative log-likelihood of ids[1:], greedy token at each position of ids[:-1])."""
    cache = model.new_cache(1, len(ids) + chunk)
    nll, greedy = [], []
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, chunk):
            piece = ids[start : min(start + chunk, len(ids) - 1)]
            logits = model(torch.tensor([piece]), cache).logits[0].float()  # [c, V]
            target = torch.tensor(ids[start + 1 : start + 1 + len(piece)])
            nll.append(-torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0])
            greedy.append(logits.argmax(-1))
    return torch.cat(nll).numpy(), torch.cat(greedy).numpy()


def llamacpp_scores(llm, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    llm.reset()
    llm.eval(ids[:-1])
    logits = torch.from_numpy(np.array(llm.scores[: len(ids) - 1], dtype=np.float32))
    target = torch.tensor(ids[1:])
    nll = -torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
    return nll.numpy(), logits.argmax(-1).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="per workload")
    ap.add_argument("--tokens", type=int, default=64, help="greedy continuation per prompt")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    bf16 = LLM(TARGET)
    int4 = LLM(TARGET, quant="int4")
    import llama_cpp

    cpp = llama_cpp.Llama(
        model_path=str(gguf_source(TARGET)),
        n_ctx=max(args.window, 2048) + 16,
        n_threads=torch.get_num_threads(),
        logits_all=True,
        verbose=False,
    )
    scorers = {
        "specdec-bf16": lambda ids: specdec_scores(bf16.model, ids, args.chunk),
        "specdec-int4": lambda ids: specdec_scores(int4.model, ids, args.chunk),
        "llama.cpp-Q4_K_M": lambda ids: llamacpp_scores(cpp, ids),
    }

    tokens = bf16.tokenizer(fixed_text())["input_ids"]
    windows = [
        tokens[i * args.window : (i + 1) * args.window]
        for i in range(args.windows)
        if (i + 1) * args.window <= len(tokens)
    ]
    perplexity = {}
    for name, score in scorers.items():
        nll = np.concatenate([score(w)[0] for w in windows])
        perplexity[name] = round(math.exp(float(nll.mean())), 4)
        print("perplexity", name, perplexity[name], flush=True)

    prompts = CODE_PROMPTS[: args.prompts] + sharegpt_prompts(args.prompts, seed=1)
    agreement = {name: [] for name in scorers if name != "specdec-bf16"}
    for prompt in prompts:
        ids = bf16.encode(prompt, chat=True)
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        reference = bf16.engine.generate([ids], params)[0].token_ids
        sequence = ids + list(reference)
        for name in agreement:
            greedy = scorers[name](sequence)[1][len(ids) - 1 :]
            agreement[name].append(float(np.mean(greedy == np.array(reference))))
    agreement = {name: round(float(np.mean(v)), 4) for name, v in agreement.items()}
    print("greedy agreement with bf16", agreement, flush=True)

    report = {
        "machine": machine(),
        "text_tokens": sum(len(w) for w in windows),
        "window": args.window,
        "chunk": args.chunk,
        "perplexity": perplexity,
        "greedy_agreement_with_bf16": agreement,
        "int4_layers": int4.model.quant_report.summary(),
        "prompts": len(prompts),
        "tokens_per_prompt": args.tokens,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
