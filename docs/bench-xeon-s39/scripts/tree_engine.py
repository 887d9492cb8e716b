"""Eagle trees in the engine: tokens per pass and tok/s on the bench's 4 held-out ShareGPT
prompts, batch 1, one process, configurations in turn (round robin over repeats)."""

import json
import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.cost_model import FixedWindow
from specdec.drafters import EagleDrafter
from specdec.engine import Engine
from specdec.tokenization import encode_prompt

quant = sys.argv[1]
repeats = int(sys.argv[2])
configs = json.loads(sys.argv[3])  # [[name, tree or k, n_candidates], ...]
torch.set_num_threads(2)
head_dir = sys.argv[4] if len(sys.argv) > 4 else "~/.cache/specdec/runs/qwen15-eagle-s38"
llm = LLM("qwen2.5-coder-1.5b-instruct", quant=quant, draft=head_dir, speculate=1, max_batch=1)
head = llm.eagle
tok = llm.tokenizer
prompts = [encode_prompt(tok, t, True) for t in workloads.sharegpt_prompts(4, seed=0)]
params = SamplingParams(temperature=0, max_tokens=64)


def engine_for(spec, ncand):
    if spec == 0:
        return Engine(llm.model, tok, llm.eos_ids, 1, **llm.engine_options)
    if isinstance(spec, int):
        make = lambda b, n: EagleDrafter(head, b, n)  # noqa: E731
        return Engine(
            llm.model, tok, llm.eos_ids, 1, make, window=FixedWindow(spec), **llm.engine_options
        )
    tree = tuple(spec)
    make = lambda b, n: EagleDrafter(head, b, n, tree, ncand)  # noqa: E731
    return Engine(
        llm.model,
        tok,
        llm.eos_ids,
        1,
        make,
        window=FixedWindow(len(tree)),
        max_tree_nodes=make(1, 8).max_nodes,
        **llm.engine_options,
    )


engines = {name: engine_for(spec, ncand) for name, spec, ncand in configs}
rates = {name: [] for name in engines}
tpp = {}
ref = None
for rep in range(repeats + 1):
    for name, eng in engines.items():
        t0 = time.perf_counter()
        outs = [eng.generate([p], params)[0] for p in prompts]
        wall = time.perf_counter() - t0
        toks = sum(len(o.token_ids) for o in outs)
        steps = sum(o.stats.steps for o in outs)
        if rep:
            rates[name].append(toks / wall)
        tpp[name] = (toks - len(outs)) / steps  # the prefill's token excluded
        ids = [o.token_ids for o in outs]
        if name == "plain":
            ref = ids
        same = sum(a == b for a, b in zip(ids, ref or ids, strict=True))
        print(
            f"rep {rep} {name}: {toks / wall:.2f} tok/s, tokens/pass {tpp[name]:.3f}, "
            f"same {same}/4",
            flush=True,
        )
base = statistics.median(rates["plain"])
for name in engines:
    m = statistics.median(rates[name])
    print(
        f"{quant} {name}: median {m:.2f} tok/s ({m / base:.3f}x plain), tokens/pass {tpp[name]:.3f}"
    )
