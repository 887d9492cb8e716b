"""Native CPU kernels, compiled from this folder on first use (torch.utils.cpp_extension).

Only where a measured kernel needs it (DESIGN convention 10): `bf16_gemv` streams bf16
weights on CPUs without bf16 arithmetic, where every PyTorch bf16 kernel is several times
slower than the memory allows. The build lands in `$SPECDEC_HOME/native/<machine>` and is
reused by later processes; a machine that cannot build it (no compiler, no AVX2/FMA) gets
None, and `Linear` keeps its PyTorch kernels. `SPECDEC_NATIVE=0` turns native kernels off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


@cache
def bf16_gemv():
    """The compiled `bf16_gemv(x [R<=8, K] fp32, W [N, K] bf16) -> [R, N] fp32`, or None."""
    # Imported here: kernel_tuning imports linear.py, which imports this module.
    from specdec.models.kernel_tuning import cpu_info, machine

    if os.environ.get("SPECDEC_NATIVE", "1") == "0" or not {"avx2", "fma"} <= set(
        cpu_info()[1].split()
    ):
        return None
    try:
        from torch.utils.cpp_extension import load

        from specdec.models.registry import cache_root

        # The build depends on the CPU and torch, not on how many threads will run it.
        built_for = {k: v for k, v in machine().items() if k != "threads"}
        key = hashlib.sha256(json.dumps(built_for, sort_keys=True).encode()).hexdigest()[:16]
        build = cache_root() / "native" / key
        build.mkdir(parents=True, exist_ok=True)
        module = load(
            name="specdec_bf16_gemv",
            sources=[str(HERE / "bf16_gemv.cpp")],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
        return module.bf16_gemv
    except Exception as err:  # a missing compiler or headers: fall back, say why once
        log.warning("specdec: native bf16 kernel unavailable (%s); using PyTorch kernels", err)
        return None
