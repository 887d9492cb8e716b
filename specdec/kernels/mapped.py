"""Handing back the memory pages of weights read from a memory-mapped checkpoint.

Why: safetensors maps a checkpoint file privately and every tensor read from it is a view
of that one mapping, so each page a load touched stays resident for as long as any tensor
of the file lives (a bf16 model's embedding alone keeps the whole file mapped). Tensors
whose values now live elsewhere (projections fused into one tensor, weights packed into
panels) can give their pages back: `madvise(MADV_DONTNEED)` drops them, and a later read,
if any, faults them in again from the file. That is exact for pages never written, and
checkpoint weights never are (models compute from them, never into them). Only mappings of
`.safetensors` files are touched; heap memory never is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from collections.abc import Iterable
from functools import cache

import torch

_MADV_DONTNEED = 4  # Linux <sys/mman.h>


@cache
def _madvise():
    """libc's madvise, or None where there is none to call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


def _checkpoint_regions() -> list[tuple[int, int]]:
    """[start, end) of this process's mappings of `.safetensors` files."""
    regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(".safetensors"):
                start, end = line.split(None, 1)[0].split("-")
                regions.append((int(start, 16), int(end, 16)))
    return regions


def release(tensors: Iterable[torch.Tensor]) -> int:
    """Drop the resident pages wholly inside each tensor's bytes where the tensor is a view
    of a mapped `.safetensors` file (others are left alone); the bytes given back."""
    advise = _madvise()
    page = mmap.PAGESIZE
    tensors = [  # a tensor under a page holds no whole page: no need to read the maps
        t
        for t in tensors
        if t is not None and t.device.type == "cpu" and t.numel() * t.element_size() >= page
    ]
    if advise is None or not tensors:
        return 0
    regions = _checkpoint_regions()
    freed = 0
    for t in tensors:
        first = t.data_ptr()
        last = first + t.numel() * t.element_size()  # contiguous views only (below)
        if not t.is_contiguous() or not any(s <= first and last <= e for s, e in regions):
            continue
        start, end = -(-first // page) * page, last // page * page  # whole pages inside
        if end > start and advise(start, end - start, _MADV_DONTNEED) == 0:
            freed += end - start
    return freed
