"""Whole passes of 1/2/4/8 tokens through the eager layers and through the native decode
stack, in turns (stop 34): python stack_vs_eager.py MODEL none|int4"""

import statistics as st
import sys
import time

import torch

from specdec.llm import LLM
from specdec.models import decode_stack as ds

name, quant = sys.argv[1], sys.argv[2]
llm = LLM(name, quant=quant)
m = llm.model
print("takes:", {r: m.decode_stack.takes(r) for r in (1, 2, 4, 8)} if m.decode_stack else None)


def rate(rows):
    cache = m.new_cache(1, 512)
    prompt = list(range(100, 164))
    with torch.inference_mode():
        m(torch.tensor([prompt]), cache)
        L = int(cache.lengths[0])
        tok = torch.tensor([prompt[-rows:]])
        ts = []
        for _ in range(12):
            t = time.perf_counter()
            m(tok, cache)
            ts.append(time.perf_counter() - t)
            cache.truncate(torch.tensor([L]))
    return st.median(ts[2:]) * 1e3


orig = ds.DecodeStack.takes
for rows in (1, 2, 4, 8):
    out = []
    for _turn in range(2):
        ds.DecodeStack.takes = lambda self, r: False
        a = rate(rows)
        ds.DecodeStack.takes = lambda self, r: True
        b = rate(rows)
        out.append(f"eager {a:.1f} stack {b:.1f}")
    print(rows, "rows:", " | ".join(out), flush=True)
