"""Plain against `auto` with a draft model on synthetic prompts, a fresh engine per run
as the bench builds one per point, taking turns in one process (medians). The bench
flagged such points at 0.94-0.96x while `auto` never drafted (tokens per pass 1.00).

    .venv/bin/python docs/bench-zen3-s25/scripts/ab_auto.py --temperature 1
    .venv/bin/python docs/bench-zen3-s25/scripts/ab_auto.py --model qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --quant int4 --length 1024 --prompts 1 \
        --tokens 64 --repeats 4
"""

import argparse
import sys
from pathlib import Path

# The turn-taking helper of stop 24's A/B scripts, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench-zen3-s24" / "scripts"))
from turns import in_turn  # noqa: E402

from specdec.bench.workloads import synthetic_prompt
from specdec.config import SamplingParams
from specdec.cost_model import AdaptiveWindow
from specdec.engine import Engine
from specdec.llm import LLM

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="smollm2-135m-instruct")
ap.add_argument("--draft", default="smollm2-135m-instruct")
ap.add_argument("--quant", default="none")
ap.add_argument("--length", type=int, default=64)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--prompts", type=int, default=4)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--repeats", type=int, default=9)
args = ap.parse_args()
llm = LLM(args.model, draft=args.draft, quant=args.quant, speculate="auto", max_batch=args.batch)


def fresh(drafter: bool):
    def run(prompts, params):
        engine = Engine(
            llm.model,
            llm.tokenizer,
            llm.eos_ids,
            args.batch,
            llm.engine.drafter_factory if drafter else None,
            window=AdaptiveWindow(k_max=8) if drafter else None,
            prefix_cache_tokens=llm.prefix_cache_tokens,
        )
        return engine.generate(prompts, params)

    return run


arms = {"plain": fresh(False), "draft-auto": fresh(True)}
prompts = [synthetic_prompt(llm.tokenizer, args.length, seed=s) for s in range(args.prompts)]
params = SamplingParams(
    temperature=args.temperature, max_tokens=args.tokens, ignore_eos=True, seed=1
)
rates = in_turn(arms, prompts, params, repeats=args.repeats)
for name, rate in rates.items():
    print(name, round(rate, 2))
print("auto / plain", round(rates["draft-auto"] / rates["plain"], 3))
