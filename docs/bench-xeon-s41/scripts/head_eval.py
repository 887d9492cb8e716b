"""Eagle heads' tokens per target pass in the engine on three sets of held-out ShareGPT chat
prompts (the Qwen 1.5B, int4 unless --quant says, greedy, 64 tokens, one request at a time, chains
of k):

  bench4    the bench's 4 (`workloads.sharegpt_prompts(4, seed=0)`), issue 15's figure so far;
  trainer8  the speculator trainer's 8 held-out prompts (the head of its seed-0 order);
  fresh16   16 prompts from the middle of that order past every one stage 2 answered
            (`eagle_stage2.py`'s list after its first 3,100), so never trained on, and far
            from the replay stream (the order's tail).

Greedy output is the target's whatever the head, so the figure is the head's alone.

    python head_eval.py [--ks 3,5] [--trees 3,2,1:4,2,1] [--quant none] [--draft-quant none]
        [--sets trainer8] HEAD_DIR [HEAD_DIR ...]

(stop 42 added --trees: candidate trees, top-k per level, verified in one pass each.)
"""

import argparse
import json
import sys

sys.path.insert(0, "docs/bench-xeon-s38/scripts")
from eagle_probe import corpus_split  # noqa: E402

from specdec import LLM  # noqa: E402
from specdec.bench import workloads  # noqa: E402
from specdec.config import SamplingParams  # noqa: E402
from specdec.tokenization import encode_prompt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("heads", nargs="+")
ap.add_argument("--ks", default="3,5", help="chains of k ('' for none)")
ap.add_argument("--trees", default="", help="trees, colon-separated, e.g. 3,2,1:4,2,1")
ap.add_argument("--quant", default="int4", help="the target's weights")
ap.add_argument("--draft-quant", default=None, help="the head's (default: as LLM picks)")
ap.add_argument("--sets", default="bench4,trainer8,fresh16")
args = ap.parse_args()
windows = [dict(speculate=int(k)) for k in args.ks.split(",") if k]
windows += [dict(tree=t, speculate=t.count(",") + 1) for t in args.trees.split(":") if t]

llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4")
tok = llm.tokenizer
corpus, eval_docs, train_docs = corpus_split(tok)
bench = [encode_prompt(tok, t, True) for t in workloads.sharegpt_prompts(4, seed=0)]
seen = {tuple(p) for p in bench}
middle = [corpus.prompt_ids(i) for i in train_docs[len(train_docs) // 2 :]]
middle = [p for p in middle if 8 <= len(p) <= 384 and tuple(p) not in seen]
sets = {
    "bench4": bench,
    "trainer8": [p for p in (corpus.prompt_ids(i) for i in eval_docs) if 1 <= len(p) <= 512],
    "fresh16": middle[3100:3116],
}
del llm
params = SamplingParams(temperature=0, max_tokens=64)
for head in args.heads:
    for window in windows:
        run = LLM(
            "qwen2.5-coder-1.5b-instruct",
            quant=args.quant,
            draft=head,
            draft_quant=args.draft_quant,
            **window,
        )
        row = {"head": head, **window, "quant": args.quant, "draft_quant": args.draft_quant}
        for name, prompts in sets.items():
            if name not in args.sets.split(","):
                continue
            steps = generated = 0
            for p in prompts:
                out = run.engine.generate([p], params)[0]
                steps += out.stats.steps
                generated += len(out.token_ids)
            row[name] = round(generated / steps, 3)
        print(json.dumps(row), flush=True)
        del run
