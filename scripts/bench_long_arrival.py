"""How much a long prompt arriving stalls the streams already decoding.

Through the server's own loop (`serving.async_engine.AsyncEngine`, the engine on its thread,
tokens published to asyncio queues; no HTTP): 8 streams decode (short chat prompts, greedy,
EOS ignored), then a ~2,000-token prompt arrives. Every event a stream receives is
timestamped on the event loop, as a client would see it; a stream's inter-token latency
(ITL) is the gap between two of its events (with speculation an event may carry several
tokens). Per setting, and per repeat:

- ITL p50 / p99 / max over the gaps that overlap the window from the arrival to the long
  prompt's first token (p99 by nearest rank: under 100 gaps it is the max);
- the same 8 streams with nothing arriving (baseline, the next `--baseline-gaps` gaps of
  each stream from the same point);
- the long prompt's prefill passes, each timed inside the engine thread (one resume of
  `Engine.admit_steps`), their sum, and the long prompt's TTFT.

Settings: "chunked" (`--prefill-chunk`, default auto = 512 positions on a CPU, the live rows
decoding between passes) and "whole" (one pass, `prefill_chunk` 0: the behaviour before).
The bar: p99 ITL with the arrival <= baseline p99 + one chunked pass (the longest pass of
the chunked setting). Repeats alternate the settings' order (ABC, CBA, ...); the load
average is recorded beside each run, the host being shared. Each long prompt is a different
stretch of specdec's own source, so no prefix cache entry serves it.

    flock /tmp/specdec-real.lock python scripts/bench_long_arrival.py \\
        --model qwen2.5-coder-1.5b-instruct --quant int4 --repeats 3 --out long-arrival.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import time
from itertools import pairwise
from pathlib import Path

from specdec.engine_args import EngineArgs
from specdec.llm import LLM
from specdec.params import SamplingParams
from specdec.serving.async_engine import AsyncEngine
from specdec.serving.metrics import ServerMetrics

TASKS = [
    "reverses a linked list", "parses an ISO date", "merges two sorted lists",
    "computes a rolling median", "checks balanced brackets", "flattens a nested list",
    "counts words in a file", "finds the longest common prefix",
]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """Nearest rank (no interpolation past the largest gap)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(gaps: list[float]) -> dict:
    return {
        "n": len(gaps),
        "p50_s": percentile(gaps, 50),
        "p99_s": percentile(gaps, 99),
        "max_s": max(gaps),
    }


def source_text() -> str:
    """specdec's own source, the long prompts' material."""
    root = Path(__file__).resolve().parent.parent / "specdec"
    return "\n".join(p.read_text() for p in sorted(root.rglob("*.py")))


def time_steps(
    engine,
    admissions: list[list[tuple[float, float]]],
    decodes: list[tuple[float, float]],
) -> None:
    """Wrap the engine's `admit_steps` and `decode` (on the engine thread, as the server's
    loop calls them): each admission with requests to admit records the (start, end) of each
    of its resumes, one prefill pass each (the last also moves the admitted rows in); each
    decode step records its (start, end), its end being when the live rows' tokens are
    published."""
    admit_steps, decode = engine.admit_steps, engine.decode

    def timed_admission():
        inner, passes = admit_steps(), []
        if engine.waiting:
            admissions.append(passes)
        while True:
            start = time.perf_counter()
            try:
                next(inner)
            except StopIteration as done:
                passes.append((start, time.perf_counter()))
                return done.value
            passes.append((start, time.perf_counter()))
            yield

    def timed_decode():
        start = time.perf_counter()
        touched = decode()
        decodes.append((start, time.perf_counter()))
        return touched

    engine.admit_steps, engine.decode = timed_admission, timed_decode


async def consume(events: asyncio.Queue, times: list[float], first: asyncio.Event) -> None:
    """Timestamp each event carrying new tokens until the request finishes."""
    seen = 0
    while True:
        event = await events.get()
        if event.error:
            raise RuntimeError(event.error)
        if len(event.token_ids) > seen:
            seen = len(event.token_ids)
            times.append(time.perf_counter())
            first.set()
        if event.completion is not None:
            return


async def run_once(llm: LLM, args, shorts, long_ids: list[int] | None) -> dict:
    """8 streams decode; after `--warmup` events each, the long prompt arrives (or, for
    the baseline, nothing does). Returns the gaps in the window and the passes."""
    engine = llm.engine
    admissions: list[list[tuple[float, float]]] = []
    decodes: list[tuple[float, float]] = []
    time_steps(engine, admissions, decodes)
    runner = AsyncEngine(engine, ServerMetrics())
    runner.start(asyncio.get_running_loop())
    load_before = os.getloadavg()[0]
    stream = SamplingParams(temperature=0, max_tokens=args.stream_tokens, ignore_eos=True)
    times = [[] for _ in shorts]
    handles, tasks = [], []
    for i, ids in enumerate(shorts):
        h, events = runner.submit([(ids, stream)], f"stream-{i}")
        handles += h
        tasks.append(asyncio.create_task(consume(events, times[i], asyncio.Event())))
    while min(len(t) for t in times) < args.warmup:
        await asyncio.sleep(0.005)
    arrival = time.perf_counter()
    result: dict = {}
    if long_ids is None:
        while min(len(t) for t in times) < args.warmup + args.baseline_gaps + 1:
            await asyncio.sleep(0.005)
        per_stream = [[b - a for a, b in pairwise(t) if b > arrival] for t in times]
        gaps = [g for s in per_stream for g in s[: args.baseline_gaps]]
        end = arrival
    else:
        long_params = SamplingParams(temperature=0, max_tokens=args.long_tokens, ignore_eos=True)
        h, events = runner.submit([(long_ids, long_params)], "long")
        handles += h
        long_times: list[float] = []
        first = asyncio.Event()
        tasks.append(asyncio.create_task(consume(events, long_times, first)))
        await first.wait()
        end = long_times[0]
        # each stream's first event after the long prompt's first token closes its last gap
        while min(sum(x > end for x in t) for t in times) < 1:
            await asyncio.sleep(0.005)
        gaps = [b - a for t in times for a, b in pairwise(t) if b > arrival and a < end]
        passes = next(p for p in admissions if p[0][0] >= arrival - 1e-3)
        durations = [b - a for a, b in passes]
        # when the engine published the live rows' tokens, before the event loop saw them
        closing = [
            (stop - before, stop - start)  # a gap: one pass, then the decode step closing it
            for (_, before), (start, stop) in pairwise(decodes)
            if stop > arrival and before < passes[-1][1]
        ]
        engine_gaps, steps = [g for g, _ in closing], [d for _, d in closing]
        result.update(
            engine_itl=summary(engine_gaps),
            decode_in_window_s=steps,
            ttft_s=end - arrival,
            passes_s=durations,
            pass_max_s=max(durations),
            prefill_s=sum(durations),
        )
    runner.abort(handles)
    await asyncio.gather(*tasks)
    runner.stop()
    del engine.admit_steps, engine.decode  # the class's own again
    result.update(
        itl=summary(gaps),
        window_s=end - arrival,
        loadavg_1m=[load_before, os.getloadavg()[0]],
    )
    return result


def median_of(runs: list[dict], *keys: str) -> float:
    values = []
    for r in runs:
        for k in keys[:-1]:
            r = r[k]
        values.append(r[keys[-1]])
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    engine_flags = {"model", "quant", "draft", "speculate", "dtype", "prefill_chunk"}
    EngineArgs.add_cli_args(parser, only=engine_flags)
    parser.add_argument("--streams", type=int, default=8, help="streams already decoding")
    parser.add_argument("--long-prompt", type=int, default=2000, help="its tokens")
    parser.add_argument("--long-tokens", type=int, default=4, help="the long prompt's output")
    parser.add_argument("--stream-tokens", type=int, default=512, help="streams' max_tokens")
    parser.add_argument("--warmup", type=int, default=6, help="events per stream first")
    parser.add_argument("--baseline-gaps", type=int, default=16, help="gaps per stream")
    parser.add_argument("--max-len", type=int, default=4096, help="as serve's --max-model-len")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    fields = {k: v for k, v in vars(args).items() if k in engine_flags}
    # one row more than the streams: the long prompt takes a free row, not a queue
    llm = LLM(EngineArgs(**fields, max_batch=args.streams + 1, max_len=args.max_len))
    chunk = llm.prefill_chunk
    if chunk is None:
        parser.error("--prefill-chunk resolves to one pass here: give a chunk to compare")
    settings = {"baseline": chunk, "chunked": chunk, "whole": None}
    text_ids = llm.tokenizer.encode(source_text())
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    order = list(settings)
    for repeat in range(args.repeats):
        for name in order if repeat % 2 == 0 else order[::-1]:
            # the draft model's drafter takes the chunk when the engine rebuilds it
            llm.prefill_chunk = llm.engine.prefill_chunk = settings[name]
            llm.engine.reset()
            n, start = args.long_prompt, (3 * repeat + order.index(name)) * args.long_prompt
            shorts = [
                llm.encode(f"Write a Python function that {task} (variant {repeat}).", True)
                for task in (TASKS * args.streams)[: args.streams]
            ]
            long_ids = None if name == "baseline" else text_ids[start : start + n]
            run = asyncio.run(run_once(llm, args, shorts, long_ids))
            run.update(setting=name, repeat=repeat)
            runs[name].append(run)
            if args.out:  # so far, in case the run is cut short
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
            itl = run["itl"]
            print(
                f"{name:8} #{repeat}: ITL p50 {itl['p50_s'] * 1e3:.0f} ms, p99 "
                f"{itl['p99_s'] * 1e3:.0f} ms, max {itl['max_s'] * 1e3:.0f} ms over "
                f"{itl['n']} gaps"
                + (
                    f"; engine's own gaps p99 {run['engine_itl']['p99_s'] * 1e3:.0f} ms"
                    f"; passes {[round(p * 1e3) for p in run['passes_s']]} ms, TTFT "
                    f"{run['ttft_s']:.2f} s"
                    if long_ids
                    else ""
                )
                + f"; load {run['loadavg_1m'][0]:.1f}",
                flush=True,
            )
    base_p99 = median_of(runs["baseline"], "itl", "p99_s")
    chunk_pass = median_of(runs["chunked"], "pass_max_s")
    table = {}
    for name in ("chunked", "whole"):
        p99 = median_of(runs[name], "itl", "p99_s")
        table[name] = {
            "itl_p50_s": median_of(runs[name], "itl", "p50_s"),
            "itl_p99_s": p99,
            "itl_max_s": median_of(runs[name], "itl", "max_s"),
            "engine_itl_p99_s": median_of(runs[name], "engine_itl", "p99_s"),
            "decode_in_window_max_s": statistics.median(
                max(r["decode_in_window_s"]) for r in runs[name]
            ),
            "pass_max_s": median_of(runs[name], "pass_max_s"),
            "prefill_s": median_of(runs[name], "prefill_s"),
            "ttft_s": median_of(runs[name], "ttft_s"),
            "within_bar": p99 <= base_p99 + chunk_pass,
        }
    table["baseline"] = {
        "itl_p50_s": median_of(runs["baseline"], "itl", "p50_s"),
        "itl_p99_s": base_p99,
        "itl_max_s": median_of(runs["baseline"], "itl", "max_s"),
    }
    bound = base_p99 + chunk_pass
    for name in ("chunked", "whole"):
        verdict = "PASS" if table[name]["within_bar"] else "FAIL"
        print(
            f"{verdict} {name}: p99 ITL {table[name]['itl_p99_s'] * 1e3:.0f} ms <= baseline "
            f"p99 {base_p99 * 1e3:.0f} + one chunk pass {chunk_pass * 1e3:.0f} = "
            f"{bound * 1e3:.0f} ms (medians of {args.repeats} repeats)"
        )
    if args.out:
        config = {k: v for k, v in vars(args).items() if k != "out"}
        config.update(prefill_chunk=chunk, long_prompt_tokens=args.long_prompt)
        report = {
            "measures": "ITL of live streams while a long prompt arrives (AsyncEngine)",
            "config": config,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "summary": table,
            "bound_s": bound,
            "runs": runs,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
