"""The GPU row's figures, CUDA graphs on vs off, in one run, with no network.

For randomly initialised models of the default pair's exact shapes (Qwen2.5-Coder-1.5B
target, 0.5B draft: the published config.json values below; random weights cost what real
ones do), it prints:

- plain decoding tokens/s (decode phase, prefill excluded) at batch 1, 8 and 32;
- the verify-cost curve v(k) = a pass of k+1 tokens over a 1-token pass, k = 0..8, batch 1;
- the draft step cost c = one 0.5B-shape token over one 1.5B-shape token;
- the default pair's predicted speedup on code: `specdec.window` with these costs
  and the acceptance by position measured on the CPU (code prompts);
- the HBM bandwidth bound: weight bytes per decode token / measured device-to-device
  copy bandwidth (bytes read + written per second), and plain batch 1 as a share of it;
- transformers `generate` on the same shapes and weights with its static cache and
  `torch.compile` (its auto-compile, mode "reduce-overhead"), decode tokens/s at batch 1;
- the GPU bars, met or not (graphs on).

    python scripts/bench_gpu.py --out bench-out/gpu.json      # an H100: minutes
    python scripts/bench_gpu.py --device cpu --quick          # tiny shapes: a smoke test

The costs are the forward passes alone (no sampling or acceptor work), as bench_base's
v(k); `--speculate auto` times whole steps, which the engine's own figures show.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from specdec.bench.costs import forward_seconds
from specdec.doctor import decode_bytes
from specdec.engine import Engine
from specdec.kernels.cpu import cpu_info
from specdec.models.config import ModelConfig
from specdec.models.loading import build_transformer
from specdec.params import SamplingParams
from specdec.window import CostModel, conditional_acceptance, predict_speedup

_QWEN = {
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
TARGET = _QWEN | {  # Qwen2.5-Coder-1.5B(-Instruct) config.json
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
}
DRAFT = _QWEN | {  # Qwen2.5-Coder-0.5B(-Instruct) config.json
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
_TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 97,
    "max_position_embeddings": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
QUICK_TARGET = _TINY | {"num_hidden_layers": 2}
QUICK_DRAFT = _TINY | {"num_hidden_layers": 1}

# The default pair on the bench's code prompts (a CPU run; docs/benchmarks.md):
# the fraction of drafts whose i-th token was kept, draft k = 8 (measured on the CPU).
CODE_ACCEPTANCE = (0.96, 0.90, 0.83, 0.79, 0.76, 0.73, 0.70, 0.68)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def pair_shapes(quick: bool) -> tuple[dict, dict]:
    """The (target, draft) configs: the default pair's, or tiny ones for a smoke test."""
    return (QUICK_TARGET, QUICK_DRAFT) if quick else (TARGET, DRAFT)


class _NoText:
    """The engine decodes text only for stop strings and completions: none needed here."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def random_pair(config: dict, dtype: torch.dtype, device: torch.device, seed: int):
    """A randomly initialised transformers model of `config` and the native model with
    the same weights: (hf, native)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device(device):
        hf = transformers.Qwen2ForCausalLM(cfg).to(dtype).eval()
    native = build_transformer(ModelConfig.from_hf_dict(config), hf.state_dict(), dtype, device)
    return hf, native


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth_gbs(device: torch.device, mib: int, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (as CUDA's
    bandwidthTest counts it): the fastest of `repeats` copies of `mib` MiB."""
    src = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # one warm-up
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best / 1e9


def _prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def plain_tokens_per_s(model, batch: int, args, graphs: bool) -> tuple:
    """Greedy plain decoding of `--new-tokens` per row at `batch` rows: decode-phase
    tokens/s (the engine's prefill time taken out), the best of `--repeats` after a
    warm-up run (which captures the graphs of every bucket the run meets); and the layer
    stack each captured bucket chose ({} without graphs)."""
    engine = Engine(
        model,
        _NoText(),
        frozenset(),
        max_batch=batch,
        static_passes=graphs,
        cuda_graphs=graphs,
    )
    prompts = _prompts(batch, args.prompt_len, model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    rates = []
    for i in range(1 + args.repeats):
        prefill, t0 = engine.prefill_s, time.perf_counter()
        engine.generate(prompts, params)
        decode_s = time.perf_counter() - t0 - (engine.prefill_s - prefill)
        if i:
            rates.append(batch * (args.new_tokens - 1) / decode_s)  # token 1: the prefill's
    stacks = getattr(engine._target, "stacks", {})
    raced = getattr(engine._target, "race_ms", {})
    if raced:
        print(f"  batch {batch}: race of the layer stacks, ms a replay: {raced}", flush=True)
    return max(rates), sorted({f"{b.rows}x{b.tokens}: {name}" for b, name in stacks.items()})


def pass_costs(target, draft, args, graphs: bool) -> dict:
    """Seconds of target passes of 1..9 tokens and of a draft step, batch 1, after
    `--context` tokens, on wall time; v(k) and c from them."""
    opts = {"static_passes": graphs, "cuda_graphs": graphs, "clock": time.perf_counter}
    widths = tuple(range(1, 10))
    verify = forward_seconds(target, 1, widths, args.context, args.repeats, **opts)
    draft_s = forward_seconds(draft, 1, (1,), args.context, args.repeats, **opts)[1]
    plain = verify[1]
    return {
        "target_step_ms": round(plain * 1e3, 3),
        "draft_step_ms": round(draft_s * 1e3, 3),
        "c": round(draft_s / plain, 4),
        "v": {k: round(verify[k + 1] / plain, 4) for k in range(9)},
        "verify_s": {k: verify[k + 1] for k in range(9)},
        "draft_s": draft_s,
    }


def predicted_speedups(costs: dict) -> dict:
    """The default pair's predicted speedup on code at each k and the best k, from the
    measured pass costs and CODE_ACCEPTANCE (`specdec.window`, as `auto` plans)."""
    model = CostModel.measured(1, costs["verify_s"], costs["draft_s"])
    alpha = conditional_acceptance(list(CODE_ACCEPTANCE))
    by_k = {k: round(predict_speedup(model, 1, alpha, k) or 0.0, 3) for k in range(1, 9)}
    k, best = model.best_window(1, alpha, 8)
    return {"by_k": by_k, "best_k": k, "best": round(best, 3)}


def hf_tokens_per_s(hf, batch: int, args, compile_: bool) -> float:
    """transformers `generate`, greedy, static cache, compiled (its auto-compile of the
    decoding forward, mode "reduce-overhead") when `compile_`: decode tokens/s from the
    difference of a full and a 1-token generation (prefill excluded), best of repeats."""
    from transformers import CompileConfig

    device = hf.device
    ids = torch.tensor(_prompts(batch, args.prompt_len, hf.config.vocab_size), device=device)
    kwargs = {
        "do_sample": False,
        "cache_implementation": "static",
        "pad_token_id": 0,
        "eos_token_id": None,
    }
    if compile_:
        kwargs["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")
    else:
        kwargs["disable_compile"] = True

    def seconds(new: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
        sync(device)
        return time.perf_counter() - t0

    seconds(args.new_tokens)  # compile / warm up
    rates = []
    for _ in range(args.repeats):
        full, one = seconds(args.new_tokens), seconds(1)
        rates.append(batch * (args.new_tokens - 1) / max(full - one, 1e-9))
    return max(rates)


def bars(result: dict) -> dict:
    """The GPU bars, graphs on: True/False per bar (None: not measured)."""
    on = result["graphs_on"]
    hf = result["transformers"].get("batch_1")
    return {
        "plain b1 >= 40% of bound": on["plain_tok_s"]["1"] >= 0.4 * result["bound_tok_s"],
        "plain b1 >= 1.5x transformers compiled": None
        if hf is None
        else on["plain_tok_s"]["1"] >= 1.5 * hf,
        "v(8) <= 1.15": on["costs"]["v"][8] <= 1.15,
        "c <= 0.35": on["costs"]["c"] <= 0.35,
        "predicted speedup >= 2.5x": on["predicted"]["best"] >= 2.5,
    }


# The modes measured: (result key, CUDA graphs, the models' `layer_stack`). "graphs_on"
# is what the engine runs by default (the faster of the model's layers and the fused ones,
# raced at the first capture); "graphs_on_eager_layers" is graphs with the model's own
# layers only (the engine before the compiled layer stack).
MODES = (
    ("graphs_on", True, None),
    ("graphs_on_eager_layers", True, "eager"),
    ("graphs_off", False, "eager"),
)


def measure(target, draft, hf, args, device) -> dict:
    result: dict = {}
    modes = MODES if device.type == "cuda" else MODES[2:]  # graphs exist on CUDA only
    modes = [mode for mode in modes if mode[0] in args.modes or not args.modes]
    if args.static_on_cpu and device.type != "cuda":
        modes = (("graphs_on", True, "eager"), *MODES[2:])  # static buffers, run eagerly
    for key, graphs, stack in modes:
        target.layer_stack = draft.layer_stack = stack
        plain, stacks = {}, {}
        for b in args.batches:
            rate, stacks[str(b)] = plain_tokens_per_s(target, b, args, graphs)
            plain[str(b)] = round(rate, 2)
        print(f"[{key}] plain tok/s by batch: {plain}", flush=True)
        if any(stacks.values()):
            print(f"[{key}] layer stack per captured bucket: {stacks}", flush=True)
        costs = pass_costs(target, draft, args, graphs)
        print(
            f"[{key}] target step {costs['target_step_ms']} ms, draft step "
            f"{costs['draft_step_ms']} ms, c = {costs['c']}, v(k) = {costs['v']}",
            flush=True,
        )
        predicted = predicted_speedups(costs)
        print(f"[{key}] predicted speedup on code: {predicted}", flush=True)
        costs = {k: v for k, v in costs.items() if k not in ("verify_s", "draft_s")}
        result[key] = {
            "plain_tok_s": plain,
            "costs": costs,
            "predicted": predicted,
            "stacks": stacks,
        }
    if "graphs_on" not in result and "graphs_off" in result:  # on the CPU: the same path
        result["graphs_on"] = result["graphs_off"]
    hf_rates = {}
    if not args.no_transformers:
        compile_ = device.type == "cuda" and not args.no_compile
        rate = hf_tokens_per_s(hf, 1, args, compile_)
        hf_rates = {"batch_1": round(rate, 2), "compiled": compile_}
        print(f"transformers generate, static cache, compiled={compile_}: {rate:.2f} tok/s")
    result["transformers"] = hf_rates
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few tokens: a smoke test")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=256, help="committed tokens for v(k), c")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--copy-mib", type=int, default=1024, help="buffer of the bandwidth probe")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers peer")
    ap.add_argument("--no-compile", action="store_true", help="transformers without compile")
    ap.add_argument(
        "--static-on-cpu", action="store_true", help="on the CPU, also run the static passes"
    )
    ap.add_argument(
        "--modes", default="", help=f"comma-separated, of {', '.join(m[0] for m in MODES)}: all"
    )
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.prompt_len, args.new_tokens = "1,2", 8, 6
        args.context, args.repeats, args.copy_mib = 16, 1, 16
    args.batches = [int(b) for b in args.batches.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda":  # fp32 means fp32 (TF32 would round the matmul inputs)
        torch.backends.cuda.matmul.allow_tf32 = False
    shapes = pair_shapes(args.quick)
    hf, target = random_pair(shapes[0], dtype, device, seed=0)
    _, draft = random_pair(shapes[1], dtype, device, seed=1)

    bandwidth = copy_bandwidth_gbs(device, args.copy_mib)
    weight_bytes = decode_bytes(target.config, dtype.itemsize)
    bound = bandwidth * 1e9 / weight_bytes
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_info()[0]
    print(
        f"{machine}, torch {torch.__version__}, {args.dtype}: copy bandwidth {bandwidth:.0f} "
        f"GB/s, {weight_bytes / 1e9:.3f} GB of weights per token: bound {bound:.1f} tok/s",
        flush=True,
    )
    result = {
        "machine": machine,
        "host": platform.node(),
        "torch": torch.__version__,
        "device": str(device),
        "dtype": args.dtype,
        "shapes": "quick" if args.quick else "qwen2.5-coder-1.5b + 0.5b",
        "copy_bandwidth_gbs": round(bandwidth, 1),
        "weight_bytes_per_token": weight_bytes,
        "bound_tok_s": round(bound, 2),
        "code_acceptance_by_position": CODE_ACCEPTANCE,
    } | measure(target, draft, hf, args, device)
    b1 = result["graphs_on"]["plain_tok_s"].get("1")
    if b1 is not None:
        result["plain_b1_share_of_bound"] = round(b1 / bound, 4)
        print(f"plain batch 1: {b1} tok/s = {b1 / bound:.1%} of the bandwidth bound")
        result["bars"] = bars(result)
        print("GPU bars (graphs on):", json.dumps(result["bars"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
