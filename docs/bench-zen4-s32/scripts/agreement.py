"""Does the per-position acceptance model misjudge wide windows? Greedy, the draft's
agreement with the target is a fixed sequence A_t over the text (the draft's argmax at t,
given the target's tokens before t, equals the target's token): every window walks the
same sequence. This records it for 8 code and 8 chat prompts (128 tokens, int4 pair,
teacher-forced: one draft pass over prompt + output), then compares, for k = 1..8, the
exact tokens per step of replaying the sequence with window k against `expected_tokens`
at the pooled agreement rate (independent positions).

    python agreement.py            # records agreement.json, then compares
    python agreement.py --compare  # compares the recorded sequences only
"""

import json
import sys
from pathlib import Path

from specdec.cost_model import expected_tokens

RECORD = Path(__file__).with_name("agreement.json")


def record(n: int = 8) -> None:
    import torch

    from specdec import LLM, SamplingParams
    from specdec.bench.workloads import CODE_PROMPTS, sharegpt_prompts

    llm = LLM(
        "qwen2.5-coder-1.5b-instruct", quant="int4", draft="qwen2.5-coder-0.5b-instruct",
        draft_quant="int4", speculate="3",
    )  # fmt: skip
    out = {}
    for name, prompts in (("code", CODE_PROMPTS[:n]), ("chat", sharegpt_prompts(n, seed=0))):
        out[name] = []
        for text in prompts:
            ids = llm.encode(text, chat=True)
            params = SamplingParams(temperature=0, max_tokens=128)
            gen = list(llm.generate(text, params, chat=True)[0].token_ids)
            with torch.inference_mode():
                full = torch.tensor([ids + gen])
                cache = llm.draft_model.new_cache(1, full.shape[1] + 1)
                logits = llm.draft_model(full, cache).logits[0]  # [T, V]
            guess = logits[len(ids) - 1 : -1].argmax(-1).tolist()
            out[name].append([int(g == t) for g, t in zip(guess, gen, strict=True)])
    RECORD.write_text(json.dumps(out))


def replay(seq: list[int], k: int) -> tuple[int, int]:
    """(steps, tokens) of window k walking the agreement sequence."""
    t = steps = 0
    while t < len(seq):
        j = 0
        while j < k and t + j < len(seq) and seq[t + j]:
            j += 1
        t += min(j + 1, len(seq) - t)
        steps += 1
    return steps, len(seq)


def compare() -> None:
    for name, seqs in json.loads(RECORD.read_text()).items():
        seqs = [s[1:] for s in seqs]  # the first token comes from the prefill
        rate = sum(map(sum, seqs)) / sum(map(len, seqs))
        cells = []
        for k in range(1, 9):
            steps, tokens = map(sum, zip(*(replay(s, k) for s in seqs), strict=True))
            cells.append(f"k{k} {tokens / steps:.2f}/{expected_tokens([rate], k):.2f}")
        print(f"{name} agreement {rate:.3f}; tokens per step, replayed/independent:", *cells)


if __name__ == "__main__":
    if "--compare" not in sys.argv:
        record()
    compare()
