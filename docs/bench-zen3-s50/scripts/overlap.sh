#!/bin/bash
# alone with 2 threads, alone with 1, then both at once with 1 each (pinned to cores 0 and 1)
cd "$(dirname "$0")/../../.."
P=.venv/bin/python
for round in 1 2; do
echo "round $round"
echo -n "target 5 rows, 2T alone: "; THREADS=2 ROWS=5 $P docs/bench-zen3-s50/scripts/target_step.py 12 | grep median
echo -n "target 1 row, 2T alone: "; THREADS=2 ROWS=1 $P docs/bench-zen3-s50/scripts/target_step.py 12 | grep median
echo -n "draft 1 row, 2T alone: "; THREADS=2 $P docs/bench-zen3-s49/scripts/draft_step.py 8 | grep median
echo -n "target 5 rows, 1T alone: "; THREADS=1 ROWS=5 taskset -c 0 $P docs/bench-zen3-s50/scripts/target_step.py 12 | grep median
echo -n "draft 1 row, 1T alone: "; THREADS=1 taskset -c 1 $P docs/bench-zen3-s49/scripts/draft_step.py 8 | grep median
# together: start the target, wait for ready, then run the draft for a window inside the target's
THREADS=1 ROWS=5 taskset -c 0 $P docs/bench-zen3-s50/scripts/target_step.py 25 > /tmp/ov_t.out &
THREADS=1 taskset -c 1 $P docs/bench-zen3-s49/scripts/draft_step.py 40 > /tmp/ov_d.out &
wait
echo -n "together: target 5 rows 1T: "; grep median /tmp/ov_t.out
echo -n "together: draft 1 row 1T: "; grep median /tmp/ov_d.out
done
