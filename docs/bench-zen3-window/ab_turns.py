"""Plain and `auto` in turns on one loaded pair, for whichever specdec is on PYTHONPATH.

Each turn runs every prompt once with each method, back to back (the order alternating
by turn); one JSON line per turn with each method's tokens and seconds. Run from
ab_window.sh, which alternates processes of the code before and after a change.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("SPECDEC_COST_CACHE", "0")  # every process starts cold

import specdec  # noqa: E402
from specdec.bench.workloads import CODE_PROMPTS, sharegpt_prompts  # noqa: E402
from specdec.config import SamplingParams  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.llm import LLM  # noqa: E402

try:
    from specdec.window import FixedWindow
except ImportError:  # the code before the window package
    from specdec.cost_model import FixedWindow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prompts", type=int, default=3, help="per workload (code, chat)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--quant", default="int4")
    a = p.parse_args()
    llm = LLM(a.model, draft=a.draft, speculate="auto", quant=a.quant, max_batch=1)
    plain = Engine(
        llm.model, llm.tokenizer, llm.eos_ids, max_batch=1, window=FixedWindow(0),
        prefix_cache_tokens=4096, prefill_chunk=llm.prefill_chunk, **llm.engine_options,
    )  # fmt: skip
    engines = {"plain": plain, "auto": llm.engine}
    texts = CODE_PROMPTS[: a.prompts] + sharegpt_prompts(a.prompts, seed=1)
    prompts = [llm.encode(t, True) for t in texts]
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    print(json.dumps({"label": a.label, "specdec": specdec.__file__}), file=sys.stderr)
    for turn in range(a.turns):
        order = list(engines) if turn % 2 == 0 else list(engines)[::-1]
        got = {m: [0, 0.0] for m in engines}
        for ids in prompts:
            for m in order:
                started = time.perf_counter()
                (c,) = engines[m].generate([ids], params)
                got[m][0] += len(c.token_ids)
                got[m][1] += time.perf_counter() - started
        row = {"label": a.label, "turn": turn, **{m: got[m] for m in engines}}
        row["ratio"] = (got["auto"][0] / got["auto"][1]) / (got["plain"][0] / got["plain"][1])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
