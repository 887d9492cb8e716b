#!/usr/bin/env bash
# Issue 13's floor (`auto` >= 0.97x plain) across batch x prompt length, int4 pair, on the
# machine at hand (stop 53; the stop-44/45 command, its 256-token points: the 1024-token
# ones did not fit the stop). The bench resumes a stopped folder
# turn by turn, so rerunning this script goes on where it stopped.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-zen4-s53
echo "== sweep-int4 $(date -u +%H:%M:%S)"
.venv/bin/specdec bench --out "$OUT/sweep-int4" --quant int4 --workloads synthetic \
  --prompt-lens 256 --batches 1,4 --temperatures 0 --methods plain,draft-auto,ngram-auto \
  --max-tokens 64 --prompts-per-point 4 --repeats 5 --no-peers --curve-ks 0 \
  > "$OUT/sweep-int4.log" 2>&1
echo "   rc=$? $(date -u +%H:%M:%S)"
