"""GPU figures in one device call: speculation with an eagle head, timed.

Randomly initialised weights of the default target's shape (Qwen2.5-Coder-1.5B, as
scripts/bench_gpu.py builds them) and an eagle head of its shape (`build_eagle`, a
16,384-id draft vocabulary as the trained heads use; its values do not change its cost).
A random head drafts nothing a random target keeps, so the timed runs draft with
`specdec.bench.timing_drafter.AcceptanceControlledDrafter`: the target's own greedy
continuation, recorded from the plain run of the same prompts at the same batch size,
kept per position with a chosen conditional probability, while the head's passes run
for their time (static passes, CUDA graphs on a GPU). The engine's draft, verify, accept
and roll back are the real ones. Printed, and written to one JSON file (`--out`):

- the copy-bandwidth bound and plain decoding tok/s at batch 1 / 8 / 32 (graphs on),
  batch 1 as a share of the bound;
- the head's draft step cost c: its first draft token (the feed of a verify pass's
  2 kept entries and one token) and each later one, over a target step, per batch size,
  static passes and eager;
- a verify of a 16-node tree over a 1-token pass (batch 1), beside the chain curve v(k);
- timed speculative speedup over plain at each batch size and acceptance profile
  (`timing_drafter.PROFILES`: the trained head's, measured on the CPU, and fixed alphas
  0.6 / 0.8), with the window the cost model picks (`fixed`) and with `auto`, beside the
  cost model's prediction from the profile and from the acceptance the run realised
  (and `off_record`: rows whose run left the record, which makes later drafts wrong);
- the bars, met or not.

    python scripts/gpu_speculation.py --out bench-out/gpu-spec.json   # an H200: minutes
    python scripts/gpu_speculation.py --device cpu --quick            # tiny shapes: seconds
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench_gpu: the shapes, random weights

import bench_gpu  # noqa: E402

from specdec.bench.costs import forward_seconds  # noqa: E402
from specdec.bench.timing_drafter import (  # noqa: E402
    PROFILES,
    AcceptanceControlledDrafter,
    realised_acceptance,
    records_from,
)
from specdec.doctor import decode_bytes  # noqa: E402
from specdec.drafters.base import PassStates  # noqa: E402
from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.graphs.static_pass import StaticPasses, capture_seconds  # noqa: E402
from specdec.heads.eagle import build_eagle  # noqa: E402
from specdec.kernels.cpu import cpu_info  # noqa: E402
from specdec.params import SamplingParams  # noqa: E402
from specdec.window import (  # noqa: E402
    AdaptiveWindow,
    CostModel,
    FixedWindow,
    expected_tokens,
    predict_speedup,
)

WARMUP = 2  # untimed calls before each timing


def random_head(target, draft_vocab: int, n_predict: int, dtype, device):
    """An eagle head of the target's shape in its drafting form (q, k, v fused, the
    vocabulary rows as a layer), weights perturbed from `build_eagle`'s start."""
    vocab_map = torch.arange(min(draft_vocab, target.config.vocab_size))
    head = build_eagle(target, vocab_map=vocab_map, n_predict=n_predict)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return head.to(device=device, dtype=dtype).for_drafting()


def sync(device) -> None:
    bench_gpu.sync(torch.device(device))


def timed_generate(engine: Engine, prompts, params, repeats: int):
    """Decode-phase tokens/s of `engine.generate` (prefill and graph captures taken
    out): each timed run's rate after one untimed warm-up run (captures every bucket it
    meets); the completions of the last run and the step traces of every timed run."""
    device = engine.model.device
    rates, traces, completions = [], [], None
    for i in range(1 + repeats):
        sync(device)
        prefill, captured, t0 = engine.prefill_s, capture_seconds(), time.perf_counter()
        steps, seqs = engine.generate_steps(prompts, params), []
        try:
            while True:
                next(steps)
                if not seqs:  # every request is admitted at the first step
                    seqs = list(engine.live)
        except StopIteration as done:
            completions = done.value
        sync(device)
        wall = time.perf_counter() - t0
        decode_s = wall - (engine.prefill_s - prefill) - (capture_seconds() - captured)
        if i:
            rates.append(len(prompts) * (params.max_tokens - 1) / decode_s)
            traces += [s.trace for s in seqs]
    return rates, completions, traces


def head_seconds(head, rows: int, context: int, ns: tuple[int, ...], repeats: int, static: bool):
    """{n: seconds of an `EagleDrafter` step drafting n tokens per row}, the fastest of
    `repeats`: each step feeds the 2 entries a verify pass that kept one draft hands over
    (as in the engine), after `context` true entries per row."""
    device, dtype = head.fc.weight.device, head.fc.weight.dtype
    calls = (WARMUP + repeats) * len(ns)
    drafter = EagleDrafter(
        head, rows, context + 2 * calls + max(ns) + 4, static_passes=static, cuda_graphs=static
    )
    E = head.config.hidden_size
    g = torch.Generator().manual_seed(0)

    def states(n: int) -> PassStates:
        hidden = torch.randn(rows, n, E, generator=g).to(device, dtype)
        tokens = torch.randint(0, head.config.vocab_size, (rows, n), generator=g).to(device)
        return PassStates(tokens, hidden, torch.full((rows,), n, device=device))

    drafter.admit([[1] * (context + 1)] * rows)
    drafter.observe_pass(states(context))
    drafter.propose(1, None, None)  # the prompt's catch-up (eager)
    one, two = torch.ones(rows, dtype=torch.long), torch.full((rows,), 2, dtype=torch.long)
    drafter.commit(one - 1, two)
    times: dict[int, list[float]] = {n: [] for n in ns}
    kept = states(2)
    for i in range(WARMUP + repeats):
        for n in ns:
            drafter.observe_pass(kept)
            sync(device)
            t0 = time.perf_counter()
            drafter.propose(n, None, None)  # (its tokens come to the host: the sync)
            if i >= WARMUP:
                times[n].append(time.perf_counter() - t0)
            drafter.commit(one, two)
    return {n: min(ts) for n, ts in times.items()}


def tree_nodes(nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets [1, 1+N], visible [1, 1+N, 1+N]) of a root and N nodes, each node's
    parent (i - 1) // 2: a binary tree of depth log2 N (the mask's shape, not its values,
    costs; the engine's trees are as wide)."""
    parent = [-1] + [(i - 1) // 2 for i in range(1, nodes + 1)]
    depth = [0] * (nodes + 1)
    visible = torch.zeros(nodes + 1, nodes + 1, dtype=torch.bool)
    for i in range(nodes + 1):
        j = i
        while j >= 0:
            visible[i, j] = True
            j = parent[j]
        depth[i] = 0 if i == 0 else depth[parent[i]] + 1
    return torch.tensor([depth]), visible[None]


def tree_verify_seconds(model, context: int, nodes: int, repeats: int, static: bool, graphs: bool):
    """(1-token pass, tree verify of `nodes` nodes and its root), seconds at batch 1
    after `context` committed tokens, the fastest of `repeats`, in turns."""
    cache = model.new_cache(1, context + nodes + 2)
    forward = StaticPasses(model, cache, 1, nodes + 1, graphs=graphs) if static else model
    cache.advance(torch.tensor([context]), slice(0, 1))
    start = cache.lengths[:1].clone()
    tree = tree_nodes(nodes)
    vocab = min(1000, model.config.vocab_size)
    times: dict[str, list[float]] = {"1": [], "tree": []}
    with torch.inference_mode():
        for i in range(WARMUP + repeats):
            for name, width in (("1", 1), ("tree", nodes + 1)):
                tokens = torch.randint(0, vocab, (1, width)).to(model.device)
                sync(model.device)
                t0 = time.perf_counter()
                out = forward(tokens, cache, tree=tree if width > 1 else None)
                out.logits[:, -1, 0].tolist()
                if i >= WARMUP:
                    times[name].append(time.perf_counter() - t0)
                cache.truncate(start)
    return min(times["1"]), min(times["tree"])


def alphas(profile: tuple[float, ...], k_max: int) -> list[float]:
    return [profile[min(i, len(profile) - 1)] for i in range(k_max)]


def cost_model(rows: int, verify: dict[int, float], head: dict[int, float]) -> CostModel:
    """Measured costs at `rows`: verify seconds by width, the head's first draft token
    and each later one."""
    n = max(head)
    later = (head[n] - head[1]) / (n - 1) if n > 1 else head[1]
    costs = CostModel.measured(rows, {w - 1: s for w, s in verify.items()}, later)
    costs.draft_first_s[rows] = head[1]
    return costs


def speculate(target, head, batch, prompts, params, records, costs, args, plain_rate) -> dict:
    """Timed runs of each profile, with the window the cost model picks and with
    `auto`, in one engine (the drafter and its graphs kept; its profile and window set
    before each): figures by profile, then mode."""
    static = args.static
    made: list[AcceptanceControlledDrafter] = []

    def factory(rows: int, length: int) -> AcceptanceControlledDrafter:
        cost = EagleDrafter(head, rows, length, static_passes=static, cuda_graphs=static)
        made.append(AcceptanceControlledDrafter(records, (1.0,), target.config.vocab_size, cost))
        return made[-1]

    engine = Engine(
        target,
        bench_gpu._NoText(),
        frozenset(),
        max_batch=batch,
        drafter_factory=factory,
        window=FixedWindow(args.k_max),
        static_passes=static,
        cuda_graphs=static,
    )
    out = {}
    for name in args.profiles:
        profile = PROFILES[name]
        alpha = alphas(profile, args.k_max)
        best_k, best = costs.best_window(batch, alpha, args.k_max)
        out[name] = {"best_k": best_k, "predicted_best": round(best, 3)}
        for mode in args.modes:
            k = max(best_k, 1)
            engine.window = FixedWindow(k) if mode == "fixed" else AdaptiveWindow(k_max=args.k_max)
            for drafter in made:
                drafter.profile = profile
            off = sum(d.off_record for d in made)
            rates, _, traces = timed_generate(engine, prompts, params, args.repeats)
            reached, kept = realised_acceptance(traces)
            realised = [x / n if n else 0.0 for x, n in zip(kept, reached, strict=True)]
            rate = statistics.median(rates)
            figures = {
                "tok_s": round(rate, 2),
                "timed_speedup": round(rate / plain_rate, 3),
                "realised_alpha": [round(a, 3) for a in realised],
                "reached": reached,
                "off_record": sum(d.off_record for d in made) - off,
                "tokens_per_step": round(
                    sum(e for t in traces for *_, e in t) / max(1, sum(len(t) for t in traces)), 3
                ),
            }
            if mode == "fixed":
                real = alphas(tuple(realised) or (0.0,), args.k_max)
                figures |= {
                    "k": k,
                    "predicted": round(predict_speedup(costs, batch, alpha, k) or 0.0, 3),
                    "predicted_realised": round(predict_speedup(costs, batch, real, k) or 0.0, 3),
                }
            print(
                f"  batch {batch}, {name}, {mode}: {figures['tok_s']} tok/s = "
                f"{figures['timed_speedup']}x plain; predicted {figures.get('predicted')} "
                f"(realised acceptance: {figures.get('predicted_realised')}), realised alpha "
                f"{figures['realised_alpha']}, off record {figures['off_record']}",
                flush=True,
            )
            out[name][mode] = figures
    return out


def bars(result: dict) -> dict:
    """The bars, met or not (None: not measured in this run)."""
    by_batch = result["by_batch"]

    def timed(batch: str, mode: str, profile: str = "eagle-chat"):
        return by_batch.get(batch, {}).get("speculation", {}).get(profile, {}).get(mode, {})

    def at_least(figures: dict, bar: float):
        return None if not figures else figures["timed_speedup"] >= bar

    b1 = by_batch.get("1", {})
    auto_32 = [
        figures["auto"]["timed_speedup"]
        for figures in by_batch.get("32", {}).get("speculation", {}).values()
        if "auto" in figures
    ]
    close = [
        abs(f["predicted_realised"] / f["timed_speedup"] - 1) <= 0.10
        for batch in by_batch.values()
        for profile in batch.get("speculation", {}).values()
        for f in [profile.get("fixed")]
        if f
    ]
    return {
        "plain b1 >= 40% of bound": result.get("plain_b1_share_of_bound", 0) >= 0.40,
        "head c <= 0.10 (b1, first and later draft tokens)": None
        if not b1
        else max(b1["head"]["c_first"], b1["head"]["c_later"]) <= 0.10,
        "16-node tree verify <= 1.2x a 1-token pass": result["tree_verify"]["ratio"] <= 1.2,
        "timed b1 >= 1.8x (eagle-chat, fixed)": at_least(timed("1", "fixed"), 1.8),
        "timed b1 >= 1.8x (eagle-chat, auto)": at_least(timed("1", "auto"), 1.8),
        "timed b8 >= 1.3x (eagle-chat, fixed)": at_least(timed("8", "fixed"), 1.3),
        "timed b8 >= 1.3x (eagle-chat, auto)": at_least(timed("8", "auto"), 1.3),
        "auto b32 >= 0.97x plain (every profile)": min(auto_32) >= 0.97 if auto_32 else None,
        "prediction within 10% of timed (every fixed point)": all(close) if close else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=list(bench_gpu.DTYPES))
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few tokens: a smoke test")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=256, help="committed tokens for the costs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k-max", type=int, default=5, help="the head's longest chain")
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--tree-nodes", type=int, default=16)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--modes", default="fixed,auto")
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument(
        "--no-static", action="store_true", help="eager passes (no CUDA graphs), target and head"
    )
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.prompt_len, args.new_tokens = "1,2", 8, 10
        args.context, args.repeats, args.copy_mib, args.tree_nodes = 16, 1, 16, 6
    args.batches = [int(b) for b in args.batches.split(",")]
    args.profiles = [p for p in args.profiles.split(",") if p]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [p for p in args.profiles if p not in PROFILES] + [
        m for m in args.modes if m not in ("fixed", "auto")
    ]
    if unknown:
        ap.error(f"unknown profiles or modes: {unknown} (profiles: {', '.join(PROFILES)})")
    device, dtype = torch.device(args.device), bench_gpu.DTYPES[args.dtype]
    # Static passes everywhere (eagerly over their buffers on the CPU: the code a GPU
    # captures), CUDA graphs where there is CUDA.
    args.static = not args.no_static
    graphs = args.static and device.type == "cuda"
    if device.type == "cuda":  # fp32 means fp32 (TF32 would round the matmul inputs)
        torch.backends.cuda.matmul.allow_tf32 = False
    started = time.perf_counter()
    shape = bench_gpu.pair_shapes(args.quick)[0]
    hf, target = bench_gpu.random_pair(shape, dtype, device, seed=0)
    del hf
    head = random_head(target, args.draft_vocab, args.k_max, dtype, device)

    bandwidth = bench_gpu.copy_bandwidth_gbs(device, args.copy_mib)
    weight_bytes = decode_bytes(target.config, dtype.itemsize)
    bound = bandwidth * 1e9 / weight_bytes
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_info()[0]
    print(
        f"{machine}, torch {torch.__version__}, {args.dtype}: copy bandwidth {bandwidth:.0f} "
        f"GB/s, {weight_bytes / 1e9:.3f} GB of weights per token: bound {bound:.1f} tok/s; "
        f"static passes {args.static}, CUDA graphs {graphs}",
        flush=True,
    )
    result: dict = {
        "machine": machine,
        "host": platform.node(),
        "torch": torch.__version__,
        "device": str(device),
        "dtype": args.dtype,
        "shapes": "quick" if args.quick else "qwen2.5-coder-1.5b + eagle head",
        "static_passes": args.static,
        "cuda_graphs": graphs,
        "copy_bandwidth_gbs": round(bandwidth, 1),
        "weight_bytes_per_token": weight_bytes,
        "bound_tok_s": round(bound, 2),
        "profiles": {name: PROFILES[name] for name in args.profiles},
        "k_max": args.k_max,
        "draft_vocab": len(head.vocab_map),
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "by_batch": {},
    }
    one, tree = tree_verify_seconds(
        target, args.context, args.tree_nodes, args.repeats + 2, args.static, graphs
    )
    result["tree_verify"] = {
        "nodes": args.tree_nodes,
        "one_token_ms": round(one * 1e3, 4),
        "tree_ms": round(tree * 1e3, 4),
        "ratio": round(tree / one, 4),
    }
    print(f"tree verify, {args.tree_nodes} nodes: {tree / one:.3f}x a 1-token pass", flush=True)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    widths = tuple(range(1, args.k_max + 2))
    for batch in args.batches:
        prompts = bench_gpu._prompts(batch, args.prompt_len, target.config.vocab_size)
        plain = Engine(
            target,
            bench_gpu._NoText(),
            frozenset(),
            max_batch=batch,
            static_passes=args.static,
            cuda_graphs=args.static,
        )
        rates, completions, _ = timed_generate(plain, prompts, params, args.repeats)
        plain_rate = statistics.median(rates)
        del plain
        records = records_from(prompts, [c.token_ids for c in completions])
        verify = forward_seconds(
            target, batch, widths, args.context, args.repeats + 2,
            static_passes=args.static, cuda_graphs=args.static, clock=time.perf_counter,
        )  # fmt: skip
        ns = (1, args.k_max)
        head_static = head_seconds(head, batch, args.context, ns, args.repeats + 2, args.static)
        head_eager = head_seconds(head, batch, args.context, ns, args.repeats + 2, False)
        step = verify[1]
        costs = cost_model(batch, verify, head_static)
        later = costs.draft_step_s[batch]
        figures = {
            "plain_tok_s": round(plain_rate, 2),
            "target_step_ms": round(step * 1e3, 4),
            "v": {w - 1: round(s / step, 4) for w, s in verify.items()},
            "head": {
                "first_ms": round(head_static[1] * 1e3, 4),
                "later_ms": round(later * 1e3, 4),
                "c_first": round(head_static[1] / step, 4),
                "c_later": round(later / step, 4),
                "eager_first_ms": round(head_eager[1] * 1e3, 4),
                "eager_c_first": round(head_eager[1] / step, 4),
            },
        }
        print(
            f"batch {batch}: plain {plain_rate:.2f} tok/s, target step {step * 1e3:.3f} ms, "
            f"v(k) {figures['v']}, head c {figures['head']['c_first']} first / "
            f"{figures['head']['c_later']} later (eager {figures['head']['eager_c_first']})",
            flush=True,
        )
        figures["speculation"] = speculate(
            target, head, batch, prompts, params, records, costs, args, plain_rate
        )
        figures["expected_tokens_at_k_max"] = {
            name: round(expected_tokens(alphas(PROFILES[name], args.k_max), args.k_max), 3)
            for name in args.profiles
        }
        result["by_batch"][str(batch)] = figures
        save(result, args.out)  # a call that runs out of time keeps the batches done
    b1 = result["by_batch"].get("1")
    if b1 is not None:
        result["plain_b1_share_of_bound"] = round(b1["plain_tok_s"] / bound, 4)
        print(
            f"plain batch 1: {b1['plain_tok_s']} tok/s = {b1['plain_tok_s'] / bound:.1%} of bound"
        )
    result["bars"] = bars(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print("bars:", json.dumps(result["bars"]), f"({result['seconds']} s)", flush=True)
    save(result, args.out)
    return result


def save(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
