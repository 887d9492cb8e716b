"""Plain bf16 decoding with the pair panels (`avx512bf16`) against stop 53's fp32-FMA panels
(`avx512`), one process per build in turns (two builds cannot share a process), each turn
loading the 1.5B and decoding the bench's four code prompts (128 tokens, greedy) after a
warm-up; the memory's read (`x.sum()` over 1 GiB) beside each. Prints each turn's decode
tok/s and the per-round ratio. Usage: python plain_isa_ab.py [rounds]"""

import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import json, statistics, time, torch
from specdec import LLM, SamplingParams
from specdec.bench import workloads
torch.set_num_threads(2)
llm = LLM("qwen2.5-coder-1.5b-instruct")
params = SamplingParams(max_tokens=128, temperature=0.0)
prompts = workloads.CODE_PROMPTS[:4]
llm.generate(prompts[0], params, chat=True)
rates, tokens = [], []
for p in prompts:
    c = llm.generate(p, params, chat=True)[0]
    rates.append((c.num_generated - 1) / (c.elapsed_s - c.ttft_s))
    tokens.append(c.token_ids)
big = torch.randn(256 * 1024 * 1024)
t0 = time.perf_counter(); big.sum(); read = big.numel() * 4 / (time.perf_counter() - t0) / 1e9
print(json.dumps({"decode": statistics.median(rates), "read": read, "tokens": tokens}))
"""


def turn(isa: str) -> dict:
    env = {**os.environ, "SPECDEC_NATIVE_ISA": isa}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ratios, same = [], 0
    for r in range(rounds):
        order = ("avx512bf16", "avx512") if r % 2 == 0 else ("avx512", "avx512bf16")
        res = {isa: turn(isa) for isa in order}
        ratio = res["avx512bf16"]["decode"] / res["avx512"]["decode"]
        ratios.append(ratio)
        same += res["avx512bf16"]["tokens"] == res["avx512"]["tokens"]
        cells = ", ".join(
            f"{i} {res[i]['decode']:.2f} tok/s (read {res[i]['read']:.1f} GB/s)" for i in order
        )
        print(
            f"{time.strftime('%H:%M:%S')} round {r}: {cells}; pairs / fp32 {ratio:.3f}x", flush=True
        )
    low, _, high = statistics.quantiles(ratios, n=4)
    print(
        f"median pairs / fp32 decode: {statistics.median(ratios):.3f}x over {rounds} rounds "
        f"(quartiles {low:.3f}-{high:.3f}); "
        f"same tokens in {same} of {rounds}"
    )


if __name__ == "__main__":
    main()
