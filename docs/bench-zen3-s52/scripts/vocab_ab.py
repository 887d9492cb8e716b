"""The draft's head whole, cut, and cut + widened by the context, taking turns in one
process: bf16 1.5B target, int4 0.5B draft, k = 4, the bench's four code prompts (chat
template), 128 tokens, greedy; a plain turn in every round.

    python docs/bench-zen3-s52/scripts/vocab_ab.py [ROUNDS] [default|cuts]

`default`: plain, the whole head, the default cut (the lowest 65,536 ids + the context)
and ShareGPT's 32,768 + the context. `cuts` (the first run, before the default existed
and with the speculative engines' prefix cache off by mistake, so that its end-to-end
column compares them without one against plain with one): ShareGPT's 65,536 and 32,768
ids, with and without the context.

Per round and method: decode tok/s over the four prompts (wall time minus each TTFT),
end-to-end tok/s, tokens per step, drafts kept; then the medians over rounds of each
method's per-round ratio to that round's plain turn.
"""

import statistics
import sys
import time

import torch

from specdec import LLM, SamplingParams
from specdec.acceptors import GreedyAcceptor
from specdec.bench import workloads
from specdec.cost_model import FixedWindow
from specdec.engine import Engine

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
DRAFT = "qwen2.5-coder-0.5b-instruct"
llm = LLM("qwen2.5-coder-1.5b-instruct", draft=DRAFT, draft_quant="int4", speculate=4)


def engine(cut: int | None, widen: bool = True) -> Engine:
    """An engine over the same target with its own draft model (the LLM's factory reads
    `llm.draft_model` when the engine first sizes its drafter: set it back each time)."""
    llm.draft_vocab = cut
    inner, model = llm._drafter_factory(DRAFT, "bf16", "cpu", "int4"), llm.draft_model

    def factory(b, n):
        llm.draft_model = model
        drafter = inner(b, n)
        if not widen:
            drafter.context = None
        return drafter

    return Engine(
        llm.model,
        llm.tokenizer,
        llm.eos_ids,
        8,
        factory,
        GreedyAcceptor(),
        FixedWindow(4),
        prefix_cache_tokens=llm.prefix_cache_tokens,  # as the plain engine's
    )


MODE = sys.argv[2] if len(sys.argv) > 2 else "default"
if MODE == "cuts":  # the first run: ShareGPT's ids, with and without the context
    methods = {
        "plain": llm.plain_engine(),
        "whole": engine(0),
        "65536+ctx": engine(65536),
        "32768": engine(32768, widen=False),
        "32768+ctx": engine(32768),
    }
else:  # the default (the lowest 65,536 ids + the context) against the whole head
    methods = {
        "plain": llm.plain_engine(),
        "whole": engine(0),
        "default": engine(None),
        "32768+ctx": engine(32768),
    }
params = SamplingParams(max_tokens=128, temperature=0.0)
prompts = [llm.encode(p, chat=True) for p in workloads.CODE_PROMPTS[:4]]
for e in methods.values():  # warm: kernels, buffers
    e.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))
reference = None
rows = {m: [] for m in methods}
for r in range(rounds):
    for name, e in methods.items():
        tokens = decode_s = wall = steps = drafted = kept = ttft = 0
        outs = []
        for ids in prompts:
            start = time.perf_counter()
            out = e.generate([ids], params)[0]
            elapsed = time.perf_counter() - start
            outs.append(out.token_ids)
            tokens += len(out.token_ids)
            wall += elapsed
            decode_s += elapsed - out.ttft_s
            ttft += out.ttft_s
            steps += out.stats.steps
            drafted += out.stats.drafted
            kept += out.stats.accepted
        if reference is None:
            reference = outs
        differ = [i for i, (a, b) in enumerate(zip(outs, reference, strict=False)) if a != b]
        if differ:  # greedy verification keeps plain's tokens: report where it did not
            first = [
                next(
                    j for j, (x, y) in enumerate(zip(outs[i], reference[i], strict=False)) if x != y
                )  # noqa: E501
                for i in differ
            ]
            print(f"round {r} {name}: prompts {differ} differ from plain at token {first}")
        row = {
            "decode": (tokens - len(prompts)) / decode_s,
            "e2e": tokens / wall,
            "per_step": (tokens - len(prompts)) / max(steps, 1),
            "kept": kept / max(drafted, 1),
            "ttft": ttft / len(prompts),
        }
        rows[name].append(row)
        print(
            f"round {r} {name:>10}: decode {row['decode']:.2f} tok/s, end to end {row['e2e']:.2f}, "
            f"{row['per_step']:.2f} tok/step, kept {row['kept']:.3f}, TTFT {row['ttft']:.3f} s",
            flush=True,
        )
print("medians over rounds of the per-round ratio to plain (decode / end to end):")
for name in methods:
    if name == "plain":
        continue
    pairs = list(zip(rows[name], rows["plain"], strict=True))
    dec = statistics.median(a["decode"] / p["decode"] for a, p in pairs)
    e2e = statistics.median(a["e2e"] / p["e2e"] for a, p in pairs)
    print(
        f"  {name:>10}: {dec:.3f}x / {e2e:.3f}x, {rows[name][0]['per_step']:.2f} tok/step, "
        f"kept {rows[name][0]['kept']:.3f}"
    )
