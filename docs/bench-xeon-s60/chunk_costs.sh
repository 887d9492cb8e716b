#!/usr/bin/env bash
# What prefilling in passes costs at the sweep's prompt-heavy points (scripts/chunk_cost.py).
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s60
run() {  # quant len batch chunks
  echo "== $1 $3x$2 chunks $4 $(date -u +%H:%M:%S)"
  .venv/bin/python $OUT/scripts/chunk_cost.py "${ROUNDS:-4}" "$1" "$2" "$3" "$4" \
    > "$OUT/chunk_cost-$1-$2x$3${SUFFIX:-}.txt" 2>> "$OUT/chunk_costs.log"
}
run int4 1024 1 512,256,128
run int4 1024 4 1024,512,64
run none 1024 4 512,256,128
run none 1024 1 512,256,128
run int4 256 4 128,64
