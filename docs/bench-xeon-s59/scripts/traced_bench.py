"""`specdec bench` with every engine admission traced: which method's engine, the cache and
drafter set-up (`_ensure_cache`), the target's prefill (`_prefill`), the rest of the
admission (the drafter's admit, the window's bookkeeping), kernel CPU time, page faults and
the process's RSS, one JSON line per admission in TRACE (env, default trace.jsonl). Why:
stop 58 found draft-auto's wall time before decoding (`prefill_s`) above plain's in 9 of
12 turns at int4 256 x 4 inside the bench's step-by-step runs, and not outside them.

    python traced_bench.py <specdec bench arguments>

EAGER=1 restores the draft's cache as it was before stop 59: allocated when the drafter is
built (in the engine's `_ensure_cache`, before the first prefill), not at its first step
that drafts.
"""

import json
import os
import resource
import sys
import time

from specdec.bench import runner as bench_runner
from specdec.cli import main
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine import Engine

TRACE = open(os.environ.get("TRACE", "trace.jsonl"), "a")  # noqa: SIM115
parts: dict[str, float] = {}


def method_of(engine: Engine) -> str:
    factory = engine.drafter_factory
    if factory is None:
        return "plain"
    return "ngram-auto" if factory is bench_runner._ngram_factory else "draft-auto"


def timed(name, fn):
    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def traced_admit(admit):
    def wrapper(self):
        if not self.waiting:
            return admit(self)
        parts.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0, t0 = time.process_time(), time.perf_counter()
        out = admit(self)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        row = {
            "at": time.strftime("%H:%M:%S"),
            "engine": id(self) % 100000,
            "method": method_of(self),
            "rows": len(out),
            "wall": wall,
            "ensure": parts.get("ensure", 0.0),
            "prefill": parts.get("prefill", 0.0),
            "rest": wall - parts.get("ensure", 0.0) - parts.get("prefill", 0.0),
            "cpu": cpu,
            "sys": r1.ru_stime - r0.ru_stime,
            "faults_k": (r1.ru_minflt - r0.ru_minflt) / 1e3,
            "rss_gb": rss_gb(),
        }
        TRACE.write(json.dumps(row) + "\n")
        TRACE.flush()
        return out

    return wrapper


Engine._prefill = timed("prefill", Engine._prefill)
Engine._ensure_cache = timed("ensure", Engine._ensure_cache)
Engine._admit = traced_admit(Engine._admit)

if os.environ.get("EAGER") == "1":
    built = DraftModelDrafter.__init__

    def eager_init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.cache  # noqa: B018 the property allocates it

    DraftModelDrafter.__init__ = eager_init

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
