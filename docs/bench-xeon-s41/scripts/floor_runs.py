"""Per method of a bench's results: tokens/s, speedup, the median of per-turn ratios to
plain (run i against plain's run i), decode and CPU-time speedups, tokens drafted and kept,
steps, TTFT, and the runs' tokens/s.

    python floor_runs.py BENCH_OUT [BENCH_OUT ...]
"""

import json
import statistics
import sys

for path in sys.argv[1:]:
    rows = {r["method"]: r for r in json.load(open(path + "/results.json"))["rows"]}
    plain = rows["plain"]["runs_tokens_per_s"]
    print(path)
    for method, r in rows.items():
        runs = r["runs_tokens_per_s"]
        per_turn = statistics.median(a / p for a, p in zip(runs, plain, strict=True))
        print(
            f"  {method:16s} tok/s {r['tokens_per_s']:.2f} speedup {r['speedup']:.3f} "
            f"per-turn median {per_turn:.3f} decode {r['decode_speedup']:.3f} "
            f"cpu {r['cpu_speedup']:.3f} drafted {r['drafted_tokens']} "
            f"kept {r['accepted_tokens']} steps {r['steps']} ttft {r['ttft_median_s']:.2f}"
        )
        print("    runs", runs)
