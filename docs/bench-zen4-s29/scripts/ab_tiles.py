"""A/B of the int4 target's weights in the native kernel's tile layout against the row
layout, on one process: plain decoding and speculation at a fixed window, methods taking
turns.

    python ab_tiles.py --k 3 --turns 3 --workload sharegpt --max-tokens 64 --out ab.jsonl

Both targets hold the same 4-bit blocks (the Q4_K_M file's); the draft is the same int4
0.5B (row layout) for both. Every method decodes the same prompts one at a time (batch 1,
greedy); a turn runs every method once over all prompts, each turn starting one method
later. Writes one JSON line per method and turn and prints medians and per-turn ratios.
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
from specdec.engine import Engine
from specdec.models.kernel_tuning import tune_kernels
from specdec.models.loading import load_transformer
from specdec.models.quant import quantize
from specdec.models.registry import gguf_source, resolve

p = argparse.ArgumentParser()
p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
p.add_argument("--k", default="3", help="a window, or auto")
p.add_argument("--turns", type=int, default=3)
p.add_argument("--workload", default="sharegpt", choices=["code", "sharegpt"])
p.add_argument("--prompts", type=int, default=4)
p.add_argument("--max-tokens", type=int, default=64)
p.add_argument("--out", default="ab_tiles.jsonl")
args = p.parse_args()

llm = LLM(args.model, quant="int4", draft=args.draft, speculate=0)  # target in tiles
tok, draft = llm.tokenizer, llm.draft_model
rows_target = quantize(
    load_transformer(resolve(args.model), "bf16", llm.model.device), "int4",
    gguf_source(args.model), tiles=False,
)  # fmt: skip
tune_kernels(rows_target)
texts = CODE_PROMPTS[: args.prompts] if args.workload == "code" else sharegpt_prompts(args.prompts)
prompts = [llm.encode(t, chat=True) for t in texts]


def engine(target, k):
    window = AdaptiveWindow(k_max=8) if k == "auto" else FixedWindow(int(k))

    def factory(max_batch, max_len):
        vocab = target.config.vocab_size
        return DraftModelDrafter(draft, vocab, len(tok), max_batch, max_len)

    return Engine(target, tok, llm.eos_ids, 1, factory if k != "0" else None,
                  RejectionSampler(), window)  # fmt: skip


methods = {
    "plain-tiles": engine(llm.model, "0"), "plain-rows": engine(rows_target, "0"),
    "spec-tiles": engine(llm.model, args.k), "spec-rows": engine(rows_target, args.k),
}  # fmt: skip
params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
for eng in methods.values():  # warm-up: one short request each
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
                "turn": turn, "method": name, "k": args.k, "workload": args.workload,
                "tokens": tokens, "seconds": round(seconds, 3),
                "tok_s": round(tokens / seconds, 3),
                "acceptance": round(accepted / max(drafted, 1), 4),
                "tokens_per_pass": round(1 + accepted / max(steps, 1), 3),
                "ids": [o.token_ids for o in outs],
            }  # fmt: skip
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "ids"}), flush=True)

for name in names:
    mine = [r for r in rows if r["method"] == name]
    other = name.replace("tiles", "rows") if "tiles" in name else name.replace("rows", "tiles")
    base = {r["turn"]: r["tok_s"] for r in rows if r["method"] == other}
    ratio = [r["tok_s"] / base[r["turn"]] for r in mine]
    print(
        f"{name:12s} tok/s median {statistics.median(r['tok_s'] for r in mine):7.2f}  "
        f"tokens/pass {statistics.median(r['tokens_per_pass'] for r in mine):.2f}  "
        f"vs {other} per turn {', '.join(f'{x:.3f}' for x in ratio)}"
    )
same = [
    a["ids"] == b["ids"]
    for a in rows if a["method"] == "plain-tiles"
    for b in rows if b["method"] == "spec-tiles" and b["turn"] == a["turn"]
]  # fmt: skip
print("spec-tiles output == plain-tiles output per turn:", same)
