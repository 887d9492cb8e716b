"""What a cut vocabulary head saves a draft step, on this host. (Scratch, not landed.)

    python docs/bench-zen3-s52/scripts/draft_head_cost.py [ROUNDS]

The int4 0.5B (the default draft on a CPU) with its head whole and cut to 65,536, 32,768
and 16,384 of ShareGPT's most frequent ids (`frequent_ids`), each head tuned as `LLM`
tunes a draft's: one-token forwards at a 250-token context, the heads taking turns
(ROUNDS rounds of 40 forwards each, medians), and the heads alone on the final state.
"""

import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.drafters.draft_vocab import frequent_ids
from specdec.llm import tuned_layers

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
llm = LLM("qwen2.5-coder-0.5b-instruct", quant="int4")
model = llm.model
usable = min(len(llm.tokenizer), model.config.vocab_size)
heads = {"whole": model.lm_head}
for n in (65536, 32768, 16384):
    ids = frequent_ids(llm.tokenizer, n, usable, keep=llm.eos_ids)
    heads[str(n)] = tuned_layers(model.lm_head.output_rows(ids))
cache = model.new_cache(1, 2048)
step, alone = {k: [] for k in heads}, {k: [] for k in heads}
with torch.inference_mode():
    model(torch.randint(100, 20000, (1, 250)), cache)
    token = torch.tensor([[1234]])
    h = torch.randn(1, 1, model.config.hidden_size, dtype=model.dtype)
    for r in range(rounds):
        for name, head in heads.items():
            model.lm_head = head
            for i in range(45):
                start = time.perf_counter()
                model(token, cache)
                if i >= 5:
                    step[name].append(time.perf_counter() - start)
                cache.truncate(torch.tensor([250]))
            for i in range(45):
                start = time.perf_counter()
                head(h)
                if i >= 5:
                    alone[name].append(time.perf_counter() - start)
        print(
            f"round {r}: "
            + "  ".join(f"{k} {1000 * statistics.median(v[-40:]):.2f}" for k, v in step.items()),
            flush=True,
        )
for name in heads:
    print(
        f"{name:>6}: step {1000 * statistics.median(step[name]):.2f} ms, "
        f"head alone {1000 * statistics.median(alone[name]):.2f} ms"
    )
