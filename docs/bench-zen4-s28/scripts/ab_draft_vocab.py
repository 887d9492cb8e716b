"""A/B of a draft model with its whole vocabulary head against the same draft cut to its N
most frequent ids (`--draft-vocab N`), on one loaded target, methods taking turns.

    python ab_draft_vocab.py --quant none --vocab 32768,65536 --k 4 --turns 3 \
        --workload code --max-tokens 128 --out ab.jsonl

Every method decodes the same prompts one at a time (batch 1, greedy); a turn runs every
method once over all prompts, each turn starting one method later. Writes one JSON line
per method and turn (tokens, seconds, acceptance, tokens per target pass) and prints
the medians and the per-turn ratios against the whole head.
"""

import argparse
import json
import statistics
import time

from specdec import LLM, SamplingParams
from specdec.acceptors import RejectionSampler
from specdec.bench.workloads import CODE_PROMPTS, sharegpt_prompts
from specdec.cost_model import AdaptiveWindow, FixedWindow
from specdec.drafters import DraftModelDrafter
from specdec.drafters.draft_vocab import frequent_ids, prune_vocab_head
from specdec.engine import Engine
from specdec.models.kernel_tuning import tune_kernels
from specdec.models.loading import load_transformer
from specdec.models.quant import quantize
from specdec.models.registry import gguf_source, resolve

p = argparse.ArgumentParser()
p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
p.add_argument("--quant", default="none")
p.add_argument("--vocab", default="32768")
p.add_argument("--k", default="4", help="a window, or auto")
p.add_argument("--turns", type=int, default=3)
p.add_argument("--workload", default="code", choices=["code", "sharegpt"])
p.add_argument("--prompts", type=int, default=4)
p.add_argument("--max-tokens", type=int, default=128)
p.add_argument("--out", default="ab_draft_vocab.jsonl")
args = p.parse_args()

llm = LLM(args.model, quant=args.quant, draft=args.draft, speculate=0)
tok, target = llm.tokenizer, llm.model
texts = CODE_PROMPTS[: args.prompts] if args.workload == "code" else sharegpt_prompts(args.prompts)
prompts = [llm.encode(t, chat=True) for t in texts]
usable = min(target.config.vocab_size, len(tok), llm.draft_model.config.vocab_size)


def window():
    return AdaptiveWindow(k_max=8) if args.k == "auto" else FixedWindow(int(args.k))


def engine(draft_model, ids):
    def factory(max_batch, max_len):
        vocab = target.config.vocab_size
        return DraftModelDrafter(draft_model, vocab, len(tok), max_batch, max_len, vocab=ids)

    return Engine(target, tok, llm.eos_ids, 1, factory, RejectionSampler(), window())


def cut_draft(n):
    model = load_transformer(resolve(args.draft), "bf16", target.device)
    model = quantize(model, "int4", gguf_source(args.draft), tiles=False)  # as LLM loads a draft
    ids = frequent_ids(tok, n, usable, keep=llm.eos_ids)
    tune_kernels(prune_vocab_head(model, ids))
    return model, ids


methods = {"plain": llm.plain_engine(), "whole": engine(llm.draft_model, None)}
for n in map(int, args.vocab.split(",")):
    methods[f"cut{n}"] = engine(*cut_draft(n))

params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
for eng in methods.values():  # warm-up: one short request each (and auto's first look)
    eng.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))
names = list(methods)
rows = []
with open(args.out, "a") as log:
    for turn in range(args.turns):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            start = time.perf_counter()
            outs = [methods[name].generate([pr], params)[0] for pr in prompts]
            seconds = time.perf_counter() - start
            tokens = sum(len(o.token_ids) for o in outs)
            drafted = sum(o.stats.drafted for o in outs)
            accepted = sum(o.stats.accepted for o in outs)
            steps = sum(o.stats.steps for o in outs)
            row = {
                "turn": turn, "method": name, "quant": args.quant, "k": args.k,
                "workload": args.workload, "tokens": tokens, "seconds": round(seconds, 3),
                "tok_s": round(tokens / seconds, 3),
                "acceptance": round(accepted / max(drafted, 1), 4),
                "tokens_per_pass": round(1 + accepted / max(steps, 1), 3),
            }  # fmt: skip
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)

whole = {r["turn"]: r["tok_s"] for r in rows if r["method"] == "whole"}
for name in names:
    mine = [r for r in rows if r["method"] == name]
    ratio = [r["tok_s"] / whole[r["turn"]] for r in mine]
    print(
        f"{name:10s} tok/s median {statistics.median(r['tok_s'] for r in mine):7.2f}  "
        f"acceptance {statistics.median(r['acceptance'] for r in mine):.3f}  "
        f"tokens/pass {statistics.median(r['tokens_per_pass'] for r in mine):.2f}  "
        f"vs whole per turn {', '.join(f'{x:.3f}' for x in ratio)}"
    )
