"""`specdec` command line: generate, models list|pull."""

from __future__ import annotations

import argparse
import json
import sys
import time

from specdec.errors import SpecdecError


def _generate_args(sub) -> None:
    p = sub.add_parser("generate", help="generate text from prompts")
    p.add_argument("--model", required=True, help="registry name, HF directory or .gguf file")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at EOS (benchmarks)")
    p.add_argument("--max-batch", type=int, default=8, help="prompts decoded together")
    p.add_argument("--draft", default=None, help="draft model (name/path) or 'ngram'")
    p.add_argument(
        "--speculate",
        default=None,
        help="tokens drafted per step, or 'auto' (default with --draft)",
    )
    p.add_argument("--k-max", type=int, default=8, help="largest window 'auto' may choose")
    p.add_argument(
        "--draft-quant",
        default=None,
        choices=["int4", "none"],
        help="draft model weights in 4 bits (default on CPU; lossless: only q changes)",
    )
    p.add_argument(
        "--acceptor",
        default="rejection",
        help="rejection (lossless) | greedy | typical (lossy) | module:Class",
    )
    p.add_argument(
        "--compare", action="store_true", help="also run plain decoding and print the speedup"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (under torchrun)")
    p.add_argument("--draft-tp", type=int, default=1, help="1 (replicated draft) or --tp")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")


def _models_args(sub) -> None:
    p = sub.add_parser("models", help="list or pull the registry's models")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    msub.add_parser("list", help="registry models and their local state")
    pull = msub.add_parser("pull", help="install, assemble, verify and convert a model")
    pull.add_argument("name")
    pull.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_args(sub)
    _models_args(sub)
    return parser


def cmd_generate(args) -> None:
    from specdec.distributed import tensor_parallel

    # --tp N: one rank per process (torchrun); a rank's failure surfaces on rank 0.
    with tensor_parallel(args.tp, args.device) as tp:
        _generate(args, quiet=tp is not None and not tp.is_leader)


def _generate(args, quiet: bool) -> None:
    from specdec.config import SamplingParams
    from specdec.llm import LLM

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        draft=args.draft,
        speculate=args.speculate,
        acceptor=args.acceptor,
        k_max=args.k_max,
        draft_quant=args.draft_quant,
        dtype=args.dtype,
        device=args.device,
        max_batch=args.max_batch,
        tp=args.tp,
        draft_tp=args.draft_tp,
    )
    load_s = time.perf_counter() - t0
    ids = [llm.encode(p, args.chat) for p in args.prompts]
    params = llm.spmd_params(params, len(ids))
    plain = llm.plain_engine().generate(ids, params) if args.compare else None
    completions = llm.engine.generate(ids, params)
    if quiet:  # tensor parallelism: rank 0 prints
        return
    for i, (prompt, c) in enumerate(zip(args.prompts, completions, strict=True)):
        base = plain[i] if plain else None
        if args.json:
            row = {"prompt": prompt, **c.to_dict()}
            if base:
                row["plain"] = base.to_dict()
                row["speedup"] = round(c.tokens_per_s / base.tokens_per_s, 3)
            print(json.dumps(row), flush=True)
        else:
            _print_human(c, base, load_s)


def _print_human(c, base, load_s: float) -> None:
    print(c.text)
    s = c.stats
    line = (
        f"-- {c.num_generated} tokens in {c.elapsed_s:.2f} s: {c.tokens_per_s:.1f} tok/s "
        f"(TTFT {c.ttft_s * 1000:.0f} ms, finish: {c.finish_reason}, model load {load_s:.1f} s)"
    )
    if s.drafted:
        line += (
            f"\n-- speculation: acceptance {s.acceptance_rate:.2f}, "
            f"{s.mean_accepted_length:.2f} tokens per target pass, {s.steps} passes"
        )
    if base:
        same = "identical output" if base.token_ids == c.token_ids else "outputs differ"
        line += (
            f"\n-- plain decoding: {base.tokens_per_s:.1f} tok/s -> speedup "
            f"{c.tokens_per_s / base.tokens_per_s:.2f}x ({same})"
        )
    print(line, flush=True)


def cmd_models(args) -> None:
    from specdec.models import registry

    if args.models_cmd == "list":
        for row in registry.list_models():
            state = "installed" if row["installed"] else "not installed"
            dtypes = ",".join(row["converted"]) or "-"
            size_mb = row["size"] / 1e6
            print(
                f"{row['name']:32} {size_mb:8.0f} MB  {state:14} converted: {dtypes:10} "
                f"{row['description']}"
            )
    else:
        print(registry.pull(args.name, args.dtype))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        {"generate": cmd_generate, "models": cmd_models}[args.command](args)
    except SpecdecError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
