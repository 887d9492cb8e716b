import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# Every test measures `auto`'s costs afresh (test_cost_cache turns the warm start back on);
# set here, at import, so the servers tests start inherit it.
os.environ["SPECDEC_COST_CACHE"] = "0"
# The native kernel is built (~30 s, once per machine) only by the test that checks it.
os.environ.setdefault("SPECDEC_NATIVE", "0")
# Loads build their int4 models afresh (test_model_store turns the store back on).
os.environ["SPECDEC_MODEL_STORE"] = "0"

from tiny import hf_tiny, native_from_hf, tiny_tokenizer  # noqa: E402


@pytest.fixture(autouse=True)
def _fast_threads():
    # Tests run tiny models: one thread avoids oversubscription with pytest's own work.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_tuning_budget():
    # The tuning budget is the process's: each test starts with a whole one (as a process).
    from specdec.kernels import tuning_budget

    tuning_budget.reset()


@pytest.fixture(scope="session")
def script():
    """Import `scripts/NAME.py` (not a package) as a module: `script("bench_gpu")`."""

    def load(name: str):
        path = Path(__file__).parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def hf_and_native(request):
    hf = hf_tiny(request.param)
    return hf, native_from_hf(hf)


@pytest.fixture
def native_on(monkeypatch):
    """The native kernels on for one test (the suite runs without them by default)."""
    from specdec.kernels import native

    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    accessors = (native.bf16_gemv, native.q4_gemv, native.q4_tiles, native.decode_stack)
    for accessor in accessors:
        accessor.cache_clear()
    yield native
    for accessor in accessors:
        accessor.cache_clear()


@pytest.fixture(scope="module")
def invariant_native_kernels():
    """The native bf16 kernels and decode stack on, in the batch-invariant mode (the
    default), for a module's tests; skipped where they cannot build (test_native_build
    fails then)."""
    from specdec.kernels import native

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_NATIVE", "1")
        patch.delenv("SPECDEC_BF16_INVARIANT", raising=False)
        kernels = native.bf16_gemv, native.decode_stack
        for kernel in kernels:
            kernel.cache_clear()
        if any(kernel() is None for kernel in kernels):
            pytest.skip("native kernels unavailable (no compiler or AVX2)")
        yield
    for kernel in kernels:
        kernel.cache_clear()
