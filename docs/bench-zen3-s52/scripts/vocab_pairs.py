"""The draft's whole head against the default cut (the lowest 65,536 ids + the context),
prompt by prompt: bf16 1.5B target, int4 0.5B draft, k = 4, the bench's four code prompts
(chat template), 128 tokens, greedy. Each slot (a prompt in a round) runs plain, whole and
default in a rotating order, so that the host's drift falls on all three alike; the ratio
of each slot is taken against that slot's plain turn.

    python docs/bench-zen3-s52/scripts/vocab_pairs.py [ROUNDS]
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
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
DRAFT = "qwen2.5-coder-0.5b-instruct"
llm = LLM("qwen2.5-coder-1.5b-instruct", draft=DRAFT, draft_quant="int4", speculate=4)


def engine(cut: int | None) -> Engine:
    llm.draft_vocab = cut
    inner, model = llm._drafter_factory(DRAFT, "bf16", "cpu", "int4"), llm.draft_model

    def factory(b, n):
        llm.draft_model = model  # the LLM's factory reads it when the engine sizes its drafter
        return inner(b, n)

    return Engine(
        llm.model,
        llm.tokenizer,
        llm.eos_ids,
        8,
        factory,
        GreedyAcceptor(),
        FixedWindow(4),
        prefix_cache_tokens=llm.prefix_cache_tokens,
    )


methods = {"plain": llm.plain_engine(), "whole": engine(0), "default": engine(None)}
names = list(methods)
params = SamplingParams(max_tokens=128, temperature=0.0)
prompts = [llm.encode(p, chat=True) for p in workloads.CODE_PROMPTS[:4]]
for e in methods.values():
    for ids in prompts:  # warm, and every prompt's prefix stored alike
        e.generate([ids], SamplingParams(max_tokens=8, temperature=0.0))
ratios = {"whole": [], "default": []}
pair = []
slot = 0
for r in range(rounds):
    for j, ids in enumerate(prompts):
        order = names[slot % 3 :] + names[: slot % 3]
        slot += 1
        decode = {}
        for name in order:
            start = time.perf_counter()
            out = methods[name].generate([ids], params)[0]
            decode[name] = (len(out.token_ids) - 1) / (time.perf_counter() - start - out.ttft_s)
        for name in ratios:
            ratios[name].append(decode[name] / decode["plain"])
        pair.append(decode["default"] / decode["whole"])
        print(
            f"round {r} prompt {j} ({', '.join(order)}): plain {decode['plain']:.2f} tok/s, "
            f"whole {ratios['whole'][-1]:.3f}x, default {ratios['default'][-1]:.3f}x, "
            f"default / whole {pair[-1]:.3f}",
            flush=True,
        )
print(
    f"{len(pair)} slots, medians: whole {statistics.median(ratios['whole']):.3f}x plain, "
    f"default {statistics.median(ratios['default']):.3f}x plain, "
    f"default / whole {statistics.median(pair):.3f} (quartiles "
    f"{statistics.quantiles(pair, n=4)[0]:.3f}-{statistics.quantiles(pair, n=4)[2]:.3f})"
)
