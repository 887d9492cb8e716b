#!/usr/bin/env bash
# Stop 38's measurements after the eagle probe's training, one at a time (never two
# timed processes on the 2 cores): export, offline score, then the engine benches.
set -u
cd "$(dirname "$0")/../../.."
PY=.venv/bin/python
B=".venv/bin/specdec bench"
EAGLE=~/.cache/specdec/runs/qwen15-eagle-s38
MLP=~/.cache/specdec/runs/qwen15-heads-amx
COMMON="--workloads sharegpt --batches 1 --temperatures 0 --max-tokens 64 --prompts-per-point 4"
if [ "${1:-}" != "--benches" ]; then
  $PY docs/bench-xeon-s38/scripts/eagle_probe.py export --tag u3 --ks 5 --to $EAGLE
  $PY docs/bench-xeon-s38/scripts/eagle_probe.py score --tag u3 --ks 1,2,3,4,5
fi
$B --out bench-out/s38/eagle-int4 --quant int4 --heads $EAGLE $COMMON \
   --methods plain,draft-auto,heads-k1,heads-k3,heads-k5,heads-auto --repeats 3 --no-peers --curve-ks 0,1,3,5
[ "${1:-}" != "--benches" ] && $B --out bench-out/s38/mlp-int4 --quant int4 --heads $MLP $COMMON \
   --methods plain,heads-k3,heads-auto --repeats 3 --no-peers --curve-ks 0,1,3
$B --out bench-out/s38/eagle-bf16 --heads $EAGLE $COMMON \
   --methods plain,draft-auto,heads-k3,heads-auto --repeats 2 --no-peers --curve-ks 0,1,3
echo ALL DONE
