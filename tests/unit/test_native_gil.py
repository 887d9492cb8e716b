"""The native kernels release the GIL while they compute. The server's event loop runs on
another thread than the engine and streams the live rows' tokens while the next prefill
pass is in a kernel; a kernel holding the GIL kept them from clients for that whole pass
(`scripts/bench_long_arrival.py`). With the GIL held no other thread runs a line of Python
inside the call, so a tick in the middle half of a call cannot happen by chance."""

import threading
import time

import pytest
import torch

from specdec.kernels import native
from specdec.kernels.q4 import q4_quantize


def python_runs_during(call, tries: int = 5) -> bool:
    """Whether another thread records a tick in the middle half of one of `tries` calls."""
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        for _ in range(tries):
            start = time.perf_counter()
            call()
            end = time.perf_counter()
            quarter = (end - start) / 4
            if any(start + quarter < t < end - quarter for t in ticks):
                return True
    finally:
        stop.set()
        ticker.join()
    return False


def test_the_bf16_kernel_lets_other_threads_run(native_on):
    gemv = native.bf16_gemv()
    if gemv is None:
        pytest.skip("no native bf16 kernel on this machine")
    w = (torch.randn(4096, 1536) * 0.05).bfloat16()
    x = torch.randn(512, 1536).bfloat16().float()  # a prefill pass's rows: ~6 GFLOP
    assert python_runs_during(lambda: gemv(x, w, None))


def test_the_int4_kernel_lets_other_threads_run(native_on):
    gemv = native.q4_gemv()
    if gemv is None:
        pytest.skip("no native int4 kernel on this machine")
    q4 = q4_quantize(torch.randn(4096, 1536) * 0.05)
    x = torch.randn(512, 1536)
    assert python_runs_during(lambda: gemv(x, q4.qs, q4.sc, q4.mn, q4.d, q4.dmin))
