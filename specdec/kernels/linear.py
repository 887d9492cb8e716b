"""A `nn.Linear` whose kernel is chosen per row count by timing, on the machine at hand.

Decoding multiplies a handful of rows (1 for plain decoding, k+1 per row for speculative
verification) by large weight matrices, so its speed is how fast the weights stream from
memory, and which kernel streams fastest depends on the CPU: on a Zen 5 EPYC with
AVX-512 bf16, oneDNN's prepacked bf16 weights stream at ~44 GB/s where `torch.mv` reaches
18; on a Zen 3 EPYC (AVX2, no bf16 instructions) oneDNN refuses bf16, PyTorch's bf16
kernels slow down with every extra row (a 4-row verify costs 4 one-row steps) and a small
native kernel that widens bf16 in registers (`specdec.kernels.native`) keeps 2-4 rows near
the cost of one, while a prefill's many rows go fastest through weights widened to fp32
a cache-sized panel at a time (`_fp32_panels`). No rule tuned on one CPU is right for the
next, so `tune_kernels` times each candidate for each bucket of row counts over layers of
one shape (the way a decode step sweeps them, so the caches behave as they will), keeps
the fastest, and caches the choice per machine (`tuning`).

Memory: two formats are stored copies of the weights, in the same dtype: oneDNN's
prepacked weights (only where that kernel measures fastest) and the native kernel's panel
layout (`pack_panels`: 8 outputs a panel in AVX2 builds, 32 in AVX-512 ones; AVX-512 BF16
ones read those or 16 outputs by pairs of k, whichever `tuning.tune_bf16_panels`
timed faster here), which the decode stack reads too. In the batch-invariant mode (the
default) a decoder projection keeps its panels alone, its rows dropped as they are packed
(`drop_unread_rows`); otherwise a bf16 model holds its weights twice (3.1 GB more for the
1.5B). The panels multiply 1.01-1.26x faster than
the row layout on a Zen 3 (1-6 rows; 7-8 rows 0.96-1.10x; docs/benchmarks.md) and
1.14-1.62x on a Zen 4 (1-8 rows); the pair panels multiply 1.6x as fast again
there, which keeps a 5-8 row verify pass near the memory's pace, and pass 4-8
rows 7-10% slower than the FMA panels on a Xeon with AMX.
A stored fp32 copy was measured too and dropped: it doubles a bf16 model's memory (6.2 GB
more for the 1.5B) for no gain over the native kernel.

A candidate is a name in `KERNELS`: a function `(layer, x [rows, in]) -> [rows, out]` plus
the weight format it needs, prepared once per layer (`prepare`). Every candidate computes
the same product up to floating-point rounding. Only the native kernel is batch-invariant
(each row's floats the same whatever the rows beside it); a plan mixing kernels across
buckets rounds a verify pass differently from a one-row step, so in bf16 plans choose
only it by default (`candidates`, `kernels.invariance`). fp32 plans mix them (greedy
equality in fp32 is unaffected in practice and tested).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels import invariance, mapped, native

# Row-count buckets: a product of `rows` rows uses the choice of the first bucket >= rows.
# 256 stands for every larger product (prefills), which is compute-bound: there a kernel
# that pays a fixed cost per call (widening the weights to fp32) can win, where at 64 rows
# it loses (measured on a Zen 3: fp32 upcast 0.4 GB/s at 64 rows, behind the native kernel).
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 256)
STACK_BUCKETS = tuple(b for b in BUCKETS if b <= 32)  # the native decode stack's

# The PyTorch-side candidates' version: a change to one of them must be timed again, so it
# is part of the machine key that tuned plans (and `auto`'s cached costs) are stored under.
KERNELS_VERSION = 2


def bucket_of(rows: int) -> int:
    for b in BUCKETS:
        if rows <= b:
            return b
    return BUCKETS[-1]


@dataclass(frozen=True)
class Kernel:
    """One way to compute `x @ W.T + b`: `prepare(layer)` builds the weight format it reads
    (or None when it reads `layer.weight` as it is); `run(layer, fmt, x)` computes."""

    prepare: Callable[[nn.Linear], object] | None
    run: Callable[[nn.Linear, object, torch.Tensor], torch.Tensor]
    applies: Callable[[nn.Linear], bool]


def _linear(layer, fmt, x):
    return F.linear(x, layer.weight, layer.bias)


def _mv_mm(layer, fmt, x):  # the previous rule, tuned on an Intel Xeon
    out = (
        torch.mv(layer.weight, x[0])[None] if x.shape[0] == 1 else torch.mm(layer.weight, x.t()).t()
    )
    return out if layer.bias is None else out + layer.bias


def _fp32_upcast(layer, fmt, x):  # half-precision weights widened per call (no stored copy)
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias).to(x.dtype)


# fp32 bytes of one widened panel of `_fp32_panels`: small enough to stay in the last-level
# cache between the widening and the product, large enough that a panel is one good GEMM.
PANEL_BYTES = 4 << 20
# Rows of a panel product are padded to a multiple of this: measured on a Zen 3 (2 threads,
# a [682, 1536] panel), the fp32 GEMM ran 21 rows at 34 GMAC/s and 24 rows at 51, so 21
# rows padded to 24 took 0.50 ms instead of 0.65; a 21-token bf16 prefill of the 1.5B ran
# 1.21x faster, one of 33 tokens (padded to 40) 0.97x, within the noise.
PANEL_ROWS = 8
_panel_scratch = threading.local()


def _fp32_panels(layer, fmt, x):
    """Half-precision weights widened to fp32 a panel of output rows at a time, into one
    reused buffer, each panel multiplied by the fp32 GEMM while it is still in cache.

    Why: a prefill's many rows on a CPU without bf16 arithmetic are compute-bound, and the
    fp32 GEMM is the fastest arithmetic there is; `_fp32_upcast` reaches it by widening the
    whole matrix per call, a fresh allocation twice the weights' size that faults in page
    by page (measured on a Zen 3, 1 thread: the 1.5B's gate/up at 64 rows 121 ms, 81 ms
    through the native kernel eight rows a call, 46 ms in panels). The GEMM is given whole
    blocks of `PANEL_ROWS` rows (zero rows pad the last block)."""
    weight = layer.weight.detach()  # inference only: out= products take no autograd
    n_out, n_in = weight.shape
    step = max(16, PANEL_BYTES // (4 * n_in) // 16 * 16)
    scratch = getattr(_panel_scratch, "buffer", None)
    if scratch is None or scratch.numel() < step * n_in:
        # A normal tensor, not an inference one: written in place in and out of
        # inference mode alike (an inference tensor refuses writes outside it).
        with torch.inference_mode(False):
            scratch = _panel_scratch.buffer = torch.empty(step * n_in, dtype=torch.float32)
    rows = x.shape[0]
    padded = -(-rows // PANEL_ROWS) * PANEL_ROWS
    xf = x.float()
    if padded != rows:  # zero rows: the fp32 GEMM runs fastest on whole blocks of rows
        xf = torch.cat([xf, xf.new_zeros(padded - rows, n_in)])
    xt = xf.t()  # [in, padded]
    out_t = torch.empty(n_out, padded, dtype=torch.float32)  # [out, padded]
    for first in range(0, n_out, step):
        last = min(n_out, first + step)
        panel = scratch[: (last - first) * n_in].view(last - first, n_in)
        panel.copy_(weight[first:last])
        torch.mm(panel, xt, out=out_t[first:last])
    out = out_t.t()[:rows]
    if layer.bias is not None:
        out = out + layer.bias.float()
    return out.to(x.dtype)


def _onednn_pack(layer):
    return torch.ops.mkldnn._reorder_linear_weight(layer.weight, None), layer.bias


def _onednn(layer, fmt, x):
    packed, bias = fmt
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_panels(weight: torch.Tensor, width: int = 8, kstep: int = 1) -> torch.Tensor:
    """[N, K] -> [ceil(N / width), K / kstep, width * kstep]: the native bf16 kernel's panel
    layout (bf16_kernel.h; `width` and `kstep` are the build's `native.bf16_panel_width()`
    and `bf16_panel_kstep()`): for each k (each `kstep` consecutive k) the weights of
    `width` outputs side by side (each output's `kstep` weights together), zero rows past N."""
    n_out, n_in = weight.shape
    if n_in % kstep:
        raise ValueError(f"pack_panels: K = {n_in} is not a multiple of kstep = {kstep}")
    padded = -(-n_out // width) * width
    weight = weight.detach()
    if padded != n_out:
        weight = torch.cat([weight, weight.new_zeros(padded - n_out, n_in)])
    panels = weight.view(padded // width, width, n_in // kstep, kstep).transpose(1, 2)
    return panels.reshape(padded // width, n_in // kstep, width * kstep).contiguous()


def unpack_panels(panels: torch.Tensor, n_out: int, n_in: int) -> torch.Tensor:
    """`pack_panels`' inverse: [P, K / kstep, width * kstep] -> [n_out, n_in = K] rows."""
    n_panels, lines, line = panels.shape
    kstep = n_in // lines
    rows = panels.view(n_panels, lines, line // kstep, kstep).transpose(1, 2)
    return rows.reshape(-1, n_in)[:n_out].contiguous()


def _native_pack(layer):
    """The panel layout where the build reads it, else None
    (the row layout: `layer.weight` as it is)."""
    if not native.bf16_panels():
        return None
    return pack_panels(layer.rows(), native.bf16_panel_width(), native.bf16_panel_kstep())


def _native_bf16(layer, fmt, x):  # bf16 weights widened in registers (native/bf16_kernel.h)
    out = native.bf16_gemv()(x.float(), layer.weight, fmt)  # [rows, N] fp32, 8 rows a stream
    return (out if layer.bias is None else out + layer.bias.float()).to(x.dtype)


def _native_applies(layer) -> bool:
    bf16 = layer.weight.dtype == torch.bfloat16 and layer.in_features % 8 == 0
    return bf16 and native.bf16_gemv() is not None


def _half(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


_ONEDNN: dict[torch.dtype, bool] = {}


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN prepacks `dtype` weights on this CPU (bf16 needs AVX-512 or
    AVX-NE-CONVERT; it refuses otherwise), probed once on a tiny matrix."""
    if dtype not in _ONEDNN:
        try:
            probe = torch.ones(16, 16, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(probe, None)
            torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
            _ONEDNN[dtype] = True
        except (RuntimeError, AttributeError):
            _ONEDNN[dtype] = False
    return _ONEDNN[dtype]


# Candidates in the order they are timed (likely-fast first, so slow ones are cut short).
KERNELS: dict[str, Kernel] = {
    "onednn": Kernel(_onednn_pack, _onednn, lambda layer: onednn_packs(layer.weight.dtype)),
    "native_bf16": Kernel(_native_pack, _native_bf16, _native_applies),
    "fp32_upcast": Kernel(None, _fp32_upcast, lambda layer: _half(layer.weight.dtype)),
    "fp32_panels": Kernel(None, _fp32_panels, lambda layer: _half(layer.weight.dtype)),
    "linear": Kernel(None, _linear, lambda layer: True),
    "mv_mm": Kernel(None, _mv_mm, lambda layer: True),
}


class Linear(nn.Linear):
    """`nn.Linear` with a per-bucket kernel plan (`tune_kernels` fills it; empty = F.linear).

    The prepared weight formats are plain attributes, not buffers: they are derived from
    `weight`, never saved, and exist only on the CPU where they were chosen.
    """

    drop_when_packed = False  # `drop_unread_rows`: nothing reads its rows but its panels

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plan: dict[int, str] = {}  # bucket -> kernel name
        self.formats: dict[str, object] = {}  # kernel name -> prepared weight format
        self._route: dict[int, tuple[Callable, object]] = {}  # bucket -> (run, format)

    @property
    def device(self) -> torch.device:
        """Where the layer computes (a quantized layer's `weight` may be a meta shape)."""
        return self.weight.device

    def kernels(self) -> dict[str, Kernel]:
        """The candidates for this layer (subclasses with other weight formats add theirs);
        only the native kernel once its rows are dropped (`drop_rows`)."""
        if self.rows_dropped():
            return {"native_bf16": KERNELS["native_bf16"]}
        return {n: k for n, k in KERNELS.items() if k.applies(self)}

    def drop_rows(self) -> bool:
        """Free the row-layout weight where nothing reads it any more: an invariant layer
        (`invariant`) with its panels packed computes from them alone (the native kernel
        and the decode stack take the weight's shape only). `weight` becomes a zero-stride
        placeholder of its shape and dtype, and the pages of rows read from a mapped
        checkpoint go back to the OS (`mapped.release`). Why: a bf16 model held its
        projections twice, rows and panels (6.6 GB for the 1.5B where 3.3 do)."""
        if self.rows_dropped() or not (
            self.invariant() and self.formats.get("native_bf16") is not None
        ):
            return False
        n, k = self.weight.shape
        mapped.release([self.weight.detach()])
        placeholder = torch.zeros((), dtype=self.weight.dtype).expand(n, k)
        self.weight = nn.Parameter(placeholder, requires_grad=False)
        return True

    def rows(self) -> torch.Tensor:  # [out, in]
        """The weight in row layout: `weight`, or where its rows were dropped, unpacked
        from the panels (a new tensor: for re-packing in another layout)."""
        if not self.rows_dropped():
            return self.weight.detach()
        return unpack_panels(self.formats["native_bf16"], self.out_features, self.in_features)

    def repack_panels(self) -> bool:
        """Re-pack the panels in the layout in force (`native.set_bf16_panel_layout`) if
        they are in another; whether they were."""
        panels = self.formats.get("native_bf16")
        if panels is None or panels.shape[1] == self.in_features // native.bf16_panel_kstep():
            return False
        self.formats["native_bf16"] = _native_pack(self)
        if self.plan:
            self.use(self.plan)  # the routes hold the old panels
        return True

    def rows_dropped(self) -> bool:
        """Whether `weight` is `drop_rows`' placeholder (its values are gone)."""
        w = self.weight
        tensor = isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel() > 1
        return tensor and w.stride() == (0, 0)

    def invariant(self) -> bool:
        """Whether this layer computes only with the batch-invariant native bf16 kernel: a
        bf16 `Linear` the native kernel takes, in the batch-invariant mode
        (`kernels.invariance`). Quantized subclasses have their own kernels."""
        return (
            type(self) is Linear
            and self.weight.dtype == torch.bfloat16
            and invariance.enabled()
            and _native_applies(self)
        )

    def candidates(self) -> dict[str, Kernel]:
        """The kernels a plan may choose among (`tuning`, `kernel_plans`): every one this
        layer offers, or only the batch-invariant native kernel (`invariant`)."""
        kernels = self.kernels()
        return {"native_bf16": kernels["native_bf16"]} if self.invariant() else kernels

    def stored_bytes(self) -> int:
        """Bytes of the most compact weight format this layer holds (what a decode step
        streams when its fastest kernel reads that format)."""
        return self.weight.numel() * self.weight.element_size()

    def prepare(self, name: str) -> None:
        if self.rows_dropped() and name not in self.formats:
            raise RuntimeError(f"{name}: the layer's rows were dropped once its panels were packed")
        kernel = self.kernels()[name]
        if kernel.prepare is not None and name not in self.formats:
            self.formats[name] = kernel.prepare(self)
            if self.drop_when_packed:
                self.drop_rows()

    def use(self, plan: dict[int, str]) -> None:
        """Adopt a plan: prepare the formats it names, drop the ones it does not."""
        for name in set(plan.values()):
            self.prepare(name)
        self.formats = {n: f for n, f in self.formats.items() if n in plan.values()}
        self.plan = dict(plan)
        kernels = self.kernels()
        self._route = {b: (kernels[n].run, self.formats.get(n)) for b, n in plan.items()}

    def run(self, name: str, x: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        return self.kernels()[name].run(self, self.formats.get(name), x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.numel() // x.shape[-1]
        route = self._route.get(bucket_of(rows)) if self._route else None
        if route is None and x.device.type == "cpu" and self.invariant():
            # untuned: the invariant kernel all the same, in the layout the layer holds
            route = _native_bf16, self.formats.get("native_bf16")
        if route is None or x.device.type != "cpu":
            return self.default(x)
        run, fmt = route
        out = run(self, fmt, x.reshape(rows, x.shape[-1]))
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def default(self, x: torch.Tensor) -> torch.Tensor:
        """The product without a plan (untuned layers, other devices)."""
        if self.rows_dropped():  # the panels are all there is
            flat = x.reshape(-1, x.shape[-1])
            out = _native_bf16(self, self.formats["native_bf16"], flat)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return F.linear(x, self.weight, self.bias)

    @classmethod
    def over(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        """A frozen layer computing with `weight [out, in]` (and `bias [out]`) as given, not
        copied: how a layer derived from others (fused, cut, reused) is made. No plan
        (tune it afterwards)."""
        layer = cls(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        layer.weight = nn.Parameter(weight.detach(), requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach(), requires_grad=False)
        return layer

    def output_rows(self, ids: torch.Tensor) -> Linear:
        """A new layer computing only the outputs `ids` [N] of this one (a draft model's
        vocabulary head cut to the ids it may propose): copied weights, never tied, no
        plan (tune it afterwards)."""
        ids = ids.to(self.weight.device)
        bias = None if self.bias is None else self.bias.detach()[ids].clone()
        return Linear.over(self.weight.detach()[ids].clone(), bias)


def drop_unread_rows(model: nn.Module) -> int:
    """Have every projection of the decoder layers (not the vocabulary head: heads and a
    tied embedding read its rows) drop its rows as soon as its panels are packed
    (`Linear.drop_rows`), and those already packed drop them now; the bytes freed now.
    Called before a load's tuning packs the panels, so the rows and the panels of the
    whole model are never resident together (the bf16 1.5B peaked at 8 GB for 3.1 GB)."""
    freed = 0
    for layer in getattr(model, "layers", ()):
        for module in layer.modules():
            if isinstance(module, Linear) and type(module) is Linear:
                module.drop_when_packed = module.invariant()
                size = module.weight.numel() * module.weight.element_size()
                freed += size if module.drop_rows() else 0
    return freed
