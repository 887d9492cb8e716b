#!/usr/bin/env bash
# The default chunk (`PREFILL_CHUNK_CPU`, 512 positions a pass, its rows together) against
# one pass, at the batch-4 points, after `prefill_chunk` became positions per pass (the
# runs of chunk_costs.sh that started before 22:10 UTC took it per row: 4 x the positions).
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s60
run() {  # quant len batch chunks
  echo "== $1 $3x$2 chunks $4 $(date -u +%H:%M:%S)"
  .venv/bin/python $OUT/scripts/chunk_cost.py "${ROUNDS:-4}" "$1" "$2" "$3" "$4" \
    > "$OUT/chunk_cost-$1-$2x$3-per-pass.txt" 2>> "$OUT/chunk_costs.log"
}
run int4 256 4 512
run int4 1024 4 512,1024
run none 1024 4 512,1024
run none 256 4 512
