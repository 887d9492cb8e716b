#!/bin/bash
# Stop 59: the draft's cache allocated eagerly (EAGER=1, as before) or lazily (this stop),
# in turns of whole bench runs at int4 4 x 256, each run traced (`traced_bench.py`).
# Runs 0 were two single runs before this loop. Results in docs/bench-xeon-s59/traced/.
cd "$(dirname "$0")/../../.."
OUT=docs/bench-xeon-s59/traced
for i in 1 2; do
  for v in eager lazy; do
    e=0; [ $v = eager ] && e=1
    name=ab-$v-$i
    echo "== $name $(date -u +%T)"
    EAGER=$e TRACE=$OUT/trace-$name.jsonl .venv/bin/python docs/bench-xeon-s59/scripts/traced_bench.py \
      --out $OUT/$name --quant int4 --workloads synthetic --prompt-lens 256 --batches 4 \
      --temperatures 0 --methods plain,draft-auto,ngram-auto --max-tokens 64 \
      --prompts-per-point 4 --repeats 6 --k-max 8 --synthetic-source sharegpt --no-peers \
      --curve-ks 0 --interleave steps > $OUT/$name.log 2>&1
  done
done
