#!/usr/bin/env bash
# Issue 13's floor at the sweep's 256-token points (int4 pair), where stop 53's five turns
# left two decode-phase medians under 0.97x (draft-auto at 256 x 1: 0.944x; ngram-auto at
# 256 x 4: 0.962x): the same command with 8 turns. Resumable like every bench.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-zen4-s54/sweep-int4-256
echo "== sweep-int4-256 $(date -u +%H:%M:%S)"
.venv/bin/specdec bench --out "$OUT" --quant int4 --workloads synthetic \
  --prompt-lens 256 --batches 1,4 --temperatures 0 --methods plain,draft-auto,ngram-auto \
  --max-tokens 64 --prompts-per-point 4 --repeats 8 --no-peers --curve-ks 0 >> "$OUT.log" 2>&1
echo "   rc=$? $(date -u +%H:%M:%S)"
