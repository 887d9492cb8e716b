"""`kernels.mapped.release`: pages of weights read from a mapped checkpoint go back to the
OS, the tensors still read the same values, and heap tensors are never touched."""

import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.kernels import mapped

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")


def _resident_kb(path) -> int:
    """Resident kB of this process's mappings of `path`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if "-" in line.split(" ", 1)[0]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_released_pages_leave_memory_and_the_values_stay(tmp_path):
    weights = {"a": torch.randn(1024, 1024), "b": torch.randn(64)}  # 4 MB and a crumb
    file = tmp_path / "model.safetensors"
    save_file(weights, str(file))
    with safe_open(str(file), framework="pt") as f:
        a, b = f.get_tensor("a"), f.get_tensor("b")
    assert torch.equal(a, weights["a"])  # every page of `a` read, so resident
    resident = _resident_kb(file)
    assert resident >= 4000
    freed = mapped.release([a, b])
    assert freed >= 4 * 1024 * 1024 - 2 * 4096  # whole pages inside `a`; `b` shares its page
    assert _resident_kb(file) <= resident - freed // 1024 + 8
    assert torch.equal(a, weights["a"]) and torch.equal(b, weights["b"])  # read back from the file


def test_heap_tensors_are_left_alone():
    heap = torch.randn(1024, 1024)
    copy = heap.clone()
    assert mapped.release([heap, heap[:, :3]]) == 0
    assert torch.equal(heap, copy)
