"""Does a drafting engine's plain step cost more than the plain engine's? Issue 13's floor
point (int4 Qwen 1.5B, 4 x 1024-token prompts, 64 tokens) in one process: the plain engine,
the n-gram engine held at k = 0 (`ngram-k0`: the drafter is there, never asked), and a cold
`ngram-auto`, a fresh engine per run, in turns with the order reversed every second turn;
decode seconds (wall minus prefill) and prefill seconds per run, and their medians.

    python k0_cost.py [TURNS]
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench-xeon-s40" / "scripts"))
from floor_point import timed_run as run  # noqa: E402

turns = int(sys.argv[1]) if len(sys.argv) > 1 else 6
methods = ["plain", "ngram-k0", "ngram-auto"]


for m in methods:  # warm-up
    run(m)
decode: dict[str, list] = {m: [] for m in methods}
prefill: dict[str, list] = {m: [] for m in methods}
for turn in range(turns):
    order = methods[turn % 3 :] + methods[: turn % 3]
    for m in order[:: -1 if turn % 2 else 1]:
        d, p = run(m)
        decode[m].append(d)
        prefill[m].append(p)
    row = {m: (round(decode[m][-1], 2), round(prefill[m][-1], 2)) for m in methods}
    print(turn, row, flush=True)
for m in methods:
    ratios = [a / b for a, b in zip(decode["plain"], decode[m], strict=True)]
    print(
        f"{m:11s} decode median {statistics.median(decode[m]):.2f} s, prefill median "
        f"{statistics.median(prefill[m]):.2f} s, plain/this per turn "
        f"{[round(r, 3) for r in ratios]} median {statistics.median(ratios):.3f}"
    )
