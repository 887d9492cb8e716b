"""Trace ngram-auto at the quick preset's code, batch 4, T=1 point."""

import statistics
import sys
import time

import torch

from specdec.bench.plan import Point
from specdec.bench.runner import Runner
from specdec.cost_model import AdaptiveWindow

torch.set_num_threads(2)
log = []
orig = AdaptiveWindow.observe


def observe(
    self,
    rows,
    k,
    verify_s,
    draft_s,
    drafted_at,
    accepted_at,
    draft_first_s=None,
    width=None,
    judged=None,
):
    log.append((rows, k, verify_s, draft_s, list(drafted_at), list(accepted_at)))
    return orig(
        self, rows, k, verify_s, draft_s, drafted_at, accepted_at, draft_first_s, width, judged
    )


AdaptiveWindow.observe = observe
from specdec.engine import Engine  # noqa: E402

steps = []
_orig_step = Engine._step


def _step(self, live, cache, drafter):
    t = time.perf_counter()
    out = _orig_step(self, live, cache, drafter)
    steps.append(len(live))
    times.append((self.last_window, time.perf_counter() - t))
    return out


times = []
Engine._step = _step

temp = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 4
workload = sys.argv[3] if len(sys.argv) > 3 else "code"
plen = int(sys.argv[4]) if len(sys.argv) > 4 else None
r = Runner("smollm2-135m-instruct", None, "bf16", "cpu", 8, 32, 4)
pts = [Point(workload, plen, batch, temp, m) for m in ("plain", "ngram-auto")]
for p in pts:
    r.start(p)
res = {}
for rep in range(5):
    for p in pts:
        log.clear()
        steps.clear()
        times.clear()
        t = r.start(p) if False else None
        trial = r.start(p)
        r.run_once(trial)
        wall = trial.runs[-1][0]
        toks = sum(len(x) for x in trial.runs[-1][2])
        res.setdefault(p.method, []).append(toks / wall)
        if rep == 4:
            for kk in sorted(set(t[0] for t in times)):
                xs = [t[1] for t in times if t[0] == kk]
                print(
                    p.method,
                    "step k",
                    kk,
                    "n",
                    len(xs),
                    "median ms",
                    round(1000 * statistics.median(xs), 2),
                    "sum",
                    round(sum(xs), 3),
                )
            print(
                p.method,
                "tokens",
                [len(x) for x in trial.runs[-1][2]],
                "steps",
                len(steps),
                "row-steps",
                sum(steps),
                "hist",
                {b: steps.count(b) for b in sorted(set(steps))},
                "wall",
                round(wall, 3),
                "prefill",
                round(trial.runs[-1][4], 3),
            )
        if rep == 4 and p.method != "plain":
            print(p.method, "steps", len(log))
            ks = [entry[1] for entry in log]
            print(" k hist", {k: ks.count(k) for k in sorted(set(ks))})
            by = {}
            for rows, k, v, _d, _da, _aa in log:
                by.setdefault((rows, k), []).append(v)
            for key, vs in sorted(by.items()):
                print(
                    "  rows,k",
                    key,
                    "n",
                    len(vs),
                    "verify ms med",
                    round(1000 * statistics.median(vs), 2),
                )
            drafted0 = [entry[4][0] if entry[4] else 0 for entry in log if entry[1] > 0]
            rowsk = [entry[0] for entry in log if entry[1] > 0]
            print(" rows drafting pos0 / rows", sum(drafted0), "/", sum(rowsk))
            acc = sum(sum(entry[5]) for entry in log if entry[1] > 0)
            print(" accepted tokens total", acc, "spec steps", len(rowsk))
            print(
                " seq",
                " ".join(
                    f"{entry[1]}:{entry[0]}:{entry[4][0] if entry[4] else '-'}/{sum(entry[5])}"
                    for entry in log
                ),
            )
for m, v in res.items():
    print(m, [round(x, 1) for x in v], "median", round(statistics.median(v), 1))
# per row of the last run of each method
