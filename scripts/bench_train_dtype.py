"""The speculator trainer's target pass in bf16 and fp32, one process: tokens/s of the
states the heads learn from (`train.TargetStates`, one row of `--tokens` tokens, the
median of `--repeats` after one warm-up), so `train.target_dtype` can be checked on the
machine at hand.

    .venv/bin/python scripts/bench_train_dtype.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdec.hub import resolve
from specdec.kernels.tuning import machine
from specdec.models.loading import load_transformer
from specdec.training.target import TargetStates, target_dtype


def tokens_per_s(model: str, dtype: str, tokens: int, repeats: int) -> float:
    target = load_transformer(resolve(model, dtype), dtype, torch.device("cpu"))
    states = TargetStates(target)
    ids = torch.randint(0, target.config.vocab_size, (1, tokens))
    times = []
    with torch.inference_mode():
        states(ids)
        for _ in range(repeats):
            started = time.perf_counter()
            states(ids)
            times.append(time.perf_counter() - started)
    return tokens / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    speed = {
        d: round(tokens_per_s(args.model, d, args.tokens, args.repeats), 1)
        for d in ("bf16", "fp32")
    }
    report = {
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "tokens_per_s": speed,
        "target_dtype": target_dtype("cpu"),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
