"""Does the prefix cache change plain bf16 greedy output? (Scratch, not landed.)

    python docs/bench-zen3-s52/scripts/prefix_cache_bf16.py [tuned | native]

bf16 1.5B, plain decoding, two engines over one model, prefix cache on (4,096 tokens) and
off; each takes a warm-up (code prompt 0, 8 tokens), then code prompts 0, 1, 2 (chat
template, 128 tokens, greedy) in order. Prints where prompt j's answers first differ.
`native`: every projection on the batch-invariant native bf16 kernel at every bucket and
every pass through the native stack, instead of the tuned plan (which picks kernels by
the number of tokens a pass computes).
"""

import sys

import torch

from specdec import LLM, SamplingParams
from specdec.bench import workloads
from specdec.engine import Engine
from specdec.models.linear import Linear

torch.set_num_threads(2)
way = sys.argv[1] if len(sys.argv) > 1 else "tuned"
llm = LLM("qwen2.5-coder-1.5b-instruct")
m = llm.model
if way == "native":
    for mod in m.modules():
        if isinstance(mod, Linear) and mod.plan:
            mod.plan = {b: "native_bf16" for b in mod.plan}
    m.decode_stack.forced = True
params = SamplingParams(max_tokens=128, temperature=0.0)
prompts = [llm.encode(x, chat=True) for x in workloads.CODE_PROMPTS[:3]]
answers = {}
for tokens in (4096, 0):
    e = Engine(m, llm.tokenizer, llm.eos_ids, 8, prefix_cache_tokens=tokens)
    e.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))
    answers[tokens] = [e.generate([ids], params)[0].token_ids for ids in prompts]
for j in range(3):
    pairs = zip(answers[4096][j], answers[0][j], strict=False)
    first = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
    print(f"{way}: prefix cache on vs off: prompt {j}: first difference at {first}")
