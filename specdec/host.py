"""Host probes: the read bandwidth and fp32 arithmetic of the machine at hand, which the
doctor reports and the bench records beside each point (why a point ran slow)."""

from __future__ import annotations

import time

import torch


def read_bandwidth_gbs(gib: float = 1.0, repeats: int = 5) -> float:
    """Sustained read bandwidth: the fastest of `repeats` sums over a buffer far larger
    than the caches."""
    x = torch.ones(int(gib * 2**30 / 4), dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def matmul_gflops(threads: int, n: int = 256, seconds: float = 0.3) -> float:
    """fp32 GEMM rate of cache-resident n x n matrices on `threads` threads (the fastest
    call over `seconds`): the arithmetic that bounds a verify pass of many rows, where one
    row is bound by the read bandwidth."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best, end = float("inf"), time.perf_counter() + seconds
        while True:  # at least one timed call, whatever `seconds` and a descheduled host do
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
            if time.perf_counter() >= end:
                return 2 * n**3 / best / 1e9
    finally:
        torch.set_num_threads(previous)


# All threads over one thread below this: the threads share cores at the moment. Why: on a
# 2-vCPU EPYC VM two single-thread FMA loops ran 5.6-5.7 FMA/ns each in most minutes and
# 2.95 each in one (archived runs, commit 1f7ab6a): the host had put both vCPUs on one
# core's hardware threads, and `lscpu` said 2 cores either way.
SHARED_CORES_SCALING = 1.4


def arithmetic(threads: int, seconds: float = 0.3) -> dict:
    """fp32 GEMM GFLOP/s on one thread and on `threads` (each the fastest call over
    `seconds`), and their ratio."""
    one = matmul_gflops(1, seconds=seconds)
    every = matmul_gflops(threads, seconds=seconds) if threads > 1 else one
    return {
        "threads": threads,
        "one_thread_gflops": round(one, 1),
        "all_threads_gflops": round(every, 1),
        "scaling": round(every / one, 2),
    }
