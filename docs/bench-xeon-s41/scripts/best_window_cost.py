"""Microseconds per `CostModel.best_window` call at batch 1 with 6 timed verify widths,
without kernel plans and with the int4 1.5B's (the projections' floor, `PlanGrowth`).

    python best_window_cost.py
"""

import time

from specdec.cost_model import AdaptiveWindow

PLANS = {1: 1.0, 2: 0.949, 4: 0.975, 8: 1.302, 16: 2.425, 32: 4.101, 64: 3.889, 256: 9.88}
for plans in (False, True):
    w = AdaptiveWindow()
    if plans:
        w.set_plan_seconds(PLANS, {})
    for t, s in {1: 0.040, 2: 0.043, 3: 0.045, 4: 0.05, 5: 0.052, 6: 0.055}.items():
        for _ in range(3):
            w.costs.observe_verify(1, t, s)
    w.costs.observe_draft(1, 3, 0.006)
    w.observe(1, 3, 0.05, 0.006, [1, 1, 1], [1, 1, 0])
    n = 2000
    started = time.perf_counter()
    for _ in range(n):
        w.costs.best_window(1, w.alpha, 8)
    per_call = (time.perf_counter() - started) / n * 1e6
    print("int4 plans" if plans else "no plans", f"{per_call:.0f} us per best_window")
