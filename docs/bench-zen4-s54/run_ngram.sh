#!/usr/bin/env bash
# Issue 13's one unresolved floor point on this Zen 4: n-gram `auto` on the int4 target,
# code prompts, batch 1 (stop 53 read 0.962x plain in 4 turns): 8 turns this time.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-zen4-s54/ngram-int4-code
echo "== ngram-int4-code $(date -u +%H:%M:%S)"
.venv/bin/specdec bench --out "$OUT" --quant int4 --workloads code --batches 1 --temperatures 0 \
  --methods plain,ngram-auto --max-tokens 64 --prompts-per-point 4 --repeats 8 --no-peers \
  --curve-ks 0 >> "$OUT.log" 2>&1
echo "   rc=$? $(date -u +%H:%M:%S)"
