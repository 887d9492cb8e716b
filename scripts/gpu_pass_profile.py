"""Kernels per pass: how many a target and a draft pass launch, and how long they run on
the GPU, with the model's own layers and with the fused ones (`specdec.graphs.fused_layers`).

A replayed CUDA graph costs what its kernels cost, so the count and the GPU time of one
pass say where a graph-replayed step goes. For random weights of the default pair's shapes
(bf16, batch 1, `--context` cached tokens) it profiles one static pass of 1 and of 9 tokens
run eagerly (the same kernels a graph replays) and prints the count, the summed kernel time
and the kernels that take the most time; then, for the target, where a plain decoding
step of the engine spends its host time (the operators with the most CPU self time).

    python scripts/gpu_pass_profile.py --out bench-out/gpu_profile.json   # a GPU
    python scripts/gpu_pass_profile.py --device cpu --quick               # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.graphs.static_pass import StaticPasses

sys.path.insert(0, str(Path(__file__).parent))  # scripts/ is no package: its siblings
from bench_gpu import pair_shapes, random_pair  # noqa: E402


def profile_pass(model, tokens_per_row: int, context: int, fuse: bool, top: int) -> dict:
    """One static pass of `tokens_per_row` tokens at batch 1 after `context` positions,
    profiled after warm-up runs: {kernels, device_us, top: [(name, count, us)]}."""
    device = model.device
    cache = model.new_cache(1, context + tokens_per_row + 1)
    cache.advance(torch.tensor([context]), slice(0, 1))
    start = cache.lengths[:1].clone()
    passes = StaticPasses(model, cache, 1, tokens_per_row, graphs=False, fuse=fuse)
    tokens = torch.randint(0, min(1000, model.config.vocab_size), (1, tokens_per_row))
    tokens = tokens.to(device)
    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    with torch.inference_mode():
        for _ in range(3):  # compiles (fused) and warms up
            passes(tokens, cache)
            cache.truncate(start)
        if on_cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            passes(tokens, cache)
            if on_cuda:
                torch.cuda.synchronize()
        cache.truncate(start)
    kind = torch.autograd.DeviceType.CUDA if on_cuda else torch.autograd.DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == kind]
    if not on_cuda:  # on the CPU: the top-level operators stand in for kernels
        events = [e for e in events if e.key.startswith("aten::")]

    def us(event) -> float:
        return event.self_device_time_total if on_cuda else event.self_cpu_time_total

    ranked = sorted(events, key=us, reverse=True)
    return {
        "kernels": sum(e.count for e in events),
        "device_us": round(sum(us(e) for e in events), 1),
        "top": [(e.key[:90], e.count, round(us(e), 1)) for e in ranked[:top]],
    }


def profile_engine(model, tokens: int, top: int) -> dict:
    """Where a plain decoding step's host time goes: an engine (its defaults: graphs on a
    GPU) decoding `tokens` greedy tokens at batch 1 after a warm-up run, profiled on the
    host (CPU activity): wall ms per token and the operators with the most self time."""
    from specdec.engine import Engine
    from specdec.params import SamplingParams

    class NoText:
        def decode(self, ids, skip_special_tokens: bool = False) -> str:
            return ""

    engine = Engine(model, NoText(), frozenset(), max_batch=1)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
    engine.generate(prompt, params)  # captures
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill, t0 = engine.prefill_s, time.perf_counter()
        engine.generate(prompt, params)
        decode_s = time.perf_counter() - t0 - (engine.prefill_s - prefill)
    ranked = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    steps = tokens - 1
    return {
        "ms_per_token": round(decode_s / steps * 1e3, 3),
        "top_us_per_token": [
            (e.key[:90], round(e.count / steps, 2), round(e.self_cpu_time_total / steps, 1))
            for e in ranked[:top]
        ],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--engine-tokens", type=int, default=64, help="host profile: 0 skips it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shapes = pair_shapes(args.quick)
    context = 16 if args.quick else args.context
    result: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    for name, cfg, seed in (("target", shapes[0], 0), ("draft", shapes[1], 1)):
        _, model = random_pair(cfg, torch.bfloat16, device, seed)
        for fuse in (False, True):
            for tokens in (1, 9):
                key = f"{name} {'fused' if fuse else 'model'} layers, {tokens} token(s)"
                result[key] = profile_pass(model, tokens, context, fuse, args.top)
                figures = {k: v for k, v in result[key].items() if k != "top"}
                print(key, figures, flush=True)
                for row in result[key]["top"]:
                    print("   ", row, flush=True)
        if name == "target" and args.engine_tokens:
            key = "target engine, plain decoding, host"
            result[key] = profile_engine(model, args.engine_tokens, args.top)
            print(key, result[key]["ms_per_token"], "ms a token; per token:", flush=True)
            for row in result[key]["top_us_per_token"]:
                print("   ", row, flush=True)
        del model
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
