"""`specdec bench` itself with `auto`'s choice at every step logged to stderr: the bench's
own turns, where `auto_trace_256x4.py` (one process, runs alone) could not reproduce the
bf16 256 x 4 runs that stop drafting after one look. Usage: python bench_traced.py <bench
arguments>"""

import sys

from specdec.cli import main
from specdec.cost_model import AdaptiveWindow

choose = AdaptiveWindow.choose


def traced(self, rows, catch_up=0, remaining=None):
    k = choose(self, rows, catch_up, remaining)
    c = self.costs
    best = c.best_window(rows, self.alpha, self.k_max) if c.draft_time(rows) else None
    print(
        f"TRACE rows {rows} catch_up {catch_up} remaining {remaining} -> k {k}; "
        f"off {self._off} alpha {[round(a, 2) for a in self.alpha[:3]]} "
        f"plain {c.verify_time(rows, 1)} draft {c.draft_time(rows)} best {best}",
        file=sys.stderr,
        flush=True,
    )
    return k


AdaptiveWindow.choose = traced
sys.exit(main(["bench", *sys.argv[1:]]))
