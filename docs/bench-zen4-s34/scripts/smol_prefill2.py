"""The prefills a fresh engine times on SmolLM2 and the per-token price it keeps (stop 34)."""

from specdec.bench import workloads
from specdec.config import SamplingParams
from specdec.cost_model import AdaptiveWindow
from specdec.engine import Engine
from specdec.llm import LLM

llm = LLM("smollm2-135m-instruct", draft="smollm2-135m-instruct", speculate="auto")
base = llm.engine
for _run in range(3):
    w = AdaptiveWindow()
    eng = Engine(
        llm.model,
        llm.tokenizer,
        llm.eos_ids,
        1,
        base.drafter_factory,
        base.acceptor,
        w,
        prefix_cache_tokens=llm.prefix_cache_tokens,
        **llm.engine_options,
    )
    op = w.observe_prefill

    def obs(rows, tpr, tokens, seconds, _op=op):
        print(f"  prefill {tokens} tokens {seconds * 1e3:.1f} ms", end="")
        _op(rows, tpr, tokens, seconds)

    w.observe_prefill = obs
    for p in workloads.CODE_PROMPTS[:4]:
        eng.generate([llm.encode(p, False)], [SamplingParams(temperature=0.0, max_tokens=32)])
        c = w.costs
        print(f" -> prefill_token_s {c.prefill_token_s * 1e3:.2f} ms, drafted {bool(w._reached)}")
