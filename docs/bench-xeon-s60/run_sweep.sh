#!/usr/bin/env bash
# Issue 13's floor (`auto` >= 0.97x plain end to end, every drafter) with the engines'
# default chunked prefill (--prefill-chunk auto: passes of 512 positions on a CPU, stop
# 60) and the methods taking turns step by step and pass by pass (--interleave steps):
# one method's pass is then a second or two from the others', where a whole 22-25 s
# prefill saw a different minute of this host's speed (stop 59). The command is stop 59's
# sweep otherwise; CHUNK=0 runs it with one-pass prefills. Each point is its own folder,
# so a group resumes at its next turn (`<out>/turns/`) when rerun; a finished folder is
# skipped.
set -u
cd "$(dirname "$0")/../.."
OUT=docs/bench-xeon-s60
CHUNK=${CHUNK:-auto}
for quant in ${QUANTS:-int4}; do
  for len in ${LENS:-1024}; do
    for batch in ${BATCHES:-4 1}; do
      name=sweep-$quant-${len}x$batch$([ "$CHUNK" = auto ] || echo -c$CHUNK)${SUFFIX:-}
      echo "== $name $(date -u +%H:%M:%S)"
      .venv/bin/specdec bench --out "$OUT/$name" --quant "$quant" --workloads synthetic \
        --prompt-lens "$len" --batches "$batch" --temperatures 0 \
        --methods plain,draft-auto,ngram-auto --max-tokens 64 --prompts-per-point 4 \
        --repeats "${REPEATS:-8}" --k-max 8 --synthetic-source sharegpt --no-peers \
        --curve-ks 0 --interleave steps --prefill-chunk "$CHUNK" >> "$OUT/$name.log" 2>&1
      echo "   rc=$? $(date -u +%H:%M:%S)"
    done
  done
done
