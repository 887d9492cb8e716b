#!/usr/bin/env bash
# Issue 13's floor (`auto` >= 0.97x plain across the batch x prompt-length sweep, every
# drafter) on this Xeon with stop 57's window and stop 59's lazy draft cache, the methods taken in turns step by step (--interleave steps): the int4 pair (stop 43's command on this
# CPU family, without heads) and the bf16 target with its int4 draft. Each point is its
# own folder, so a group resumes at its next turn (`<out>/turns/`) when rerun.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s59
for quant in ${QUANTS:-int4 none}; do
  for len in ${LENS:-256 1024}; do
    for batch in ${BATCHES:-1 4}; do
      name=sweep-$quant-${len}x$batch${SUFFIX:-}
      echo "== $name $(date -u +%H:%M:%S)"
      .venv/bin/specdec bench --out "$OUT/$name" --quant "$quant" --workloads synthetic \
        --prompt-lens "$len" --batches "$batch" --temperatures 0 \
        --methods plain,draft-auto,ngram-auto --max-tokens 64 --prompts-per-point 4 \
        --repeats "${REPEATS:-5}" --k-max 8 --synthetic-source sharegpt --no-peers \
        --curve-ks 0 --interleave "${INTERLEAVE:-steps}" >> "$OUT/$name.log" 2>&1
      echo "   rc=$? $(date -u +%H:%M:%S)"
    done
  done
done
