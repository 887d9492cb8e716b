"""Page faults in a long prefill and in decoding, with glibc's defaults against a heap that
keeps what it freed (`mallopt`: no mmap for large blocks, no trimming), one mode per
process: the sweep's int4 1.5B spent ~13% of its CPU in the kernel at 1024 x 4, ~100k
minor faults a second. Usage: python malloc_ab.py MODE [len] [rows] [repeats], MODE in
default | keep; prints one JSON line."""

import ctypes
import json
import resource
import sys
import time

MODE = sys.argv[1]
LEN = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 1
REPEATS = int(sys.argv[4]) if len(sys.argv) > 4 else 4
if MODE == "keep":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    assert libc.mallopt(M_MMAP_MAX, 0) == 1
    assert libc.mallopt(M_TRIM_THRESHOLD, 1 << 40) == 1

import torch  # noqa: E402

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.bench import workloads  # noqa: E402

torch.set_num_threads(2)
llm = LLM("qwen2.5-coder-1.5b-instruct", quant="int4")
SETS = [
    [workloads.synthetic_prompt(llm.tokenizer, LEN, seed=100 * r + i) for i in range(ROWS)]
    for r in range(REPEATS + 3)
]  # new prompts for every call: the prefix cache would serve a repeated one


def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


def run(max_tokens):
    prompts = SETS.pop()
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens)] * ROWS
    before = usage()
    outs = llm.engine.generate(prompts, params)
    after = usage()
    wall, user, system, faults = (a - b for a, b in zip(after, before, strict=True))
    ttft = max(o.ttft_s for o in outs)
    return dict(wall=wall, user=user, sys=system, faults=faults, ttft=ttft)


llm.engine.generate([p[:64] for p in SETS[0]], [SamplingParams(max_tokens=4)] * ROWS)  # warm
prefill = [run(1) for _ in range(REPEATS)]
decode = [run(64) for _ in range(2)]
print(
    json.dumps(
        dict(
            mode=MODE,
            len=LEN,
            rows=ROWS,
            prefill=prefill,
            decode=decode,
            rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        )
    )
)
