"""How much of ShareGPT's answers the default cut can draft: the share of answer tokens
among the 65,536 lowest Qwen ids, alone and widened by the context (the prompt and the
answer so far), over the first answers of N conversations. (Scratch, not landed.)

    python docs/bench-zen3-s52/scripts/chat_coverage.py [N]
"""

import sys

from transformers import AutoTokenizer

from specdec.bench.workloads import sharegpt_conversations
from specdec.models.registry import resolve

n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
tok = AutoTokenizer.from_pretrained(resolve("qwen2.5-coder-1.5b-instruct", "bf16"))
total = low = widened = 0
languages = {"ascii": [0, 0, 0], "other": [0, 0, 0]}
done = 0
for conv in sharegpt_conversations():
    turns = conv.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
        continue
    prompt = tok(turns[0]["value"], add_special_tokens=False)["input_ids"]
    answer = tok(turns[1]["value"], add_special_tokens=False)["input_ids"][:512]
    seen = set(prompt)
    kind = "ascii" if turns[1]["value"].isascii() else "other"
    for t in answer:
        ok_low = t < 65536
        ok_wide = ok_low or t in seen
        total += 1
        low += ok_low
        widened += ok_wide
        languages[kind][0] += 1
        languages[kind][1] += ok_low
        languages[kind][2] += ok_wide
        seen.add(t)
    done += 1
    if done >= n:
        break
print(
    f"{done} answers, {total} tokens: lowest 65,536 {low / total:.3f}, "
    f"+ context {widened / total:.3f}"
)
for kind, (t, a, b) in languages.items():
    if t:
        print(f"  {kind} answers: {t} tokens, lowest {a / t:.3f}, + context {b / t:.3f}")
