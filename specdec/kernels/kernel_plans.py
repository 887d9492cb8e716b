"""Kernel plans predicted from the CPU's instruction set, for a machine that has timed nothing.

Why: timing every choice on a fresh machine took most of a first load (535 s of a
12 min 57 s `make demo` on a 2-vCPU Xeon; docs/benchmarks.md, "First run"). The timings on the three
CPUs measured so far converged to a few rules per instruction-set class
(`native.instruction_set`), kept in `PREDICTED` below; a first load starts from them at once
and measures only the choices a rule leaves uncertain, within a time budget
(`tuning_budget`). Every choice here is among exact alternatives (kernels of one product, a
stack with the eager layers' roundings, a prefetch level, a weight layout), so a predicted
plan changes speed, never which tokens come out (tested: tests/unit/test_kernel_plans.py).

Where each rule comes from (the archived docs/BENCHMARKS.md, commit 1f7ab6a):
- bf16 projections: Zen 3 (AVX2) kept `native_bf16` up to 32 rows and `fp32_panels` at 64
  and 256; a Zen 4 (AVX-512 BF16) and a Xeon with AMX keep the native kernel for
  verify passes (pair panels / AMX tiles: 2-16 rows near one row's cost) and
  oneDNN's prepacked bf16 GEMM for prefills (the Xeon plan's choice at 256 rows).
  These bf16 rules apply with `SPECDEC_BF16_INVARIANT=0` only: by default a bf16 layer
  offers the batch-invariant native kernel alone (`Linear.candidates`), and a bf16 stack
  takes every pass (`kernels.invariance`).
- bf16 panel layout: pairs of k (`vdpbf16ps`) 1.25-1.58x faster at 5-8 rows on a Zen 4,
  0.77-0.87x on a Xeon with AMX (`tuning.tune_bf16_panels`).
- int4 tile prefetch: into L1 on the Zen 4 (the level the tiles were written for), into L2
  on the Xeon (40.6 ms against 58.8 ms a sweep at one row).
- int4 tile layout: kept with AVX-512 and AMX (Zen 4: 4 rows 1.05x one row in tiles, 1.6x
  in rows; Xeon: the 0.5B steps 1.45x faster in tiles); rows with AVX2, where a one-row
  pass was 5-24% slower in tiles in 9 of the pair's 10 groups on a Zen 3
  (`tuning.keeps_tiles`).
- the native decode stack: int4 steps of up to 8 rows (`quant.PACKED_MAX_ROWS`); bf16 steps
  of up to 4 (Zen 3: 16 ms a SmolLM2 step against 27 eager; at 8 rows the 1.5B's eager
  layers won, 149 ms against 180-190; decode_stack's doc).
"""

from __future__ import annotations

from specdec.kernels.cpu import cpu_info
from specdec.kernels.linear import BUCKETS, STACK_BUCKETS, Linear

_DECODE = (1, 2, 4, 8, 16, 32)  # buckets of decode steps and verify passes
_PREFILL = (64, 256)


def _bf16(prefill: str) -> dict[int, str]:
    """The native kernel for steps and verify passes, `prefill` for prefills."""
    return {**dict.fromkeys(_DECODE, "native_bf16"), **dict.fromkeys(_PREFILL, prefill)}


# Per instruction-set class: each bucket's kernels in order of preference (the first the
# layer offers is taken), the bf16 panel layout, the tile prefetch level, whether int4
# layers keep the tile layout, and up to which bucket the decode stack takes a step.
PREDICTED: dict[str, dict] = {
    "avx2": {
        "bfloat16": _bf16("fp32_panels"),
        "panels": (8, 1),
        "prefetch": 0,
        "tiles": False,
        "stack": {"int4": 8, "bf16": 4},
    },
    "avx512": {
        "bfloat16": _bf16("fp32_panels"),
        "panels": (32, 1),
        "prefetch": 0,
        "tiles": True,
        "stack": {"int4": 8, "bf16": 4},
    },
    "avx512bf16": {
        "bfloat16": _bf16("onednn"),
        "panels": (16, 2),
        "prefetch": 0,
        "tiles": True,
        "stack": {"int4": 8, "bf16": 4},
    },
    "amx": {
        "bfloat16": _bf16("onednn"),
        "panels": (32, 1),
        "prefetch": 1,
        "tiles": True,
        "stack": {"int4": 8, "bf16": 4},
    },
}
# Where a class's first choice is not offered: the next that is, in this order per kind.
FALLBACK = {
    "bfloat16": ("native_bf16", "onednn", "fp32_panels", "linear"),
    "float16": ("onednn", "linear"),
    "float32": ("linear", "mv_mm"),
    "int4": ("q4_native", "int4", "q4_panels"),
}


def isa_class() -> str:
    """This machine's class in `PREDICTED` (the native build's instruction set)."""
    from specdec.kernels import native

    return native.instruction_set(set(cpu_info()[1].split()))


def rules(isa: str | None = None) -> dict:
    return PREDICTED.get(isa or isa_class(), PREDICTED["avx2"])


def _kind(layer: Linear) -> str:
    name = type(layer).__name__
    if name == "Int4Linear":
        return "int4"
    return str(layer.weight.dtype).removeprefix("torch.")


def predicted_plan(layer: Linear, isa: str | None = None) -> dict[int, str]:
    """{bucket: kernel} for `layer` by the rules of `isa` (this machine's by default):
    the class's choice where the layer offers it, else the first it offers of `FALLBACK`,
    else its first candidate."""
    offered = list(layer.candidates())
    kind = _kind(layer)
    first = rules(isa).get(kind, {})
    plan = {}
    for bucket in BUCKETS:
        wanted = [first.get(bucket), *FALLBACK.get(kind, ())]
        plan[bucket] = next((k for k in wanted if k in offered), offered[0])
    return plan


def certain(layer: Linear) -> bool:
    """Whether `layer` has one candidate, so its plan needs no timing (an int4 layer where
    the native kernel builds)."""
    return len(layer.candidates()) == 1


def predicted_panels(layouts: list[tuple[int, int]], isa: str | None = None) -> tuple[int, int]:
    """The bf16 panel layout of the rules where the build reads it, else its default."""
    layout = tuple(rules(isa)["panels"])
    return layout if layout in layouts else layouts[0]


def predicted_prefetch(isa: str | None = None) -> int:
    return rules(isa)["prefetch"]


def predicted_tiles(isa: str | None = None) -> bool:
    return rules(isa)["tiles"]


def predicted_stack(kind: str, isa: str | None = None) -> dict[str, str]:
    """{bucket: "stack" | "eager"} over `decode_stack.STACK_BUCKETS` for a stack of `kind`
    ("int4" / "bf16")."""
    most = rules(isa)["stack"][kind]
    return {str(b): "stack" if b <= most else "eager" for b in STACK_BUCKETS}
