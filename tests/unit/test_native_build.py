"""Every native kernel builds wherever the machine can build it.

Why a test of its own: the kernels fall back to PyTorch when a build fails (a machine
without a compiler or AVX2 must still run), and their tests then skip; a compile error
would pass unseen. Here a failed build on a machine with a compiler and AVX2 + FMA fails,
with the compiler's message.
"""

import pytest

from specdec.kernels import native


@pytest.mark.parametrize("name", native.KERNELS)
def test_each_kernel_builds_where_it_can(native_on, name):
    if not native.buildable():
        pytest.skip(f"no C++ compiler ({native.compiler()}) or no AVX2 + FMA on this machine")
    native.build_errors.pop(name, None)
    built = {"bf16_gemv": native.bf16_gemv, "q4_gemv": native.q4_gemv}.get(
        name, native.decode_stack
    )()
    assert built is not None, (
        f"native kernel {name} failed to build: {native.build_errors.get(name)}"
    )


def test_a_failed_build_is_reported_not_hidden(native_on, monkeypatch):
    """A build that raises is recorded with its reason (what the test above prints) and
    the caller gets None (the PyTorch fallback), never an exception at load."""
    import torch.utils.cpp_extension as cpp

    if not native.buildable():
        pytest.skip("no C++ compiler or no AVX2 + FMA on this machine")

    def broken(**kwargs):
        raise RuntimeError("error: expected ';' before '}' token")

    monkeypatch.setattr(cpp, "load", broken)
    assert native.q4_gemv() is None
    assert "expected ';'" in native.build_errors["q4_gemv"]
