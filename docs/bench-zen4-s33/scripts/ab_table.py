"""Per-turn median of ngram-auto over plain at each batch-4 point of the A/B runs:
python ab_table.py stop32-1 ragged-1 stop32-2 ragged-2 ragged-3 limits-1 ragged-4 limits-2"""

import json
import statistics
import sys
from pathlib import Path

base = Path(__file__).resolve().parent.parent / "ngram-b4-ab"
for tag in sys.argv[1:]:
    rows = json.loads((base / f"{tag}.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    by = {}
    for r in rows:
        if r.get("status") == "skipped":
            continue
        by.setdefault(r["group"], {})[r["method"]] = r
    out = []
    for g, m in by.items():
        if "plain" not in m or "ngram-auto" not in m:
            continue
        p, a = m["plain"]["runs_tokens_per_s"], m["ngram-auto"]["runs_tokens_per_s"]
        turn = statistics.median(x / y for x, y in zip(a, p, strict=False))
        out.append(f"{g.replace('|len=natural', '').replace('batch=4|', '')}: {turn:.3f}")
    print(tag, "; ".join(out))
