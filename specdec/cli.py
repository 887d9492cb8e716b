"""`specdec` command line: generate, serve, bench, bench-serve, train-speculator, models."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specdec.bench import cli as bench_cli
from specdec.cli_sampling import add_sampling_args, sampling_params
from specdec.errors import InvalidParameterError, SpecdecError


def _model_args(p) -> None:
    """The target, its drafter and the acceptance rule: shared by generate and serve."""
    from specdec.engine_args import EngineArgs

    EngineArgs.add_cli_args(p)
    p.add_argument(
        "--tune-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a load may spend timing kernel choices this machine has not measured "
        "(default 60, or $SPECDEC_TUNE_BUDGET; 0: the plans predicted for this CPU only)",
    )


def _generate_args(sub) -> None:
    p = sub.add_parser("generate", help="generate text from prompts")
    _model_args(p)
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at EOS (benchmarks)")
    p.add_argument("--max-batch", type=int, default=8, help="prompts decoded together")
    p.add_argument(
        "--compare", action="store_true", help="also run plain decoding and print the speedup"
    )
    add_sampling_args(p)  # penalties, logit_bias, logprobs, JSON output: as the server's
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")


def _serve_args(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _model_args(p)
    p.add_argument("--max-batch-size", type=int, default=8, help="sequences decoded together")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="KV cache length per sequence (prompt + output); capped by the model's context",
    )
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument(
        "--served-model-name", default=None, help="model id for clients (default: --model)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _bench_serve_args(sub) -> None:
    p = sub.add_parser(
        "bench-serve",
        help="load-test a server (ShareGPT or code prompts), speculation on vs off",
    )
    p.add_argument(
        "--url",
        default=None,
        help="an already running server, with or without /v1 (else launch one)",
    )
    p.add_argument("--served-model", default=None, help="model id at --url (default: first)")
    p.add_argument("--model", default=None, help="target to launch `specdec serve` with")
    p.add_argument("--draft", default=None, help="draft to launch with (name/path, ngram, suffix)")
    p.add_argument(
        "--speculate",
        default="off,auto",
        help="comma list of server settings to compare: off, auto or K (launch mode)",
    )
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--dataset", default="sharegpt", choices=["sharegpt", "code"])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,4,8", help="comma list of closed-loop clients")
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per s")
    p.add_argument(
        "--provenance",
        default="off",
        help="comma list: off, on (on: every request asks for per-token provenance, "
        "stream_options.include_speculation), to measure its cost",
    )
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="every request asks for its tokens' log-probabilities and N alternatives each",
    )
    p.add_argument("--port", type=int, default=8123, help="port for launched servers")
    p.add_argument("--out", default="bench-serve.json", help="results (JSON rows)")


def _train_speculator_args(sub) -> None:
    p = sub.add_parser("train-speculator", help="train speculator heads for a target")
    p.add_argument("--model", required=True, help="the target: registry name or directory")
    p.add_argument("--data", default="sharegpt", help="sharegpt, or a .jsonl/.json/.txt file")
    p.add_argument("--out", required=True, help="directory for heads, checkpoints and logs")
    p.add_argument(
        "--heads", type=int, default=3, help="tokens drafted per step (eagle: steps trained)"
    )
    p.add_argument(
        "--kind",
        choices=["mlp", "eagle", "eagle3"],
        default="mlp",
        help="mlp: MLP speculator heads (the fms-extras layout); eagle: one decoder "
        "layer over the target's states at every position (specdec's own files); eagle3: "
        "EAGLE-3's layer over three target layers, in vLLM's llama_eagle3 layout",
    )
    p.add_argument(
        "--eagle3-layers",
        default=None,
        help="eagle3: the three target layers read, e.g. 2,12,21 (default: vLLM's 2,L/2,L-3)",
    )
    p.add_argument(
        "--eagle-intermediate",
        type=int,
        default=None,
        help="the eagle layer's MLP width (default: the target's)",
    )
    p.add_argument("--stage1-steps", type=int, default=1000, help="steps on ground-truth text")
    p.add_argument("--stage2-steps", type=int, default=500, help="steps on target outputs")
    p.add_argument(
        "--stage1-labels",
        choices=["text", "target"],
        default="text",
        help="what stage 1 predicts: the text's next tokens, or the target's own greedy "
        "choice after each prefix of it",
    )
    p.add_argument(
        "--stage1-data-steps",
        type=int,
        default=None,
        help="stage-1 steps on fresh text (default: all); later steps cycle over their "
        "target states, cached on disk",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256, help="tokens per stage-1 row")
    p.add_argument(
        "--lr", type=float, default=None, help="stage-1 peak rate (default 1e-3; eagle3 3e-4)"
    )
    p.add_argument(
        "--stage2-lr", type=float, default=None, help="stage-2 peak (default 3e-4; eagle3 1e-4)"
    )
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument(
        "--own-tables",
        action="store_true",
        help="train own embeddings and vocabulary heads (the MLPSpeculator layout) "
        "instead of reusing the target's frozen ones",
    )
    p.add_argument("--inner-dim", type=int, default=None, help="head width with --own-tables")
    p.add_argument("--tie-weights", action="store_true", help="share weights across heads")
    p.add_argument("--draft-vocab", type=int, default=0, help="score only the N most frequent ids")
    p.add_argument("--stage2-prompts", type=int, default=None, help="continuations generated")
    p.add_argument("--stage2-max-tokens", type=int, default=128)
    p.add_argument("--stage2-temperature", type=float, default=0.0)
    p.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts")
    p.add_argument("--eval-max-tokens", type=int, default=64)
    p.add_argument("--no-chat", action="store_true", help="no chat template on conversations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bf16", "fp32"],
        help="the target's (default bf16, fp32 on a CPU without bf16 instructions)",
    )
    p.add_argument(
        "--heads-autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train the heads under bf16 autocast, fp32 weights (default: where the target "
        "runs in bf16)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


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
    _serve_args(sub)
    _bench_serve_args(sub)
    _train_speculator_args(sub)
    _models_args(sub)
    doctor = sub.add_parser("doctor", help="machine, bandwidth, kernel choices, speed bounds")
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    bench_cli.add_parser(sub)
    return parser


def cmd_generate(args) -> None:
    from specdec.distributed import tensor_parallel

    # --tp N: one rank per process (torchrun); a rank's failure surfaces on rank 0.
    with tensor_parallel(args.tp, args.device) as tp:
        _generate(args, quiet=tp is not None and not tp.is_leader)


def _generate(args, quiet: bool) -> None:
    params = sampling_params(args)  # checked before any weights load
    logprobs = params.logprobs
    t0 = time.perf_counter()
    llm = _load(args, max_batch=args.max_batch)
    load_s = time.perf_counter() - t0
    ids = [llm.encode(p, args.chat) for p in args.prompts]
    params = llm.spmd_params(params, len(ids))
    plain = llm.plain_engine().generate(ids, params) if args.compare else None
    completions = llm.engine.generate(ids, params)
    if llm.learner is not None:  # checkpoint what was learnt; say where it stands
        llm.learner.close()
        print(f"specdec: heads {json.dumps(llm.learner.metrics())}", file=sys.stderr, flush=True)
    if quiet:  # tensor parallelism: rank 0 prints
        return
    memory = _memory(llm) if args.json else None
    formatter = _logprob_formatter(llm) if logprobs is not None else None
    for i, (prompt, c) in enumerate(zip(args.prompts, completions, strict=True)):
        base = plain[i] if plain else None
        if args.json:
            row = {"prompt": prompt, **c.to_dict(), "memory": memory, "load_s": round(load_s, 2)}
            if formatter is not None:  # the chat API's shape: token, logprob, bytes, top
                row["logprobs"] = formatter.chat(c.logprobs or [])["content"]
            if base:
                row["plain"] = base.to_dict()
                row["speedup"] = round(c.tokens_per_s / base.tokens_per_s, 3)
            print(json.dumps(row), flush=True)
        else:
            _print_human(c, base, load_s)
            if formatter is not None:
                _print_logprobs(formatter, c.logprobs or [])


def _logprob_formatter(llm):
    from specdec.serving.logprobs import LogprobFormatter

    return LogprobFormatter(llm.engine)


def _print_logprobs(formatter, entries) -> None:
    """One line per emitted token: its text, log probability and the alternatives."""
    for e in entries:
        top = ", ".join(f"{formatter.text(t)!r} {lp:.3f}" for t, lp in e.top)
        print(f"   {formatter.text(e.token)!r:>16} {e.logprob:8.3f}  [{top}]", flush=True)


def _memory(llm) -> dict:
    """Each model's resident bytes and the process's peak RSS so far, in MB."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KB on Linux
    return {
        **{f"{name}_mb": round(b / 1e6, 1) for name, b in llm.footprint().items()},
        "peak_rss_mb": round(peak / 1e6, 1),
    }


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


def _load(args, **fields):
    """The LLM of the parsed flags (`fields`: the command's own, e.g. max_batch)."""
    from specdec.engine_args import EngineArgs
    from specdec.llm import LLM

    budget = getattr(args, "tune_budget", None)
    if budget is not None:
        if budget < 0:
            raise InvalidParameterError(f"--tune-budget {budget}: must be >= 0 seconds")
        os.environ["SPECDEC_TUNE_BUDGET"] = str(budget)
    if getattr(args, "json", False):  # machine-read output: no progress bars, status lines
        os.environ["SPECDEC_PROGRESS"] = "0"

    return LLM(EngineArgs.from_cli_args(args, **fields))


def cmd_serve(args) -> None:
    from specdec.distributed import tensor_parallel

    # --tp N: rank 0 serves HTTP and sends each step's commands to the others, which follow.
    with tensor_parallel(args.tp, args.device) as tp:
        llm = _load(args, max_batch=args.max_batch_size, max_len=args.max_model_len)
        if tp is not None and not tp.is_leader:
            from specdec.serving.async_engine import follow

            follow(llm.engine, lambda _: tp.broadcast_object(None))
            return
        _serve(args, llm, sync=tp.broadcast_object if tp is not None else None)


def _serve(args, llm, sync) -> None:
    import uvicorn

    from specdec.serving.app import build_app

    name = args.served_model_name or args.model
    app = build_app(
        llm.engine,
        name,
        api_key=args.api_key,
        max_queue=args.max_queue,
        sync=sync,
        learner=llm.learner,
    )
    print(f"specdec: serving {name} on http://{args.host}:{args.port}/v1", flush=True)
    _unwind_on_sigterm()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if llm.learner is not None:
            llm.learner.close()  # the heads learnt so far, into --draft


def _unwind_on_sigterm() -> None:
    """Make a SIGTERM a `SystemExit(143)`, where nothing else handles it. uvicorn shuts down
    gracefully on one and then raises it again; by default that killed the process before
    `_serve`'s `finally` and the atexit handlers (the learner's last heads, `auto`'s stored
    costs). A handler set before (a tensor-parallel rank's) is left alone."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def cmd_bench_serve(args) -> None:
    import asyncio

    from specdec import data
    from specdec.serving import loadgen

    if args.url is None and args.model is None:
        raise InvalidParameterError("give --url of a running server or --model to launch one")
    n = args.num_prompts
    if args.dataset == "code":
        prompts = (data.CODE_PROMPTS * (n // len(data.CODE_PROMPTS) + 1))[:n]
    else:
        prompts = data.sharegpt_prompts(n)
    loads = (
        [("rate", args.request_rate)]
        if args.request_rate
        else [("clients", int(c)) for c in args.concurrency.split(",")]
    )
    provenance = args.provenance.split(",")
    if not set(provenance) <= {"off", "on"}:
        raise InvalidParameterError(f"--provenance takes off and/or on, got {args.provenance!r}")
    rows: list[dict] = []

    def measure(url: str, model: str, label: str, kind: str, value) -> None:
        """One load on one server, once per provenance setting (back to back, so both see
        the same neighbours)."""
        concurrency, rate = (value, None) if kind == "clients" else (None, value)
        for p in provenance:
            asks = {"provenance": p == "on", "logprobs": args.logprobs}
            load = loadgen.run_load(url, model, prompts, args.max_tokens, concurrency, rate, **asks)
            results, wall = asyncio.run(load)
            name = label if provenance == ["off"] else f"{label}, provenance {p}"
            row = loadgen.result_row(name, f"{kind}={value}", loadgen.summarize(results, wall))
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)

    def warm_up(url: str, model: str) -> None:
        asyncio.run(loadgen.run_load(url, model, prompts[:1], args.max_tokens, 1))

    if args.url:
        url, served = loadgen.resolve_server(args.url)
        model = args.served_model or served[0]
        warm_up(url, model)
        for kind, value in loads:
            measure(url, model, "given", kind, value)
    else:
        # Every setting's server runs at once and the loads alternate between them, so a
        # neighbour's burst on the machine lands on both sides of a comparison.
        servers = {}
        try:
            for i, setting in enumerate(args.speculate.split(",")):
                serve = ["--model", args.model, "--dtype", args.dtype]
                serve += ["--served-model-name", "bench", "--log-level", "warning"]
                serve += ["--max-batch-size", str(args.max_batch_size)]
                if setting != "off":
                    if args.draft is None:
                        raise InvalidParameterError(f"--speculate {setting} needs --draft")
                    serve += ["--draft", args.draft, "--speculate", setting]
                log = f"{args.out}.{setting}.log"
                servers[setting] = loadgen.LaunchedServer(serve, args.port + i, log)
            for server in servers.values():
                server.wait_ready()
                warm_up(server.url, "bench")
            for kind, value in loads:
                for setting, server in servers.items():
                    measure(server.url, "bench", f"speculate {setting}", kind, value)
        finally:
            for server in servers.values():
                server.stop()
    print(loadgen.format_table(rows))


def _layer_ids(text: str | None) -> tuple[int, ...] | None:
    """`--eagle3-layers 2,12,21` -> (2, 12, 21)."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as err:
        raise InvalidParameterError(
            f"--eagle3-layers: comma-separated integers, got {text!r}"
        ) from err


def cmd_train_speculator(args) -> None:
    import torch

    from specdec.training.stages import TrainConfig, train_speculator
    from specdec.training.target import heads_autocast, target_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        heads=args.heads,
        kind=args.kind,
        eagle_intermediate=args.eagle_intermediate,
        eagle3_layers=_layer_ids(args.eagle3_layers),
        stage1_steps=args.stage1_steps,
        stage1_data_steps=args.stage1_data_steps,
        stage1_labels=args.stage1_labels,
        stage2_steps=args.stage2_steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        stage2_lr=args.stage2_lr,
        checkpoint_every=args.checkpoint_every,
        reuse_target=not args.own_tables,
        tie_weights=args.tie_weights,
        inner_dim=args.inner_dim,
        draft_vocab=args.draft_vocab,
        stage2_prompts=args.stage2_prompts,
        stage2_max_tokens=args.stage2_max_tokens,
        stage2_temperature=args.stage2_temperature,
        eval_prompts=args.eval_prompts,
        eval_max_tokens=args.eval_max_tokens,
        chat=not args.no_chat,
        seed=args.seed,
        heads_autocast=args.heads_autocast,
    )
    dtype = args.dtype or target_dtype(args.device)
    heads = "under bf16 autocast" if heads_autocast(args.device, args.heads_autocast) else "in fp32"
    print(f"specdec: the target runs in {dtype}, the heads train {heads}", file=sys.stderr)
    train_speculator(args.model, args.data, args.out, cfg, dtype=dtype, device=args.device)
    results = Path(args.out) / "eval.json"
    if results.is_file():
        print(results.read_text(), end="")
    print(f"specdec: heads saved in {args.out} (use --draft {args.out})", flush=True)


def cmd_models(args) -> None:
    from specdec import hub

    if args.models_cmd == "list":
        for row in hub.list_models():
            state = "installed" if row["installed"] else "not installed"
            dtypes = ",".join(row["converted"]) or "-"
            size_mb = row["size"] / 1e6
            print(
                f"{row['name']:32} {size_mb:8.0f} MB  {state:14} converted: {dtypes:10} "
                f"{row['description']}"
            )
    else:
        print(hub.pull(args.name, args.dtype))


def cmd_doctor(args) -> None:
    from specdec import doctor

    data = doctor.report()
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        doctor.print_report(data)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {
            "generate": cmd_generate,
            "serve": cmd_serve,
            "bench-serve": cmd_bench_serve,
            "train-speculator": cmd_train_speculator,
            "models": cmd_models,
            "doctor": cmd_doctor,
            "bench": bench_cli.run,
        }
        commands[args.command](args)
    except SpecdecError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2
    return 0


def run() -> None:
    """The `specdec` console command: `main`, then the process ends without Python's ~1 s
    teardown of a loaded model (`specdec.fast_exit`); `main(argv)` itself returns."""
    from specdec.fast_exit import exit_process

    exit_process(main())


if __name__ == "__main__":
    run()
