#!/usr/bin/env bash
# The target alone in the process (no draft model loaded, `specdec generate` without
# --draft): stop 58's script saw no page faults there at int4, and passes cost it
# 1.06-1.12x. The default chunk against one pass.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s60
for shape in "1024 4" "1024 1"; do
  set -- $shape
  echo "== int4 $2x$1 target alone $(date -u +%H:%M:%S)"
  NO_DRAFT=1 .venv/bin/python $OUT/scripts/chunk_cost.py "${ROUNDS:-4}" int4 "$1" "$2" 512 \
    > "$OUT/chunk_cost-int4-$1x$2-no-draft.txt" 2>> "$OUT/chunk_costs.log"
done
