"""Native CPU kernels, compiled from this folder on first use (torch.utils.cpp_extension).

Only where a measured kernel needs it (DESIGN convention 10): `bf16_gemv` streams bf16
weights on CPUs without bf16 arithmetic, where every PyTorch bf16 kernel is several times
slower than the memory allows; `q4_gemv` multiplies 4-bit weights by int8-quantized
activations with integer dot products, where PyTorch's int4 kernel is compute-bound;
`decode_stack` runs every layer of an int4 decode step in one call, where PyTorch's
per-op dispatch costs more than the arithmetic of a few rows.
The build lands in `$SPECDEC_HOME/native/<machine>` and is reused by later processes; a
machine that cannot build it (no compiler, no AVX2/FMA) gets None, and `Linear` keeps its
PyTorch kernels. `SPECDEC_NATIVE=0` turns native kernels off; `SPECDEC_NATIVE_ISA=avx2`
builds the AVX2 paths on a CPU that has AVX-512 too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from functools import cache
from pathlib import Path

import torch

from specdec.kernels.cpu import cpu_info

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


@cache
def bf16_gemv():
    """The compiled `bf16_gemv(x [R, K] fp32, W [N, K] bf16, panels=None) -> [R, N] fp32`
    (`panels`: W in the panel layout, `linear.pack_panels`), or None."""
    module = _module("bf16_gemv")
    return None if module is None else module.bf16_gemv


def bf16_panels() -> bool:
    """Whether `bf16_gemv` is given its weights in the panel layout (`linear.pack_panels`):
    wherever it is built (AVX2 and AVX-512), measured faster than
    the row layout on a Zen 3 (AVX2) and a Zen 4 (AVX-512); the row layout stays for
    callers that give no panels. Follows `bf16_gemv`'s cache (and its `cache_clear`)."""
    return bf16_gemv() is not None


def bf16_panel_layouts() -> list[tuple[int, int]]:
    """The panel layouts the build reads, as (outputs a panel, k of one output side by side
    in a line), its default first (bf16_kernel.h): [(8, 1)] in AVX2 builds, [(32, 1)] in
    AVX-512 ones (fp32 FMAs), [(16, 2), (32, 1)] in AVX-512 BF16 ones (`vdpbf16ps` on
    pairs, or the FMAs: which is faster differs by CPU, `tuning.tune_bf16_panels`)."""
    if bf16_gemv() is None:
        return [(8, 1)]
    return [tuple(layout) for layout in _loaded["bf16_gemv"].LAYOUTS]


_panel_layout: tuple[int, int] | None = None  # set by `set_bf16_panel_layout`; None: default


def set_bf16_panel_layout(layout: tuple[int, int]) -> None:
    """Pack bf16 weights for the native kernel in `layout` (one of `bf16_panel_layouts()`)
    from now on. Weights packed before keep their layout: the kernel reads every layout of
    its build, telling them apart by shape."""
    global _panel_layout
    layout = tuple(layout)
    if layout not in bf16_panel_layouts():
        raise ValueError(f"bf16 panel layout {layout}: this build reads {bf16_panel_layouts()}")
    _panel_layout = layout


def bf16_panel_layout() -> tuple[int, int]:
    """The layout weights are packed in (`set_bf16_panel_layout`, else the build's default)."""
    layouts = bf16_panel_layouts()
    return _panel_layout if _panel_layout in layouts else layouts[0]


def bf16_panel_width() -> int:
    """Outputs per panel of the layout in force (`bf16_panel_layout`); only meaningful
    where `bf16_panels()`."""
    return bf16_panel_layout()[0]


def bf16_panel_kstep() -> int:
    """Consecutive k of one output in a panel's line (`linear.pack_panels`' `kstep`) in the
    layout in force: 2 in the pair layout, whose `vdpbf16ps` multiplies pairs, else 1."""
    return bf16_panel_layout()[1]


@cache
def q4_gemv():
    """The compiled `q4_gemv(x [R, K] fp32, qs, sc, mn, d, dmin) -> [R, N] fp32` (the format
    in q4_gemv.cpp and `q4.Q4Weights`), or None."""
    module = _module("q4_gemv")
    return None if module is None else module.q4_gemv


@cache
def q4_tiles():
    """The compiled `q4_tiles(qs, sc, mn, d, dmin) -> u8 [N / 16, S, block]`: the int4
    weights in the tile layout q4_kernel.h describes, which `q4_gemv(..., tiles=)` and the
    decode stack read in AVX-512 builds (a third of the instructions per extra row of a
    verify pass); None where the build has no tile path."""
    module = _module("q4_gemv")
    return module.q4_tiles if module is not None and module.TILES else None


@cache
def decode_stack():
    """The compiled `DecodeStack` class (decode_stack.cpp: every decoder layer of a small
    int4 step in one call), or None."""
    module = _module("decode_stack")
    return None if module is None else module.DecodeStack


# How the int4 tile layout prefetches (q4_kernel.h's tile_prefetch): 0 into L1, 1 into L2.
TILE_PREFETCH_LEVELS = (0, 1)
_tile_prefetch = 0
_loaded: dict[str, object] = {}  # kernel name -> the module it was last taken from


def set_tile_prefetch(level: int) -> None:
    """Make the int4 tile layout prefetch into L1 (0) or L2 (1), in the native module loaded
    or still to load: which streams faster depends on the CPU, so it is chosen by timing
    here (`tuning.tune_prefetch`). The products are the same either way."""
    global _tile_prefetch
    if level not in TILE_PREFETCH_LEVELS:
        raise ValueError(f"tile prefetch level {level!r}: expected one of {TILE_PREFETCH_LEVELS}")
    _tile_prefetch = level
    for module in _loaded.values():
        module.set_tile_prefetch(level)


def tile_prefetch() -> int:
    """The int4 tile layout's prefetch level in force (see `set_tile_prefetch`)."""
    return _tile_prefetch


def _module(name: str):
    """The built module with the settings in force, for the kernel `name` (its build error
    recorded under that name), or None (see `_build`)."""
    module = _build()
    if module is None:
        build_errors[name] = build_errors.get("native", "native kernels off")
        return None
    _loaded[name] = module
    module.set_tile_prefetch(_tile_prefetch)
    return module


@cache
def sources_digest() -> str:
    """A digest of this folder's C++ sources: the native kernels' version."""
    sources = sorted([*HERE.glob("*.cpp"), *HERE.glob("*.h")])
    text = json.dumps([(path.name, path.read_text()) for path in sources])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# Compiler flags per instruction set the kernels have a path for. With AVX-512 (F, BW, VL
# and VNNI) the int4 product takes its integer dot products 512 bits and four products at
# a time (q4_kernel.h) and the bf16 one widens and multiplies 16 weights at a time. With
# AVX-512 BF16 too, the bf16 product can also multiply pairs of bf16 with `vdpbf16ps`, in a
# layout of its own (`bf16_panel_layouts`): on a Zen 4 1.6-1.7x the fp32 FMAs' rate, on a
# Xeon with AMX slower than them at 5-8 rows, so which layout a machine packs is timed
# (`tuning.tune_bf16_panels`). `SPECDEC_NATIVE_ISA=avx512` builds without it. With
# AMX (tiles and BF16) the pair panels are multiplied on AMX tiles instead (bf16_kernel.h:
# 2-16 rows at the cost of one); `SPECDEC_NATIVE_ISA=avx512bf16` builds without them.
_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
_AVX512BF16 = [*_AVX512, "-mavx512bf16"]
ISA_FLAGS = {
    "avx2": [],
    "avx512": _AVX512,
    "avx512bf16": _AVX512BF16,
    "amx": [*_AVX512BF16, "-mamx-tile", "-mamx-bf16"],
}
BASE_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]  # every build's, before its ISA_FLAGS
_AVX512_NEEDS = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
ISA_NEEDS = {
    "avx2": {"avx2", "fma"},
    "avx512": _AVX512_NEEDS,
    "avx512bf16": {*_AVX512_NEEDS, "avx512_bf16"},
    "amx": {*_AVX512_NEEDS, "avx512_bf16", "amx_tile", "amx_bf16"},
}


def instruction_set(flags: set[str]) -> str:
    """The widest instruction set the CPU's flags allow, unless `SPECDEC_NATIVE_ISA` names
    a narrower one (to compare the two builds on one machine)."""
    order = list(ISA_FLAGS)  # narrowest first
    widest = max((isa for isa in order if ISA_NEEDS[isa] <= flags), key=order.index, default="avx2")
    asked = os.environ.get("SPECDEC_NATIVE_ISA", widest)
    if asked not in ISA_FLAGS:
        raise ValueError(f"SPECDEC_NATIVE_ISA={asked!r}: expected one of {order}")
    return min(asked, widest, key=order.index)


STALE_LOCK_S = 600  # a build takes a minute or two: a lock this old outlived its process


def _clear_stale_lock(build: Path) -> None:
    """Remove torch's build lock in `build` where no build can still hold it. A process
    killed mid-build leaves the lock behind, and every later process then waits on it
    forever (seen: a test run stalled for 12 minutes behind one, until it was removed)."""
    lock = build / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("specdec: removing a stale build lock (%.0f s old): %s", age, lock)
        lock.unlink(missing_ok=True)


def build_identity() -> dict[str, str | int]:
    """What a native build is keyed by: the CPU, its features, cores, torch, the sources'
    digest and the instruction set built for (`tuning.machine` adds what plans depend on)."""
    model, flags = cpu_info()
    return {
        "cpu": model,
        "flags": hashlib.sha256(flags.encode()).hexdigest()[:12],
        "cores": os.cpu_count() or 1,
        "torch": torch.__version__,
        "native": sources_digest(),
        "isa": instruction_set(set(flags.split())),  # which native paths are built
    }


SOURCES = ("module.cpp", "bf16_gemv.cpp", "q4_gemv.cpp", "decode_stack.cpp")


def _build():
    """Compile (or load the earlier build of) the one module of this folder's `SOURCES`, or
    None where it cannot be (the reason in `build_errors["native"]`)."""
    flags = set(cpu_info()[1].split())
    if os.environ.get("SPECDEC_NATIVE", "1") == "0" or not ISA_NEEDS["avx2"] <= flags:
        return None
    try:
        from torch.utils.cpp_extension import load

        from specdec.console import status
        from specdec.paths import cache_root

        # The build depends on the CPU, torch, the sources and the instruction set (torch
        # alone would not rebuild for a changed header), not on how many threads run it or
        # on the PyTorch-side kernels.
        built_for = build_identity()
        # And where the sources are: torch rebuilds a module whose source paths differ from
        # its last build's, so two checkouts sharing a build folder rebuilt each other's
        # kernels at every load (minutes each; seen with a worktree beside a moved tree).
        built_for["sources"] = str(HERE.resolve())
        isa = built_for["isa"]
        key = hashlib.sha256(json.dumps(built_for, sort_keys=True).encode()).hexdigest()[:16]
        build = cache_root() / "native" / key
        build.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(build)
        if not (build / "specdec_native.so").exists():
            status(f"building the native kernels for this machine ({isa}), once")
        return load(
            name="specdec_native",
            sources=[str(HERE / source) for source in SOURCES],
            extra_cflags=[*BASE_FLAGS, *ISA_FLAGS[isa]],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
    except Exception as err:  # a missing compiler or headers: fall back, say why once
        build_errors["native"] = f"{type(err).__name__}: {err}"
        log.warning("specdec: native kernels unavailable (%s); using PyTorch kernels", err)
        return None


KERNELS = ("bf16_gemv", "q4_gemv", "decode_stack")  # what the module holds, one accessor each
build_errors: dict[str, str] = {}  # kernel name or "native" -> why its build failed (tests show it)


def compiler() -> str | None:
    """The C++ compiler torch's extension builder would run (`$CXX`, else c++), or None."""
    import shutil

    return shutil.which(os.environ.get("CXX", "c++"))


def buildable() -> bool:
    """Whether this machine can build the kernels: a compiler and AVX2 + FMA. Where it
    can, a build that fails is a bug (a compile error), not a machine without them."""
    return compiler() is not None and ISA_NEEDS["avx2"] <= set(cpu_info()[1].split())
