"""Forwards of ROWS tokens (default 5: a k = 4 verify pass) of the bf16 1.5B at a 250-token
context on THREADS threads (default 2), timed for SECONDS; prints its pid when warm, for
`perf record -p PID`. Stop 49's draft_step.py with the target's model, dtype and rows.

    ROWS=5 python docs/bench-zen3-s50/scripts/target_step.py 40 &
    perf record -F 499 -p PID -o perf.data -- sleep 20
    perf report -i perf.data --no-children --sort dso,symbol
"""

import os
import runpy
from pathlib import Path

os.environ.setdefault("MODEL", "qwen2.5-coder-1.5b-instruct")
os.environ.setdefault("QUANT", "none")
os.environ.setdefault("ROWS", "5")
DRAFT_STEP = Path(__file__).resolve().parents[2] / "bench-zen3-s49/scripts/draft_step.py"
runpy.run_path(str(DRAFT_STEP), run_name="__main__")
