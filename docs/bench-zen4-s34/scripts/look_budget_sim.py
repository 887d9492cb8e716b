"""The first look's budget, simulated (short requests, a catch-up priced a little over a
tenth of a request): auto with the plain steps spent counted, and without (stop 34)."""

import sys

sys.path.insert(0, "tests/unit")
from test_adaptive_window import serve_lazy

from specdec import cost_model as cm
from specdec.cost_model import AdaptiveWindow, FixedWindow

TARGET = {1: 1.0, 2: 1.02, 4: 1.06, 8: 1.15, 16: 1.3, 32: 1.6}
DRAFT = {1: 0.4, 2: 0.41, 4: 0.43, 8: 0.5, 16: 0.9, 32: 1.5}


def planned():
    w = AdaptiveWindow()
    w.set_plan_seconds(TARGET, DRAFT)
    return w


pair = dict(
    c=0.3, verify=lambda t, ctx: 1 + 0.05 * (t - 1), prompt=20, prefill=0.25, ratio=0.3, tokens=32
)
for a in (0.9, 0.7, 0.5):
    for req in (1, 4):
        plain = serve_lazy(lambda: FixedWindow(0), a=a, requests=req, **pair)
        k3 = serve_lazy(lambda: FixedWindow(3), a=a, requests=req, **pair)
        auto = serve_lazy(planned, a=a, requests=req, **pair)
        orig = AdaptiveWindow._cheap_look

        def old(self, rows, catch_up, remaining):
            cost = self.costs.catch_up_time(catch_up)
            plain_s = self.costs.verify_time(rows, 1)
            return (
                cost is not None
                and plain_s is not None
                and cost <= cm.EXPLORE_SHARE * remaining * plain_s / rows
            )

        AdaptiveWindow._cheap_look = old
        auto_old = serve_lazy(planned, a=a, requests=req, **pair)
        AdaptiveWindow._cheap_look = orig
        print(
            a,
            req,
            "k3",
            round(k3 / plain, 3),
            "auto",
            round(auto / plain, 3),
            "old",
            round(auto_old / plain, 3),
        )
