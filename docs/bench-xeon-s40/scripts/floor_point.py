"""Issue 13's floor point as the bench builds it, for the trace scripts beside this one:
the int4 Qwen 1.5B, 4 synthetic 1024-token prompts as one batch, 64 tokens, `auto` up to
k = 8. `point(method)` is its bench point; `engine(method)` a fresh engine for a run."""

from specdec.bench.plan import Point
from specdec.bench.runner import Runner

runner = Runner(
    "qwen2.5-coder-1.5b-instruct",
    None,
    "bf16",
    "cpu",
    k_max=8,
    max_tokens=64,
    prompts_per_point=4,
    quant="int4",
)


def point(method: str) -> Point:
    return Point("synthetic", 1024, 4, 0.0, method)


prompts = runner.prompts(point("plain"))
params = runner.params(point("plain"), len(prompts))


def engine(method: str):
    return runner._engine(point(method))


def timed_run(method: str, record=None) -> tuple[float, float]:
    """A fresh engine's run: (decode seconds, prefill seconds). `record(window, rows, k,
    verify_s, accepted_at, **kw)`, if given, sees each step after `auto` observed it."""
    import time

    fresh = engine(method)
    if record is not None:
        window, observe = fresh.window, fresh.window.observe

        def logged(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw):
            observe(rows, k, verify_s, draft_s, drafted_at, accepted_at, **kw)
            record(window, rows, k, verify_s, accepted_at, **kw)

        window.observe = logged
    started = time.perf_counter()
    fresh.generate(prompts, params)
    wall = time.perf_counter() - started
    return wall - fresh.prefill_s, fresh.prefill_s


def plain_against_auto(turns: int, record, report) -> None:
    """Plain and a cold `ngram-auto` in turns, the order reversed every second turn, after
    a warm-up run of each: each `ngram-auto` run's steps (what `record(steps, window, ...)`
    appended) go to `report(turn, steps)`; the decode seconds of both, per turn."""
    import statistics

    def run(method: str) -> tuple[float, list]:
        steps: list = []
        hook = None if method == "plain" else lambda *a, **kw: record(steps, *a, **kw)
        return timed_run(method, hook)[0], steps

    run("plain")  # warm-up
    run("ngram-auto")
    decode: dict[str, list] = {"plain": [], "ngram-auto": []}
    for turn in range(turns):
        for method in ["plain", "ngram-auto"][:: -1 if turn % 2 else 1]:
            seconds, steps = run(method)
            decode[method].append(seconds)
            if steps:
                report(turn, steps)
        ratio = decode["plain"][-1] / decode["ngram-auto"][-1]
        print(
            f"turn {turn}: decode s plain {decode['plain'][-1]:.2f} "
            f"auto {decode['ngram-auto'][-1]:.2f} -> {ratio:.3f}x",
            flush=True,
        )
    ratios = [p / a for p, a in zip(decode["plain"], decode["ngram-auto"], strict=True)]
    print(
        "decode ratio per turn", [round(r, 3) for r in ratios], "median", statistics.median(ratios)
    )
