"""An experiment, not shipped: `specdec bench` with `auto`'s first look held for 8 steps
(k >= 1 for the 7 steps after the step that caught the draft up, then `auto` as it is),
so that a run's choice rests on 8 steps' timings and draws, not one. Usage: python
bench_look8.py <bench arguments>"""

import sys

from specdec.cli import main
from specdec.cost_model import AdaptiveWindow

choose = AdaptiveWindow.choose
HOLD = 7


def held(self, rows, catch_up=0, remaining=None):
    k = choose(self, rows, catch_up, remaining)
    left = getattr(self, "_look_left", None)
    if left is None and k > 0 and catch_up > 0:  # the first look starts
        self._look_left = HOLD
    elif left and catch_up == 0:
        self._look_left = left - 1
        k = max(k, 1)
        self._drafting = True
    return k


AdaptiveWindow.choose = held
sys.exit(main(["bench", *sys.argv[1:]]))
