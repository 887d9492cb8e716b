"""Issue 13's floor point step by step: the int4 Qwen 1.5B on 4 synthetic 1024-token
prompts as one batch, 64 tokens, plain against a cold `ngram-auto` (a fresh engine per run,
as the bench builds them), in turns with the order reversed every second turn. Logs, per
run, the window `auto` chose at each step, its verify pass's width and seconds, and the
rows' kept drafts; and the decode seconds (all but the prefill) of each run.

    python ngram_floor_trace.py [TURNS]
"""

import statistics
import sys

from floor_point import plain_against_auto


def record(steps, window, rows, k, verify_s, accepted_at, **kw):
    steps.append((k, kw.get("width"), round(verify_s * 1e3, 1), sum(accepted_at)))


def report(turn, steps):
    drafting = [s for s in steps if s[0]]
    print(f"turn {turn} ngram-auto: {len(steps)} steps, {len(drafting)} drafting:")
    print("  (k, width, verify ms, kept)", drafting)
    plain_ms = [s[2] for s in steps if not s[0]]
    print(f"  its k = 0 steps: median {statistics.median(plain_ms):.1f} ms")


plain_against_auto(int(sys.argv[1]) if len(sys.argv) > 1 else 4, record, report)
