"""The bf16 code-128 benches of this folder side by side: per build and round, plain tok/s,
and each method's tok/s with its paired (per-turn median) speedup over the same run's plain,
end to end and in the decode phase. Usage: python code128_table.py"""

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
for folder in sorted(HERE.glob("bf16-code-128-*/")):
    rows = {r["method"]: r for r in csv.DictReader((folder / "results.csv").open())}
    if "plain" not in rows:
        continue
    cells = [f"plain {float(rows['plain']['tokens_per_s']):.2f} tok/s"]
    for method in ("draft-auto", "draft-k4"):
        r = rows.get(method)
        if r:
            cells.append(
                f"{method} {float(r['tokens_per_s']):.2f} tok/s, {float(r['paired_speedup']):.3f}x "
                f"(decode {float(r['paired_decode_speedup']):.3f}x, "
                f"{float(r['mean_accepted_length']):.2f} a pass)"
            )
    print(f"{folder.name}: " + "; ".join(cells))
