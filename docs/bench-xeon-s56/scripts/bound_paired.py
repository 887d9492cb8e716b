"""Plain bf16 decoding against the bandwidth bound read beside it, and against transformers
`generate`, in one process: issue 13's first bar (>= 65% of the bound, >= 1.6x
transformers). Each turn reads the bandwidth (`doctor.read_bandwidth_gbs`, 1 GiB, best of
3), then runs specdec plain and transformers greedy on the same prompt in alternating
order, then reads the bandwidth again. The bound of a turn is the mean of its two reads
over the bytes one step streams (`doctor.decode_bytes`). Decode rate = tokens after the
first over the time after the first token; transformers' is timed end to end minus a
1-token generate of the same prompt (its prefill).
Usage: python bound_paired.py [turns] [max_tokens] [registry model]"""

import statistics
import sys
import time

import torch
import transformers

from specdec import LLM, SamplingParams
from specdec.bench.peers import hf_greedy
from specdec.doctor import decode_bytes, read_bandwidth_gbs
from specdec.models.config import ModelConfig
from specdec.models.registry import cache_root

torch.set_num_threads(2)
TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 128
NAME = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b-instruct"
directory = cache_root() / "models" / NAME / "bf16"
step_bytes = decode_bytes(ModelConfig.from_dir(directory))
llm = LLM(NAME)  # plain, bf16
hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
hf.eval()
prompts = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Explain what a hash map is and write a small one in Python.",
    "Write a C function that reverses a singly linked list in place.",
]
params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)


def ours(prompt: str) -> tuple[float, list[int]]:
    c = llm.generate([prompt], params)[0]
    return (c.num_generated - 1) / (c.elapsed_s - c.ttft_s), c.token_ids


def theirs(ids: list[int]) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    hf_greedy(hf, ids, 1)
    t1 = time.perf_counter()
    out = hf_greedy(hf, ids, TOKENS)
    t2 = time.perf_counter()
    return (len(out) - 1) / ((t2 - t1) - (t1 - t0)), out


ours(prompts[0])  # warm both
theirs(llm.encode(prompts[0], False))
rows = []
print(
    f"{NAME}: bytes a step {step_bytes / 1e9:.3f} GB; {TURNS} turns x {TOKENS} tokens", flush=True
)
for turn in range(TURNS):
    prompt = prompts[turn % len(prompts)]
    ids = llm.encode(prompt, False)
    before = read_bandwidth_gbs(1.0, 3)
    if turn % 2 == 0:
        ours_rate, ours_ids = ours(prompt)
        hf_rate, hf_ids = theirs(ids)
    else:
        hf_rate, hf_ids = theirs(ids)
        ours_rate, ours_ids = ours(prompt)
    after = read_bandwidth_gbs(1.0, 3)
    bound = (before + after) / 2 * 1e9 / step_bytes
    same = sum(a == b for a, b in zip(ours_ids, hf_ids, strict=False)) / len(ours_ids)
    rows.append((ours_rate / bound, ours_rate / hf_rate))
    print(
        f"turn {turn}: read {before:.1f}/{after:.1f} GB/s, bound {bound:.2f} tok/s; "
        f"specdec {ours_rate:.2f} tok/s ({ours_rate / bound:.0%} of bound), "
        f"transformers {hf_rate:.2f} ({ours_rate / hf_rate:.2f}x); same tokens {same:.2f}",
        flush=True,
    )
print(
    f"median: {statistics.median(r[0] for r in rows):.0%} of the bound, "
    f"{statistics.median(r[1] for r in rows):.2f}x transformers"
)
