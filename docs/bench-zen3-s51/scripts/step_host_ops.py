"""What a plain decoding step does besides its pass: the operators it dispatches outside
`StaticPasses._forward` (which a GPU replays as one CUDA graph) and the host time they
take, on the CPU with a tiny random model (static passes run eagerly there).

On an H200 (docs/BENCHMARKS.md, stop 51) a plain step of the 1.5B took ~0.64 ms beyond
its 2.40 ms replay: the GPU waits while the host assembles the next pass's inputs and
reads the last one's tokens. Each operator counted here is a dispatcher call on any
device and, where it touches the model's device, a kernel launch or a copy on a GPU.

    python docs/bench-zen3-s51/scripts/step_host_ops.py [--steps 200]
"""

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.config import SamplingParams
from specdec.engine import Engine
from specdec.models import static_pass

sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from tiny import hf_tiny, native_from_hf, tiny_tokenizer  # noqa: E402

_inside = [False, 0.0]  # inside a pass; seconds spent in passes
_forward = static_pass.StaticPasses._forward


def _timed_forward(self, *args, **kwargs):
    _inside[0], t0 = True, time.perf_counter()
    try:
        return _forward(self, *args, **kwargs)
    finally:
        _inside[0] = False
        _inside[1] += time.perf_counter() - t0


static_pass.StaticPasses._forward = _timed_forward


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _inside[0]:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = native_from_hf(hf_tiny("qwen2"))
    for temperature in (0.0, 1.0):
        engine = Engine(model, tiny_tokenizer(), frozenset(), max_batch=1, static_passes=True)
        params = SamplingParams(
            temperature=temperature, max_tokens=args.steps + 1, ignore_eos=True, seed=1
        )
        engine.generate([[5, 6, 7]], params)  # warm-up
        host = []
        for _ in range(5):  # host time a step: step wall time minus its pass
            _inside[1], prefill, t0 = 0.0, engine.prefill_s, time.perf_counter()
            engine.generate([[5, 6, 7]], params)
            decode = time.perf_counter() - t0 - (engine.prefill_s - prefill)
            host.append((decode - _inside[1]) / args.steps)
        counter = Count()
        step = Engine._step

        def counted(self, *a, _counter=counter, _step=step, **k):
            with _counter:
                return _step(self, *a, **k)

        Engine._step = counted
        engine.generate([[5, 6, 7]], params)
        Engine._step = step
        per_step = sum(counter.ops.values()) / args.steps
        name = "greedy" if temperature == 0 else "sampled"
        print(
            f"{name}: {per_step:.1f} operators a step outside the pass; host time a step "
            f"(median of 5 runs) "
            f"{statistics.median(host) * 1e3:.3f} ms",
            flush=True,
        )
        for op, n in counter.ops.most_common(args.top):
            print(f"  {n / args.steps:5.1f}  {op}")


if __name__ == "__main__":
    main()
