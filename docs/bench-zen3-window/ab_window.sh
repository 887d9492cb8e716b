#!/bin/sh
# Before and after a change in alternating processes, each with plain and auto in turns.
# usage: BEFORE=DIR AFTER=DIR ab_window.sh ROUNDS TURNS OUT [ab_turns.py args...]
# (DIR: a checkout whose specdec/ is imported, e.g. `git worktree add --detach DIR 1f7ab6a`
# for the code before, and a copy of this branch's specdec/ for after, frozen for the run)
rounds=$1 turns=$2 out=$3; shift 3
py=/work/main/.venv/bin/python
here=$(dirname "$0")
for r in $(seq "$rounds"); do
  for v in before after; do
    if [ $v = before ]; then src=$BEFORE; else src=$AFTER; fi
    PYTHONPATH=$src flock /tmp/specdec-real.lock $py "$here/ab_turns.py" --label $v --turns "$turns" "$@" >> "$out"
  done
done
