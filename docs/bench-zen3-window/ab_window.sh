#!/bin/sh
# Before (main) and after (window) in alternating processes, each with plain and auto in
# turns; usage: ab_window.sh ROUNDS TURNS OUT [MODEL ARGS...]
rounds=$1 turns=$2 out=$3; shift 3
py=/work/main/.venv/bin/python
here=$(dirname "$0")
for r in $(seq "$rounds"); do
  for v in before after; do
    if [ $v = before ]; then src=/work/wt-window-base; else src=/work/wt-window-after; fi
    PYTHONPATH=$src flock /tmp/specdec-real.lock $py "$here/ab_turns.py" --label $v --turns "$turns" "$@" >> "$out"
  done
done
