"""The int4 decode stack of this checkout against the one of an earlier git revision, in one
process: passes of 1-9 new tokens at batch 1 after `--context` tokens (logits at every new
position, as a verify pass computes them), the two stacks taking turns within each repeat
so machine load hits both alike; medians, and v(k) = a pass of k + 1 tokens over a
one-token pass for each. What a change to `native/decode_stack.cpp` or `q4_kernel.h` buys,
measured where the whole pass (attention, norms, the eager lm_head) is around it.

    .venv/bin/python scripts/bench_stack_ab.py --rev HEAD~1 --out bench-out/stack-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from specdec.bench.costs import stacks_in_turn
from specdec.kernels.decode_stack import DecodeStack
from specdec.kernels.tuning import machine
from specdec.llm import LLM

NATIVE = "specdec/kernels/native"


def stack_class_at(rev: str, build: Path):
    """The `DecodeStack` class compiled from `rev`'s decode_stack.cpp and headers."""
    root = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
    names = subprocess.check_output(["git", "ls-tree", "--name-only", rev, f"{NATIVE}/"], text=True)
    for name in names.split():
        if name.endswith((".cpp", ".h")):
            text = subprocess.check_output(["git", "show", f"{rev}:{name}"], cwd=root, text=True)
            (build / Path(name).name).write_text(text)
    module = load(
        name="specdec_decode_stack_ab",
        sources=[str(build / "decode_stack.cpp")],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
    )
    return module.DecodeStack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rev", default="HEAD~1", help="the earlier revision")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,9")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    widths = tuple(int(r) for r in args.rows.split(","))
    model = LLM(args.model, quant="int4").engine.model
    if model.decode_stack is None:
        raise SystemExit("no int4 decode stack on this machine (native build or AVX2 missing)")
    with tempfile.TemporaryDirectory() as build:
        stacks = {"this": model.decode_stack}
        stacks[args.rev] = DecodeStack(model, stack_class_at(args.rev, Path(build)))
        runs = stacks_in_turn(model, stacks, widths, args.context, args.repeats)
    median = {way: {w: statistics.median(t) for w, t in r.items()} for way, r in runs.items()}
    report = {
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "rev": args.rev,
        "median_ms": {way: {w: round(t, 2) for w, t in m.items()} for way, m in median.items()},
        "v": {way: {w - 1: round(m[w] / m[1], 3) for w in widths} for way, m in median.items()}
        if 1 in widths
        else {},
        "runs_ms": runs,
    }
    for way, m in median.items():
        print(f"{way:>10}: " + "  ".join(f"{w}:{t:.1f}" for w, t in m.items()) + " ms", flush=True)
    ratios = (f"{w}:{median[args.rev][w] / median['this'][w]:.2f}" for w in widths)
    print("   ratio: " + "  ".join(ratios))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
