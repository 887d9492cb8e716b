"""Weight-only int4 and int8 projections: a quarter or half of bf16's bytes per decode step.

Decoding is bound by weight bytes, so fewer bits per weight make every step cheaper. For a
drafter that changes only q, which the acceptor corrects: the output distribution cannot
change. For the target (`--quant`) the quantized model *is* the model that runs, and the
lossless acceptors are lossless with respect to it: speculative output is distributed as
plain decoding of the same quantized target.

To keep that true, every kernel of a layer computes with the same quantized values. An
int4 layer holds its 4-bit blocks once and nothing dense (`Int4Linear`): the native int4
kernel serves every row count, from a decode step to a prefill; it rounds the activations
to int8 (one scale per 256 inputs, as llama.cpp does), which changes a layer's output by
under 1% (measured on random weights), and it is batch-invariant, so a verify pass through
it scores each token exactly as a one-token decode step would. An int8 layer's `weight`
holds the dequantized weights in the model dtype beside its int8 ones: a packed kernel for
the few rows of a step, the dense kernels of `Linear` where they measure faster.

int4 (`Q4Weights`): GGUF Q4_K's arithmetic, a scale and a minimum per group of 32 inputs,
themselves quantized per super-block of 256, so a Q4_K file's tensors run as stored
(`gguf_q4`); other checkpoints are quantized at load (round to nearest). int8: symmetric,
one scale per output channel.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from torch import nn

from specdec.kernels import native
from specdec.kernels.linear import Kernel, Linear
from specdec.kernels.q4 import GROUP, Q4Weights, q4_quantize

if TYPE_CHECKING:  # annotations only: the models are built on these kernels
    pass


log = logging.getLogger(__name__)

QUANTS = ("none", "int4", "int8")
# Without a measured plan (an untuned layer), the packed kernels take products of at most
# this many rows and the dense weights the rest (prefills), as measured on both reference
# CPUs: the packed kernels fall far behind dense ones past a few rows.
PACKED_MAX_ROWS = 8


class _QuantLinear(Linear):
    """A `Linear` whose `weight` is the dequantized weights and which adds one packed kernel
    (`packed_kernel`) to the candidates of `tune_kernels`."""

    packed_name = ""

    def __init__(self, linear: nn.Linear, dequantized: torch.Tensor) -> None:
        n, k = linear.weight.shape
        dtype = linear.weight.dtype
        super().__init__(k, n, bias=linear.bias is not None, device="meta", dtype=dtype)
        self.weight = nn.Parameter(dequantized.to(dtype), requires_grad=False)
        self.bias = linear.bias

    def packed(self, fmt, x: torch.Tensor) -> torch.Tensor:  # [rows, K] -> [rows, N]
        raise NotImplementedError

    def kernels(self) -> dict[str, Kernel]:
        run = type(self).packed
        return {self.packed_name: Kernel(None, run, lambda layer: True), **super().kernels()}

    def default(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > PACKED_MAX_ROWS or x.device.type != "cpu":
            return super().default(x)
        out = self.packed(None, x.reshape(rows, x.shape[-1]))
        return out.reshape(*x.shape[:-1], self.out_features)


def _q4_bias(layer) -> torch.Tensor | None:  # the kernel adds an fp32 bias before rounding
    return None if layer.bias is None else layer.bias.detach().float().contiguous()


def _q4_native(layer, fmt, x):
    """The native kernel takes bf16 or fp32 activations, adds the bias and returns their
    dtype (one call per layer: the Python-side casts cost more than the product on small
    layers); other dtypes go through fp32."""
    bias = fmt if fmt is not None else _q4_bias(layer)
    native_in = x if x.dtype in (torch.float32, torch.bfloat16) else x.float()
    out = native.q4_gemv()(
        native_in, layer.qs, layer.sc, layer.mn, layer.d, layer.dmin, bias, layer.tiles
    )
    return out.to(x.dtype)


def _torch_int4_pack(layer):
    """torch's packed int4 format for the same 4-bit values: per group (q - 8) * scale +
    zero, scale and zero rounded to the model dtype (a rounding the native kernel avoids)."""
    w, dtype = layer.q4, layer.weight.dtype
    step, low = w.group_steps()  # [N, K/32]
    scales_zeros = torch.stack([step.t(), (8 * step - low).t()], dim=-1).to(dtype)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.levels().to(torch.int32), 2)
    return packed, scales_zeros.contiguous()  # [K/32, N, 2]


def _torch_int4(layer, fmt, x):
    packed, scales_zeros = fmt
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.to(layer.weight.dtype), packed, GROUP, scales_zeros
    )
    return (out if layer.bias is None else out + layer.bias).to(x.dtype)


@dataclass(frozen=True)
class DenseShape:
    """What an int4 layer tells of the dense weight it does not hold."""

    shape: torch.Size  # [N, K]
    dtype: torch.dtype  # the dtype it computes in (its activations' and outputs')
    device: torch.device

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


class Int4Linear(Linear):
    """y = x @ dequant(W).T [+ bias], W in 4 bits (`Q4Weights`), held once.

    The layer keeps its 4-bit blocks and nothing dense beside them: its `weight` is a
    `DenseShape` (the layer's shape, compute dtype and device, no values), so a dense
    kernel run on it by mistake fails at once (it is no tensor), never a second copy or
    a wrong number (torch computes garbage from a meta-device weight without a word). Why:
    with the dequantized weights kept for the dense kernels, the int4 1.5B + 0.5B pair
    peaked at 12.9 GB where llama.cpp holds the same Q4_K weights in 1.86 GB
    (docs/benchmarks.md, "Memory and start-up").

    Kernels, all reading the blocks: the native one ("q4_native": int8 activations, integer
    dot products, batch-invariant at every row count, register-blocked up to 8 rows a pass
    over a weight row, row blocks for prefills) wherever it builds; elsewhere torch's int4
    kernel ("int4", where N % 16 == 0, for bf16 / fp16 models; its packed copy is made only
    if tuning keeps it) and "q4_panels" (dequantized a panel of outputs at a time into one
    reused fp32 buffer, then the fp32 GEMM). torch's kernel is no candidate for fp32
    models: measured on a Zen 3 (0.5B gate/up shape) it took 8.6 ms for one fp32 row and
    2.2 s for 256, 39-106x the native kernel.
    """

    def __init__(
        self,
        linear: nn.Linear,
        weights: Q4Weights | None = None,
        tiles: bool | torch.Tensor = True,
    ) -> None:
        q4 = weights if weights is not None else q4_quantize(linear.weight.detach())
        if q4.shape != tuple(linear.weight.shape):
            raise ValueError(
                f"4-bit weights of shape {q4.shape} for a {tuple(linear.weight.shape)} layer"
            )
        n, k = q4.shape
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a dense weight
        self.in_features, self.out_features = k, n
        self.plan, self.formats, self._route = {}, {}, {}  # as `Linear.__init__`
        self._dtype = linear.weight.dtype
        if linear.bias is not None:
            self.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        for f in fields(Q4Weights):
            self.register_buffer(f.name, getattr(q4, f.name))
        # The same weights in the native kernel's tile layout, where asked for (True, or the
        # tiles themselves as `models.store` maps them) and the build reads it (N % 16 == 0);
        # empty elsewhere. Not in the state dict. Which layout a layer keeps is measured per
        # machine (`tuning.tune_layout`): on a Zen 4, 4 rows cost 1.05x one row in tiles and
        # 1.6x in rows (the 1.5B's 28 layers), but one row of the 0.5B's head streamed 1.2x
        # faster in rows; on an Intel Xeon with AMX the whole 0.5B steps 1.45x faster in
        # tiles; on a Zen 3 (AVX2) 9 rows cost 0.82x and 16 rows 0.68x what they do in rows
        # (docs/benchmarks.md, AVX2).
        to_tiles = native.q4_tiles() if tiles is not False else None
        laid = torch.empty(0, dtype=torch.uint8)
        if to_tiles is not None and n % 16 == 0:
            laid = tiles if isinstance(tiles, torch.Tensor) else to_tiles(*q4.tensors())
        self.register_buffer("tiles", laid, persistent=False)

    @property
    def weight(self) -> DenseShape:
        """The dense weight's shape, dtype and device, without the weight (class doc)."""
        return DenseShape(
            torch.Size((self.out_features, self.in_features)), self._dtype, self.device
        )

    @property
    def device(self) -> torch.device:
        return self.qs.device

    def stored_bytes(self) -> int:
        return sum(t.nbytes for t in self.q4.tensors())

    @property
    def q4(self) -> Q4Weights:
        return Q4Weights(*(getattr(self, f.name) for f in fields(Q4Weights)))

    def kernels(self) -> dict[str, Kernel]:
        if native.q4_gemv() is not None:  # the one kernel wherever it builds (class doc)
            return {"q4_native": Kernel(_q4_bias, _q4_native, _always)}
        packed = {}
        if self._torch_int4_applies():
            packed["int4"] = Kernel(_torch_int4_pack, _torch_int4, _always)
        return {**packed, "q4_panels": Kernel(None, _q4_panels, _always)}

    def _torch_int4_applies(self) -> bool:
        half = self.weight.dtype in (torch.bfloat16, torch.float16)
        return half and self.out_features % 16 == 0

    def default(self, x: torch.Tensor) -> torch.Tensor:
        """Without a plan: the native kernel at every row count (batch-invariant), else the
        panels."""
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1])
        run = _q4_native if native.q4_gemv() is not None else _q4_panels
        return run(self, None, flat).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def from_blocks(
        cls, blocks: Q4Weights, dtype: torch.dtype, bias=None, tiles: bool | torch.Tensor = True
    ) -> Int4Linear:
        """A layer over `blocks` as they are, computing in `dtype`, with `bias [N]` where
        given: no dense weight needed to make it (`tiles`: as the constructor's)."""
        n, k = blocks.shape
        shape = nn.Linear(k, n, bias=False, device="meta", dtype=dtype)
        layer = cls(shape, blocks, tiles=tiles)
        if bias is not None:
            layer.bias = nn.Parameter(bias, requires_grad=False)
        return layer

    def output_rows(self, ids: torch.Tensor) -> Int4Linear:
        """The same 4-bit blocks for the outputs `ids` only (each output row is quantized
        on its own, so the kept rows' weights are what they were)."""
        ids = ids.to(self.qs.device)
        bias = None if self.bias is None else self.bias.detach()[ids].clone()
        tiled = self.tiles.numel() > 0
        return Int4Linear.from_blocks(self.q4.rows(ids), self.weight.dtype, bias, tiled)


def _always(layer) -> bool:
    return True


# fp32 bytes of one dequantized panel of `_q4_panels` (as `linear.PANEL_BYTES`).
Q4_PANEL_BYTES = 4 << 20
_q4_scratch = threading.local()


def _q4_panels(layer, fmt, x):
    """x [rows, K] -> [rows, N]: the 4-bit blocks dequantized a panel of output rows at a
    time into one reused fp32 buffer, each panel multiplied while it is in cache. The
    kernel where the native one does not build (no dense copy is kept for it)."""
    w = layer.q4
    n, k = w.shape
    step = max(16, Q4_PANEL_BYTES // (4 * k) // 16 * 16)
    scratch = getattr(_q4_scratch, "buffer", None)
    if scratch is None or scratch.numel() < step * k:
        with torch.inference_mode(False):  # written in and out of inference mode alike
            scratch = _q4_scratch.buffer = torch.empty(step * k, dtype=torch.float32)
    xf = x.float()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    for first in range(0, n, step):
        last = min(n, first + step)
        panel = scratch[: (last - first) * k].view(last - first, k)
        panel.copy_(w.rows(slice(first, last)).dequantize())
        torch.mm(xf, panel.t(), out=out[:, first:last])
    if layer.bias is not None:
        out = out + layer.bias.float()
    return out.to(x.dtype)


class Int8Linear(_QuantLinear):
    """y = x @ dequant(W).T [+ bias], W in 8 bits (symmetric, a scale per output channel)
    through torch's int8 weight-only CPU kernel."""

    packed_name = "int8"

    def __init__(self, linear: nn.Linear) -> None:
        w = linear.weight.detach().float()
        dtype = linear.weight.dtype
        scale = (w.abs().amax(-1) / 127).clamp_min(1e-8).to(dtype).float()  # [N]
        q = (w / scale[:, None]).round().clamp(-127, 127)
        super().__init__(linear, q * scale[:, None])
        self.register_buffer("qweight", q.to(torch.int8).contiguous())
        self.register_buffer("scales", scale.to(dtype))

    def output_rows(self, ids: torch.Tensor) -> Int8Linear:
        """The outputs `ids` only; their scales are per row, so re-quantizing the kept
        rows from their dequantized weights gives back the same int8 values."""
        return Int8Linear(Linear.output_rows(self, ids))

    def packed(self, fmt, x):
        out = torch.ops.aten._weight_int8pack_mm(x.to(self.weight.dtype), self.qweight, self.scales)
        return (out if self.bias is None else out + self.bias).to(x.dtype)


def _quantized(
    linear: nn.Module, kind: str, source=None, name: str = "", report=None, tiles: bool = True
) -> nn.Module:
    """The quantized layer where the format takes the shape (int4: K % 64 == 0, int8:
    N % 16 == 0); the layer unchanged otherwise. `source` (a `gguf_q4.GGUFWeights`) gives
    int4 layers the file's own 4-bit blocks where it has them."""
    if hasattr(linear, "inner"):  # a tensor-parallel shard: quantize it from its own rows
        linear.inner = _quantized(linear.inner, kind, tiles=tiles)
        return linear
    n, k = linear.weight.shape
    if kind == "int8":
        return Int8Linear(linear) if n % 16 == 0 else linear
    if k % 64:
        return linear
    weights = None if source is None else source.layer(name, linear.weight.detach(), report)
    return Int4Linear(linear, weights, tiles=tiles)
