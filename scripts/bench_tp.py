"""Communication cost of tensor parallelism per decode step: collective time vs compute.

    torchrun --standalone --nproc-per-node 2 scripts/bench_tp.py --model qwen2.5-coder-0.5b-instruct
    python scripts/bench_tp.py --model qwen2.5-coder-0.5b-instruct      # tp = 1 baseline

Runs the native model directly (no engine): a prefill, then `--steps` greedy decode steps of
one token and `--steps` verify passes of `--verify` tokens, per batch of `--batch` rows.
Every collective of the sharded model (two all-reduces per layer, one all-gather of the
logits) is timed on each rank; compute is the rest of the step. On CPU (gloo) collectives
are synchronous, so the timing is exact; on CUDA each timed collective is bracketed by
synchronisations, which removes any overlap (step totals there are upper bounds).
A collective's time includes waiting for the slower rank (skew), so the table also shows
the same all-reduce in a tight loop with the ranks in step: the transfer itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from specdec.distributed import TPGroup, tensor_parallel
from specdec.hub import resolve
from specdec.models.loading import load_transformer


class Timed:
    """Accumulates seconds and calls of the group's collectives."""

    def __init__(self, group: TPGroup, cuda: bool) -> None:
        self.seconds = {"all_reduce": 0.0, "all_gather": 0.0}
        self.calls = {"all_reduce": 0, "all_gather": 0}
        self.on = False
        for name, method in (("all_reduce", "all_reduce"), ("all_gather", "all_gather_last")):
            setattr(group, method, self._wrap(name, getattr(group, method), cuda))

    def _wrap(self, name, fn, cuda):
        def timed(x):
            if not self.on:
                return fn(x)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(x)
            if cuda:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1
            return out

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)


def run(args, group: TPGroup | None) -> dict:
    device = torch.device(group.device if group else args.device)
    cuda = device.type == "cuda"
    model = load_transformer(resolve(args.model, args.dtype), args.dtype, device, tp=group)
    timer = Timed(group, cuda) if group else None
    B, T = args.batch, args.prompt_tokens
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 5000, (B, T), generator=gen).to(device)
    cache = model.new_cache(B, T + args.steps * (args.verify + 1) + 8)
    result = {"tp": group.world_size if group else 1, "batch": B}
    with torch.inference_mode():
        logits = model(prompt, cache, logits_at=torch.full((B, 1), T - 1)).logits
        for phase, tokens_per_row in (("decode", 1), ("verify", args.verify)):
            steps = []
            if timer:
                timer.reset()
            for i in range(args.warmup + args.steps):
                if timer:
                    timer.on = i >= args.warmup
                x = logits[:, -1].argmax(-1, keepdim=True).expand(B, tokens_per_row)
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                logits = model(x.contiguous(), cache).logits
                if cuda:
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    steps.append(time.perf_counter() - t0)
                if tokens_per_row > 1:  # a verify pass keeps one token, like a rejection
                    cache.truncate(cache.lengths[:B] - tokens_per_row + 1)
            row = {"step_ms": 1e3 * statistics.median(steps)}
            if timer:
                n = args.steps
                row["all_reduce_ms"] = 1e3 * timer.seconds["all_reduce"] / n
                row["all_gather_ms"] = 1e3 * timer.seconds["all_gather"] / n
                row["collectives_per_step"] = sum(timer.calls.values()) / n
                row["comm_share"] = (row["all_reduce_ms"] + row["all_gather_ms"]) / (
                    1e3 * sum(steps) / n
                )
            result[phase] = row
        if group:
            result["all_reduce_tight_us"] = tight_all_reduce(group, model, B, cuda)
    return result


def tight_all_reduce(group: TPGroup, model, rows: int, cuda: bool) -> float:
    """Median microseconds of one decode-sized all-reduce ([rows, 1, hidden]) in a loop."""
    x = torch.zeros(rows, 1, model.config.hidden_size, dtype=model.dtype, device=group.device)
    times = []
    for i in range(220):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--verify", type=int, default=9, help="tokens per verify pass (k + 1)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    args = p.parse_args()
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    with tensor_parallel(tp, args.device) as group:
        result = run(args, group)
        everyone = [None] * tp
        if group:
            dist.all_gather_object(everyone, result)
        else:
            everyone = [result]
        if group is None or group.is_leader:
            print(json.dumps({"model": args.model, "dtype": args.dtype, "ranks": everyone}))


if __name__ == "__main__":
    main()
