"""Stop 37's chat_trace.py with an eagle head as the draft ($DRAFT, stop 38).

Every step of a cold int4 `auto` over the bench's 4 ShareGPT prompts in one process,
twice over (stop 36; stop 37 added --no-forget): per step, k:draft tokens kept (with
--times the verify + draft milliseconds, and the guard's off count), per request tok/s,
to see where `auto` loses to a fixed k = 3 on chat. --no-forget hands the window no
"fresh batch" flag (a new batch then keeps the guard's trip, as before stop 37).

    SPECDEC_COST_CACHE=0 python chat_trace.py [auto|3] [--times] [--no-forget]
"""

import os
import sys
import time

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.tokenization import encode_prompt

speculate = sys.argv[1] if len(sys.argv) > 1 else "auto"
TIMES = "--times" in sys.argv
llm = LLM(
    "qwen2.5-coder-1.5b-instruct",
    draft=os.path.expanduser(os.environ.get("DRAFT", "~/.cache/specdec/runs/qwen15-eagle-s38")),
    quant="int4",
    speculate=speculate if speculate == "auto" else int(speculate),
)
w = llm.engine.window
log = []
obs = w.observe


def observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, *a, **kw):
    obs(rows, k, verify_s, draft_s, drafted_at, accepted_at, *a, **kw)
    off = f"/off{w._off}" if getattr(w, "_off", 0) else ""
    ms = f"({verify_s * 1e3:.0f}+{draft_s * 1e3:.0f})" if k and TIMES else ""
    log.append(f"{k}:{sum(accepted_at)}{ms}{off}")


w.observe = observe
if "--no-forget" in sys.argv:
    op = w.observe_prefill
    w.observe_prefill = lambda *a: op(*a[:4])
tok = llm.tokenizer
prompts = [encode_prompt(tok, t, True) for t in workloads.sharegpt_prompts(4, seed=0)]
for turn in range(2):
    total_t = total_n = 0
    for p in prompts:
        log.clear()
        t = time.perf_counter()
        out = llm.engine.generate([p], [SamplingParams(temperature=0.0, max_tokens=64)])[0]
        dt = time.perf_counter() - t
        total_t, total_n = total_t + dt, total_n + len(out.token_ids)
        plain = w.costs.verify_time(1, 1) if hasattr(w, "costs") else None
        ref = f" plain {plain * 1e3:.1f} ms" if plain else ""
        print(f"{len(out.token_ids) / dt:6.2f} tok/s{ref}", " ".join(log), flush=True)
    print(f"turn {turn}: {total_n / total_t:.2f} tok/s", flush=True)
