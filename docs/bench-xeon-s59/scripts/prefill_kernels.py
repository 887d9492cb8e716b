"""Which dense kernel multiplies a prefill's rows fastest here, at the 256-row bucket the
kernel plans are timed at and at 1,024 rows (4 x 256 prompts), for the 1.5B's projection
shapes (bf16 weights, random)? The kernels take turns in rounds (order rotating), each
timing a few products; medians over rounds of ms a product.

    python prefill_kernels.py [rounds]
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
SHAPES = {"qkv 2048x1536": (2048, 1536), "o 1536x1536": (1536, 1536),
          "gate/up 17920x1536": (17920, 1536), "down 1536x8960": (1536, 8960)}  # fmt: skip

torch.manual_seed(0)
for name, (n_out, n_in) in SHAPES.items():
    w = torch.randn(n_out, n_in, dtype=torch.bfloat16) / n_in**0.5
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    kernels = {
        "linear": lambda x, w=w: F.linear(x, w),
        "mv_mm": lambda x, w=w: torch.mm(w, x.t()).t(),
        "mv_mm+contig": lambda x, w=w: torch.mm(w, x.t()).t().contiguous(),
        "onednn": lambda x, p=packed: torch.ops.mkldnn._linear_pointwise(
            x, p, None, "none", [], ""
        ),
    }
    for rows in (256, 1024):
        x = torch.randn(rows, n_in, dtype=torch.bfloat16)
        times = {k: [] for k in kernels}
        names = list(kernels)
        for r in range(ROUNDS):
            order = names[r % len(names) :] + names[: r % len(names)]
            for k in order:
                kernels[k](x)
                t0 = time.perf_counter()
                for _ in range(3):
                    kernels[k](x)
                times[k].append((time.perf_counter() - t0) / 3 * 1e3)
        meds = {k: statistics.median(v) for k, v in times.items()}
        best = min(meds.values())
        line = ", ".join(f"{k} {v:.2f} ms ({v / best:.2f})" for k, v in meds.items())
        print(f"{name} x {rows} rows: {line}", flush=True)
