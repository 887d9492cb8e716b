"""Would the draft stop early where it is unsure? (Scratch, not landed.)

    python docs/bench-zen3-s50/scripts/draft_confidence.py trace   # ~4 min, writes the trace
    python docs/bench-zen3-s50/scripts/draft_confidence.py simulate

`trace`: the bench's 12 code prompts, bf16 1.5B + int4 0.5B draft at a fixed k = 7, greedy,
128 tokens; per step the draft's top probability at each of its 7 positions and how many
drafts the target kept (`conf_trace.json` beside this folder's logs).
`simulate`: tokens over cost, sum (kept + 1) / sum (v(L) + (L + extra) c), for fixed windows
and for windows cut by the draft's confidence (L = the first position whose top probability
is under tau, that token kept: `after`; that token dropped, its forward paid: `before`; the
running product of top probabilities under tau: `cumprod`), with the costs the stop-49
bench measured (run A and run B).
"""

import json
import sys
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / "conf_trace.json"
COSTS = {
    "A": ([1.00, 1.07, 1.11, 1.18, 1.20, 1.53, 1.91, 2.10], 0.150),
    "B": ([1.00, 0.96, 1.02, 1.15, 1.29, 1.56, 2.04, 2.31], 0.149),
}


def trace() -> None:
    import torch

    from specdec import LLM
    from specdec.bench.workloads import CODE_PROMPTS
    from specdec.config import SamplingParams
    from specdec.drafters import draft_model as dm

    torch.set_num_threads(2)
    steps, current = [], {}
    argmax, propose, commit = (
        dm.DraftModelDrafter._argmax,
        dm.DraftModelDrafter.propose,
        dm.DraftModelDrafter.commit,
    )

    def traced_argmax(self, logits):
        top = float(torch.softmax(logits[0].float(), -1).max())
        current.setdefault("pmax", []).append(top)
        return argmax(self, logits)

    def traced_propose(self, k, params, generators):
        current.clear()
        return propose(self, k, params, generators)

    def traced_commit(self, num_accepted, next_tokens):
        if self._k:
            kept = int(num_accepted[0])
            steps.append({"k": self._k, "pmax": current.get("pmax", []), "accepted": kept})
        return commit(self, num_accepted, next_tokens)

    dm.DraftModelDrafter._argmax = traced_argmax
    dm.DraftModelDrafter.propose = traced_propose
    dm.DraftModelDrafter.commit = traced_commit
    llm = LLM(
        "qwen2.5-coder-1.5b-instruct",
        draft="qwen2.5-coder-0.5b-instruct",
        draft_quant="int4",
        speculate=7,
        k_max=8,
    )
    for i, prompt in enumerate(CODE_PROMPTS):
        out = llm.generate(prompt, SamplingParams(max_tokens=128, temperature=0), chat=True)[0]
        print(i, len(out.token_ids), len(steps), flush=True)
        TRACE.write_text(json.dumps(steps))


def simulate() -> None:
    steps = json.loads(TRACE.read_text())
    print(len(steps), "steps")

    def ratio(policy, v, c):
        tokens = cost = 0.0
        for s in steps:
            length, extra = policy(s["pmax"])
            tokens += min(s["accepted"], length) + 1
            cost += v[length] + (length + extra) * c
        return tokens / cost, tokens / len(steps)

    def after(tau, kmax):
        return lambda p: next(((i + 1, 0) for i in range(kmax) if p[i] < tau), (kmax, 0))

    def before(tau, kmax):
        return lambda p: next(((i, 1) for i in range(kmax) if p[i] < tau), (kmax, 0))

    def cumprod(tau, kmax):
        def policy(p):
            prod = 1.0
            for i in range(kmax):
                prod *= p[i]
                if prod < tau:
                    return i + 1, 0
            return kmax, 0

        return policy

    for name, (v, c) in COSTS.items():
        print("costs", name)
        for k in range(1, 8):
            r, t = ratio(lambda p, k=k: (k, 0), v, c)
            print(f"  fixed k={k}: {r:.3f} ({t:.2f} tok/step)")
        for kmax in (4, 5, 6, 7):
            for tau in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
                cells = [ratio(f(tau, kmax), v, c) for f in (after, before, cumprod)]
                text = "  ".join(
                    f"{n} {r:.3f} ({t:.2f})"
                    for n, (r, t) in zip(("after", "before", "cumprod"), cells, strict=True)
                )
                print(f"  kmax={kmax} tau={tau}: {text}")


if __name__ == "__main__":
    {"trace": trace, "simulate": simulate}[sys.argv[1]]()
