"""Offline: how many tokens per target pass would an eagle head's candidate tree give?
For every drafting position of the held-out continuations, the rank of the target's token
at each depth, with the head fed the true tokens (the tree's node on the accepted path)."""

import itertools
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, "docs/bench-xeon-s38/scripts")
from eagle_probe import load_target  # noqa: E402

from specdec.speculator.eagle import load_eagle  # noqa: E402

HEAD = Path(sys.argv[1]).expanduser()
DEPTH = 5
torch.set_num_threads(2)
target, _, _ = load_target()
head = load_eagle(HEAD, target).eval()
vmap = head.vocab_map
inv = torch.full((target.config.vocab_size,), 10**6, dtype=torch.long)
inv[vmap] = torch.arange(len(vmap))
data = load_file("bench-out/s38/eagle/eval.safetensors")
ranks = []  # per position: [DEPTH] rank of the truth at each depth (10**6: not drafted)
with torch.no_grad():
    for j in range(sum(n.startswith("tokens.") for n in data)):
        x, f, p = data[f"tokens.{j}"], data[f"hidden.{j}"].float(), int(data[f"prompt.{j}"])
        S = len(x)
        inp = head.inputs(x[None, 1:], f[None, :-1])
        q, k, v = head.qkv(inp, torch.arange(S - 1)[None])
        step1 = head.finish(inp + head.attend(q, k, v, causal=True))
        for t in range(p - 1, S - 2 - DEPTH + 1):
            fh = step1[:, t : t + 1]
            kk, vv = k[:, :, : t + 1], v[:, :, : t + 1]
            truth = x[t + 2 : t + 2 + DEPTH].tolist()
            r = []
            for i in range(DEPTH):
                logits = head.logits(fh)[0, 0]
                ti = int(inv[truth[i]])
                r.append(int((logits > logits[ti]).sum()) if ti < len(vmap) else 10**6)
                if i == DEPTH - 1:
                    break
                xi = head.inputs(torch.tensor([[truth[i]]]), fh)
                qi, ki, vi = head.qkv(xi, torch.tensor([[t + 1 + i]]))
                kk, vv = torch.cat([kk, ki], 2), torch.cat([vv, vi], 2)
                fh = head.finish(xi + head.attend(qi, kk, vv))
            ranks.append(r)
R = torch.tensor(ranks)
print("positions", len(R), "top-1 by depth (conditional on the path):")
shapes = [
    (1,),
    (1, 1, 1),
    (1, 1, 1, 1, 1),
    (2, 1, 1),
    (2, 2, 1),
    (3, 1, 1),
    (3, 2, 1),
    (3, 2, 2),
    (4, 2, 1),
    (4, 2, 2, 1),
    (4, 3, 2, 1, 1),
    (6, 3, 2, 1, 1),
    (8, 4, 2, 1, 1),
    (2, 2, 2, 1, 1),
    (10, 1, 1),
    (10, 2, 1, 1),
    (5, 3, 2, 2, 1),
]
out = {}
for s in shapes:
    ok = torch.ones(len(R), dtype=torch.bool)
    acc = torch.zeros(len(R))
    for d, kd in enumerate(s):
        ok &= R[:, d] < kd
        acc += ok
    nodes = sum(itertools.accumulate(s, lambda a, b: a * b))
    out[str(s)] = {"tokens_per_pass": round(1 + acc.mean().item(), 3), "nodes": nodes}
    print(s, out[str(s)])
for d in range(DEPTH):
    print(
        "depth",
        d + 1,
        "P(rank<k) for k=1,2,4,8:",
        [round((R[:, d] < kk).float().mean().item(), 3) for kk in (1, 2, 4, 8)],
    )
