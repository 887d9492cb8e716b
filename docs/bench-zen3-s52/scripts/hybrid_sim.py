"""Would prompt lookup save draft-model forwards on code? (Scratch, not landed.)

    python docs/bench-zen3-s52/scripts/hybrid_sim.py trace      # ~5 min, writes the trace
    python docs/bench-zen3-s52/scripts/hybrid_sim.py simulate

`trace`: the bench's 12 code prompts (chat template), the bf16 1.5B's greedy answer of 128
tokens each; then one teacher-forced pass of the int4 0.5B draft over prompt + answer, its
argmax at every answer position. For greedy verification a chain is kept up to its first
token that differs from the answer, and while the chain is right the draft's own context is
the answer's: its argmax there is what it would draft.
`simulate`: a step at answer position t drafts positions t .. t+k-1; each comes either from
an n-gram lookup over prompt + answer[:position] (free; the draft model later ingests it in
its next forward, a wider pass) or from a draft forward (cost c). Tokens over cost, with
stop 49's measured costs.
"""

import json
import sys
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / "hybrid_trace.json"
COSTS = {
    "A": ([1.00, 1.07, 1.11, 1.18, 1.20, 1.53, 1.91, 2.10], 0.150),
    "B": ([1.00, 0.96, 1.02, 1.15, 1.29, 1.56, 2.04, 2.31], 0.149),
}
WIDE = 1.15  # a draft forward of 2+ tokens over one of 1 (stop 49: 22.6-24.0 / 19.7-20.3 ms)
STEP = 0.03  # acceptor, window, host, per step, in plain steps


def trace() -> None:
    import torch

    from specdec import LLM
    from specdec.bench.workloads import CODE_PROMPTS
    from specdec.config import SamplingParams

    torch.set_num_threads(2)
    llm = LLM(
        "qwen2.5-coder-1.5b-instruct",
        draft="qwen2.5-coder-0.5b-instruct",
        draft_quant="int4",
        speculate=4,
    )
    draft = llm.draft_model
    rows = []
    for i, prompt in enumerate(CODE_PROMPTS):
        ids = llm.encode(prompt, chat=True)
        out = llm.generate(prompt, SamplingParams(max_tokens=128, temperature=0), chat=True)[0]
        answer = list(out.token_ids)
        with torch.inference_mode():
            cache = draft.new_cache(1, len(ids) + len(answer) + 4)
            tokens = torch.tensor([ids + answer[:-1]])
            at = torch.arange(len(ids) - 1, tokens.shape[1])[None]
            logits = draft(tokens, cache, logits_at=at).logits[0]
            usable = min(len(llm.tokenizer), draft.config.vocab_size)
            pred = logits[:, :usable].argmax(-1).tolist()
        agree = sum(int(p == a) for p, a in zip(pred, answer, strict=True)) / len(answer)
        rows.append({"prompt": ids, "answer": answer, "draft": pred})
        print(i, len(ids), len(answer), f"draft top-1 {agree:.3f}", flush=True)
        TRACE.write_text(json.dumps(rows))


def lookup(history, max_n, min_n):
    """(token, n) after the latest earlier match of the longest suffix, or (None, 0)."""
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n :]
        for start in range(size - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                return history[start + n], n
    return None, 0


def simulate() -> None:
    rows = json.loads(TRACE.read_text())
    # Per row and answer position: the n-gram's token and match length given the true prefix.
    grams = {}
    for max_n in (2, 3, 4, 6):
        for min_n in (1, 2, 3):
            if min_n > max_n:
                continue
            table = []
            for row in rows:
                ctx = row["prompt"] + row["answer"]
                base = len(row["prompt"])
                table.append(
                    [lookup(ctx[: base + t], max_n, min_n) for t in range(len(row["answer"]))]
                )
            grams[max_n, min_n] = table
    for (max_n, min_n), table in grams.items():
        hits = right = 0
        for row, look in zip(rows, table, strict=True):
            for t, (tok, _n) in enumerate(look):
                if tok is not None:
                    hits += 1
                    right += int(tok == row["answer"][t])
        total = sum(len(r["answer"]) for r in rows)
        print(
            f"n-gram {min_n}..{max_n}: proposes at {hits / total:.3f} of positions, "
            f"right {right / max(hits, 1):.3f}"
        )

    def run(policy, k, v, c):
        tokens = cost = steps = 0.0
        for ri, row in enumerate(rows):
            answer, draft = row["answer"], row["draft"]
            t = 0
            while t < len(answer):
                kept, forwards, widened, pending_ngram = 0, 0, 0, 0
                width = min(k, len(answer) - t - 1)
                for j in range(width):
                    pos = t + j
                    token = policy(ri, pos)
                    if token is None:  # a draft forward
                        forwards += 1
                        widened += int(pending_ngram > 0)
                        pending_ngram = 0
                        token = draft[pos]
                    else:
                        pending_ngram += 1
                    if token != answer[pos]:
                        break
                    kept += 1
                # the chain past the first miss is still drafted: count its forwards too
                for j2 in range(j + 1 if width else 0, width):
                    if policy(ri, t + j2) is None:
                        forwards += 1
                tokens += kept + 1
                cost += v[width] + c * (forwards + (WIDE - 1) * widened) + STEP
                steps += 1
                t += kept + 1
        return tokens / cost, tokens / steps

    for name, (v, c) in COSTS.items():
        print("costs", name)
        for k in (3, 4, 5):
            r, tps = run(lambda ri, pos: None, k, v, c)
            print(f"  draft only k={k}: {r:.3f} ({tps:.2f} tok/step)")
            for (max_n, min_n), table in grams.items():
                for need in (1, 2, 3):
                    if need < min_n or need > max_n:
                        continue

                    def policy(ri, pos, table=table, need=need):
                        tok, n = table[ri][pos]
                        return tok if tok is not None and n >= need else None

                    r, tps = run(policy, k, v, c)
                    print(f"    n-gram {min_n}..{max_n}, match >= {need}: {r:.3f} ({tps:.2f})")


if __name__ == "__main__":
    {"trace": trace, "simulate": simulate}[sys.argv[1]]()
