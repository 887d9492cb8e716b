"""Per-turn ratios of each method over plain from one or more sweep folders (pooled when
several hold the same point): end to end, decode phase and CPU time, as the medians the
notes quote, with their spread and the geometric mean.

    python docs/bench-xeon-s58/scripts/turn_ratios.py docs/bench-xeon-s58/sweep-int4-1024x4 [...]
"""

import json
import math
import statistics
import sys
from pathlib import Path

FIELDS = ("runs_tokens_per_s", "runs_decode_tokens_per_s", "runs_cpu_tokens_per_s")


def main(folders: list[str]) -> None:
    pooled: dict[str, list[list[float]]] = {}
    for folder in folders:
        rows = json.loads((Path(folder) / "results.json").read_text())["rows"]
        plain = next(r for r in rows if r["method"] == "plain")
        for row in rows:
            if row["method"] == "plain" or row.get("status") != "ok":
                continue
            ratios = pooled.setdefault(row["method"], [[], [], []])
            for i, field in enumerate(FIELDS):
                ratios[i] += [a / b for a, b in zip(row[field], plain[field], strict=True)]
            print(
                f"{folder}: {row['method']}: drafted {row['drafted_tokens']}, "
                f"{row['mean_accepted_length']} tokens a step, TTFT median "
                f"{row['ttft_median_s']} s (plain {plain['ttft_median_s']})"
            )
    for method, ratios in pooled.items():
        parts = []
        for name, xs in zip(("e2e", "decode", "cpu"), ratios, strict=True):
            geo = math.exp(statistics.fmean(math.log(x) for x in xs))
            parts.append(
                f"{name} median {statistics.median(xs):.3f} geo {geo:.3f} "
                f"[{min(xs):.2f}-{max(xs):.2f}]"
            )
        print(f"{method} ({len(ratios[0])} turns): " + "; ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1:])
