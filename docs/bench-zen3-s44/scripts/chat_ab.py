"""Plain against a cold `auto` at the bench's int4 chat point (the 4 ShareGPT first
turns, batch 1, greedy, 64 tokens): fresh engines as the bench builds them, whole runs in
turns (order reversed every second turn). Per turn: wall, decode (wall less prefill) and
CPU seconds of both, and `auto`'s steps and drafted tokens; medians of the per-turn
ratios. `--profile` adds a cProfile of one run of each, top functions by own time.

    .venv/bin/python docs/bench-zen3-s44/scripts/chat_ab.py [METHOD] [TURNS] [--profile]
    (METHOD: ngram-auto (default), draft-auto, ...)
"""

import cProfile
import pstats
import statistics
import sys
import time

from specdec.bench.cli import runner_for
from specdec.bench.plan import Point

args = [a for a in sys.argv[1:] if not a.startswith("--")]
method = args[0] if args else "ngram-auto"
turns = int(args[1]) if len(args) > 1 else 8
# The runner of `specdec bench --quant int4 --max-tokens 64 --prompts-per-point 4`.
runner = runner_for("--quant", "int4", "--max-tokens", "64", "--prompts-per-point", "4")


def point(name: str) -> Point:
    return Point("sharegpt", None, 1, 0.0, name)


prompts = runner.prompts(point("plain"))
params = runner.params(point("plain"), len(prompts))


def run(name: str) -> dict:
    """One run as the bench's: a fresh engine, one `generate` per prompt."""
    engine = runner._engine(point(name))
    wall, cpu = time.perf_counter(), time.process_time()
    outs = []
    for i in range(len(prompts)):
        outs += engine.generate(prompts[i : i + 1], params[i : i + 1])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = sum(o.stats.steps for o in outs)
    drafted = sum(o.stats.drafted for o in outs)
    return {
        "wall": wall,
        "decode": wall - engine.prefill_s,
        "cpu": cpu,
        "steps": steps,
        "drafted": drafted,
        "prefill": engine.prefill_s,
    }


if "--profile" in sys.argv:
    for name in ("plain", method):
        run(name)
        profile = cProfile.Profile()
        profile.enable()
        run(name)
        profile.disable()
        print(f"== {name}")
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    sys.exit()

run("plain"), run(method)  # warm-up
seen: dict[str, list[dict]] = {"plain": [], method: []}
for turn in range(turns):
    for name in ["plain", method][:: -1 if turn % 2 else 1]:
        seen[name].append(run(name))
    p, a = seen["plain"][-1], seen[method][-1]
    print(
        f"turn {turn}: wall {p['wall']:.2f}/{a['wall']:.2f} -> {p['wall'] / a['wall']:.3f}, "
        f"decode {p['decode'] / a['decode']:.3f}, cpu {p['cpu'] / a['cpu']:.3f}, prefill "
        f"{p['prefill']:.2f}/{a['prefill']:.2f}; {method} {a['steps']} steps, "
        f"{a['drafted']} drafted",
        flush=True,
    )
for key in ("wall", "decode", "cpu", "prefill"):
    ratios = [p[key] / a[key] for p, a in zip(seen["plain"], seen[method], strict=True)]
    print(
        f"{key}: plain / {method} per turn median {statistics.median(ratios):.3f}",
        sorted(round(r, 3) for r in ratios),
    )
