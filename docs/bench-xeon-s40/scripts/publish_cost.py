"""What a learning eagle head's publish costs on the int4 Qwen 1.5B: an `LLM` with
`learn=True` on a copy of a head (the learner never trains by itself here), 8 chat
requests, then 8 micro-batches and 3 publishes timed in turn; and a drafting form made
from scratch (copy, fuse and quantize, tune) for comparison.

    cp -r ~/.cache/specdec/runs/qwen15-eagle-s39 /tmp/headcopy
    python publish_cost.py /tmp/headcopy
"""

import sys
import time

from specdec import LLM
from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import tuned_layers
from specdec.speculator.online import LearnConfig, copy_heads
from specdec.tokenization import encode_prompt

config = LearnConfig(min_tokens=1 << 62, checkpoint_every=0)
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    quant="int4",
    draft=sys.argv[1],
    speculate=3,
    learn=True,
    learn_config=config,
)
prompts = [encode_prompt(llm.tokenizer, t, True) for t in workloads.sharegpt_prompts(8, seed=0)]
params = SamplingParams(temperature=0, max_tokens=64)
for p in prompts:
    llm.engine.generate([p], params)
learner = llm.learner


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return round(time.perf_counter() - started, 3)


print("micro-batches s", [timed(learner._micro_step) for _ in range(8)])
print("publishes s", [timed(learner.publish) for _ in range(3)])
source = learner.published
for _ in range(2):
    head = copy_heads(source, source)
    fuse = timed(lambda h=head: h.for_drafting("int4"))
    tune = timed(lambda h=head: tuned_layers(h))
    print("from scratch: fuse and quantize s", fuse, "tune s", tune)
