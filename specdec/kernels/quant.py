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
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from specdec.errors import InvalidParameterError
from specdec.kernels import native
from specdec.kernels.linear import Kernel, Linear, drop_unread_rows

if TYPE_CHECKING:  # annotations only: the models are built on these kernels
    from specdec.models.transformer import Transformer


log = logging.getLogger(__name__)

GROUP = 32  # weights per 4-bit group (one scale and minimum)
SUPER = 256  # weights per super-block (one scale for the group scales, Q4_K's)
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


@dataclass(frozen=True)
class Q4Weights:
    """4-bit weights in GGUF Q4_K's arrangement (see native/q4_gemv.cpp for the byte layout):
    w[n, k] = d[n, s] * sc[n, g] * q[n, k] - dmin[n, s] * mn[n, g] for the group g = k // 32
    and super-block s = k // 256 of input k. Q4_K stores d and dmin in fp16 and sc, mn in 6
    bits, so a Q4_K tensor maps onto this exactly (`gguf_q4.q4_k_blocks`); weights quantized at
    load get 8-bit sc and mn."""

    qs: torch.Tensor  # [N, K/2] u8: two 4-bit weights per byte
    sc: torch.Tensor  # [N, 8 S] u8 group scales (0 past K)
    mn: torch.Tensor  # [N, 8 S] u8 group minimums
    d: torch.Tensor  # [N, S] fp32 scale of sc
    dmin: torch.Tensor  # [N, S] fp32 scale of mn

    @property
    def shape(self) -> tuple[int, int]:
        return self.qs.shape[0], self.qs.shape[1] * 2

    def levels(self) -> torch.Tensor:  # [N, K] the 4-bit values q, 0..15
        n, k = self.shape
        pairs = self.qs.reshape(n, k // 64, 1, 32)
        return torch.cat([pairs & 15, pairs >> 4], dim=2).reshape(n, k)

    def tensors(self) -> tuple[torch.Tensor, ...]:  # qs, sc, mn, d, dmin
        return tuple(getattr(self, f.name) for f in fields(self))

    def rows(self, ids: torch.Tensor) -> Q4Weights:
        """The blocks of the output rows `ids` only (each row is quantized on its own)."""
        return Q4Weights(*(t[ids].contiguous() for t in self.tensors()))

    def group_steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(d * sc, dmin * mn) [N, K/32] fp32: each group's step and minimum."""
        groups = self.shape[1] // GROUP
        step = self.d.repeat_interleave(8, dim=1) * self.sc.float()  # [N, 8 S]
        low = self.dmin.repeat_interleave(8, dim=1) * self.mn.float()
        return step[:, :groups], low[:, :groups]

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32
        n, k = self.shape
        step, low = self.group_steps()
        q = self.levels().float().reshape(n, k // GROUP, GROUP)
        return (step[..., None] * q - low[..., None]).reshape(n, k)


def q4_quantize(w: torch.Tensor) -> Q4Weights:
    """Round `w` [N, K] (K % 64 == 0) to Q4Weights: per group of 32 an asymmetric 16-level
    grid from min(w, 0) to max(w, 0) (Q4_K's convention: the minimum is never positive),
    the group scales and minimums themselves in 8 bits per super-block of 256."""
    n, k = w.shape
    supers = -(-k // SUPER)
    padded = torch.zeros(n, supers * SUPER, dtype=torch.float32)
    padded[:, :k] = w.float()
    groups = padded.reshape(n, supers, 8, GROUP)
    low = groups.amin(-1).clamp(max=0)  # [N, S, 8]
    scale = (groups.amax(-1).clamp(min=0) - low) / 15
    d, dmin = scale.amax(-1) / 255, (-low).amax(-1) / 255  # [N, S]
    sc = _ratio(scale, d[..., None]).round().clamp(0, 255)
    mn = _ratio(-low, dmin[..., None]).round().clamp(0, 255)
    step, offset = d[..., None] * sc, dmin[..., None] * mn  # [N, S, 8]
    q = _ratio(groups + offset[..., None], step[..., None]).round().clamp(0, 15)
    q = q.to(torch.uint8).reshape(n, -1, 2, GROUP)[:, : k // 64]  # 64-weight chunks
    return Q4Weights(
        qs=(q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous(),
        sc=sc.to(torch.uint8).reshape(n, -1).contiguous(),
        mn=mn.to(torch.uint8).reshape(n, -1).contiguous(),
        d=d.contiguous(),
        dmin=dmin.contiguous(),
    )


def _ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, 0 where b is 0 (an all-zero group or super-block)."""
    return torch.where(b > 0, a / torch.where(b > 0, b, 1), 0)


def q4_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] fp32 -> (xq [R, S, 256] integers as fp32, dx [R, S]): int8 activations with
    one scale per super-block, exactly as the native kernel rounds them (zero-padded past K)."""
    rows, k = x.shape
    supers = -(-k // SUPER)
    padded = torch.zeros(rows, supers * SUPER, dtype=torch.float32)
    padded[:, :k] = x.float()
    blocks = padded.reshape(rows, supers, SUPER)
    top = blocks.abs().amax(-1)  # [R, S]
    inverse = torch.where(top > 0, 127 / torch.where(top > 0, top, 1), 0)
    return (blocks * inverse[..., None]).round(), top / 127


def q4_reference(x: torch.Tensor, weights: Q4Weights) -> torch.Tensor:
    """What `native.q4_gemv` computes, in float64 PyTorch: x [R, K] fp32 -> [R, N] fp32."""
    n, k = weights.shape
    xq, dx = q4_activations(x)
    supers = xq.shape[1]
    q = torch.zeros(n, supers * SUPER, dtype=torch.float64)
    q[:, :k] = weights.levels().double()
    scaled = (q.reshape(n, -1, GROUP) * weights.sc.double()[..., None]).reshape(n, supers, SUPER)
    dots = torch.einsum("rsk,nsk->rns", xq.double(), scaled)  # sum over g of sc * (q . xq)
    sums = xq.double().reshape(xq.shape[0], -1, GROUP).sum(-1)  # [R, G]
    mins = torch.einsum(
        "rsg,nsg->rns", sums.reshape(-1, supers, 8), weights.mn.double().reshape(n, supers, 8)
    )
    terms = weights.d.double() * dots - weights.dmin.double() * mins  # [R, N, S]
    return (terms * dx.double()[:, None, :]).sum(-1).float()


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
    peaked at 12.9 GB where llama.cpp holds the same Q4_K weights in 1.86 GB (issue 60).

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
        self, linear: nn.Linear, weights: Q4Weights | None = None, tiles: bool = True
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
        # The same weights in the native kernel's tile layout, where asked for and the build
        # reads it (AVX-512, N % 16 == 0); empty elsewhere. Derived at load, never stored.
        # Which layout a layer keeps is measured per machine (`tuning.tune_layout`):
        # on a Zen 4, 4 rows cost 1.05x one row in tiles and 1.6x in rows (the 1.5B's 28
        # layers), but one row of the 0.5B's head streamed 1.2x faster in rows; on an
        # Intel Xeon with AMX the whole 0.5B steps 1.45x faster in tiles.
        to_tiles = native.q4_tiles() if tiles else None
        laid = to_tiles is not None and q4.shape[0] % 16 == 0
        self.register_buffer(
            "tiles",
            to_tiles(*q4.tensors()) if laid else torch.empty(0, dtype=torch.uint8),
            persistent=False,
        )

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
        cls, blocks: Q4Weights, dtype: torch.dtype, bias=None, tiles: bool = True
    ) -> Int4Linear:
        """A layer over `blocks` as they are, computing in `dtype`, with `bias [N]` where
        given: no dense weight needed to make it."""
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


def quantize(
    model: Transformer, kind: str, gguf: Path | None = None, tiles: bool = True
) -> Transformer:
    """Replace every projection and the vocabulary head by an int4 or int8 layer, in place
    ("none" leaves the model as it is).

    CPU only. The embedding table stays as it is (a lookup reads one row per token); a tied
    head is quantized as its own copy. Layers whose shape the format does not take stay
    unquantized. With `gguf` (the Q4_K file the model was converted from), int4 layers take
    the file's 4-bit blocks as they are (`gguf_q4`); `model.quant_report` says which. (A
    whole int4 model is stored for the next load by `models.store`.) `tiles`:
    int4 layers also build the native kernel's tile layout (see Int4Linear), which
    `tuning.tune_layout` keeps where it is timed faster on the machine at hand.
    """
    if kind not in QUANTS:
        raise InvalidParameterError(
            f"quantization must be one of {', '.join(QUANTS)}, got {kind!r}"
        )
    if kind == "none":
        return with_decode_stack(model)
    if model.device.type != "cpu":
        raise InvalidParameterError(f"{kind} quantization is implemented for CPU only")
    from specdec.kernels.gguf_q4 import GGUFWeights, QuantReport

    source = GGUFWeights(gguf) if gguf is not None and kind == "int4" else None
    report = QuantReport()

    def swap(module: nn.Module, attr: str, name: str) -> None:
        layer = _quantized(getattr(module, attr), kind, source, name, report, tiles)
        setattr(module, attr, layer)

    for i, layer in enumerate(model.layers):
        swap(layer.self_attn, "qkv_proj", f"layers.{i}.self_attn.qkv_proj")
        swap(layer.self_attn, "o_proj", f"layers.{i}.self_attn.o_proj")
        swap(layer.mlp, "gate_up_proj", f"layers.{i}.mlp.gate_up_proj")
        swap(layer.mlp, "down_proj", f"layers.{i}.mlp.down_proj")
    swap(model, "lm_head", "lm_head")
    if source is not None:
        log.info("specdec: %s: %s", Path(gguf).name, report.summary())
    model.quant_report = report
    return with_decode_stack(model)


def with_decode_stack(model: Transformer) -> Transformer:
    """`model` with the native decode stack where it applies (int4 or bf16 projections),
    built from its layers' tensors as they are now (again after `tune_layout` drops tiles).
    bf16 projections that compute from panels alone drop their rows as they are packed."""
    from specdec.kernels.decode_stack import DecodeStack  # it imports this module

    drop_unread_rows(model)
    model.decode_stack = DecodeStack.for_model(model)
    return model


def quantize_int4(model: Transformer) -> Transformer:
    return quantize(model, "int4")
