"""Per-turn ratios of each method over plain and over llamacpp, from a bench results.json."""

import json
import statistics as st
import sys

rows = json.load(open(sys.argv[1]))
rows = rows["rows"] if isinstance(rows, dict) else rows
by = {}
for r in rows:
    if r.get("status") == "ok":
        by.setdefault(r["group"], {})[r["method"]] = r
for g, ms in by.items():
    print(g)
    plain = ms["plain"]["runs_tokens_per_s"]
    llama = ms.get("llamacpp", {}).get("runs_tokens_per_s")
    for m, r in ms.items():
        runs = r["runs_tokens_per_s"]
        vs_plain = [a / b for a, b in zip(runs, plain, strict=True)]
        turns = " ".join(f"{x:.2f}" for x in vs_plain)
        line = f"  {m:12s} median run {st.median(runs):6.2f} tok/s | /plain per turn {turns}"
        line += f" (median {st.median(vs_plain):.3f})"
        if llama:
            vs_l = [a / b for a, b in zip(runs, llama, strict=True)]
            line += (
                f" | /llama.cpp {' '.join(f'{x:.2f}' for x in vs_l)} (median {st.median(vs_l):.3f})"
            )
        if r.get("mean_accepted_length"):
            line += f" | tokens/pass {r['mean_accepted_length']:.2f}"
        print(line)
