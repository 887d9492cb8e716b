"""Per-turn prefill ratios over plain's from `traced_bench.py` traces: each measured run's
admission of 4 rows (the warm-up's short prefills dropped), three methods a turn.

    python prefill_pairs.py docs/bench-xeon-s59/traced/trace-*.jsonl
"""

import json
import statistics
import sys

for path in sys.argv[1:]:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if r["prefill"] > 1.5]  # warm-up prefills (64 tokens) are short
    turns = [rows[i : i + 3] for i in range(0, len(rows) - 2, 3)]
    ratios = {"draft-auto": [], "ngram-auto": []}
    for turn in turns:
        by = {r["method"]: r for r in turn}
        for method, xs in ratios.items():
            xs.append(by[method]["prefill"] / by["plain"]["prefill"])
    print(
        path.split("/")[-1],
        {m: (round(statistics.median(x), 3), [round(v, 2) for v in x]) for m, x in ratios.items()},
    )
