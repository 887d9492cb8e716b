"""The native decode stack against the eager layers, pass by pass: ms of a forward pass of
1, 2, 3, 5 and 9 new tokens at batch 1 after `--context` tokens (logits at every new
position, as a verify pass computes them), for the 1.5B target and the 0.5B draft in int4
(`--quant none`: bf16 weights, the bf16 stack). Stack and eager take turns within each
repeat, so machine load hits both alike; medians.

    .venv/bin/python scripts/bench_stack.py --out bench-out/stack-passes.json
    .venv/bin/python scripts/bench_stack.py --quant none --models qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from specdec.bench.costs import stacks_in_turn
from specdec.kernels.tuning import machine
from specdec.llm import LLM

MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,2,3,5,9")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quant", default="int4", choices=["int4", "none"])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    widths = tuple(int(r) for r in args.rows.split(","))
    report = {"machine": machine(), "threads": torch.get_num_threads(), "quant": args.quant}
    report["models"] = {}
    for name in args.models.split(","):
        model = LLM(name, quant=args.quant).engine.model
        if model.decode_stack is None:
            raise SystemExit(f"{name}: no native decode stack here (native build or AVX2 missing)")
        stacks = {"stack": model.decode_stack, "eager": None}
        runs = stacks_in_turn(model, stacks, widths, args.context, args.repeats)
        table = {
            way: {w: round(statistics.median(t), 1) for w, t in r.items()}
            for way, r in runs.items()
        }
        report["models"][name] = {"median_ms": table, "runs_ms": runs}
        print(name, json.dumps(table), flush=True)
        print(
            "  stack speed-up:",
            {w: round(table["eager"][w] / table["stack"][w], 2) for w in widths},
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
