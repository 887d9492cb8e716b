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
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
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
    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_batch=args.max_batch)
    load_s = time.perf_counter() - t0
    completions = llm.generate(args.prompts, params, chat=args.chat)
    for prompt, c in zip(args.prompts, completions, strict=True):
        if args.json:
            print(json.dumps({"prompt": prompt, **c.to_dict()}), flush=True)
            continue
        print(c.text)
        print(
            f"-- {c.num_generated} tokens in {c.elapsed_s:.2f} s: {c.tokens_per_s:.1f} tok/s "
            f"(TTFT {c.ttft_s * 1000:.0f} ms, finish: {c.finish_reason}, "
            f"model load {load_s:.1f} s)",
            flush=True,
        )


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
