"""Weight-only int4 and int8 projections: a quarter or half of bf16's bytes per decode step.

Decoding is bound by weight bytes, so fewer bits per weight make every step cheaper. For a
drafter that changes only q, which the acceptor corrects: the output distribution cannot
change. For the target (`--quant`) the quantized model *is* the model that runs, and the
lossless acceptors are lossless with respect to it: speculative output is distributed as
plain decoding of the same quantized target.

To keep that true, a quantized layer's `weight` holds the dequantized weights in the model
dtype, and every kernel computes with exactly those values: torch's packed int4 / int8
kernels for the few rows of a decode or verify step, the dense kernels of `Linear` (on the
dequantized weights) where they measure faster, e.g. a prefill's hundreds of rows.
`tune_kernels` decides per bucket of rows, on the machine at hand.

int4: asymmetric, one scale and one zero point per group of 32 input channels (the layout
of GGUF's Q4 formats: Q4_K's sub-blocks are 32 weights with a scale and a minimum each).
int8: symmetric, one scale per output channel.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.errors import InvalidParameterError
from specdec.models.linear import Kernel, Linear
from specdec.models.transformer import Transformer

GROUP = 32
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


class Int4Linear(_QuantLinear):
    """y = x @ dequant(W).T [+ bias], W in 4 bits through torch's packed int4 CPU kernel."""

    packed_name = "int4"

    def __init__(self, linear: nn.Linear, group: int = GROUP) -> None:
        n, k = linear.weight.shape
        w = linear.weight.detach().float().reshape(n, k // group, group)
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp_min(1e-8)
        q = ((w - low) / scale).round().clamp(0, 15)
        # The kernel computes (q - 8) * scale + zero with scale and zero in the activation
        # dtype; the dequantized weights are computed from those same rounded values.
        dtype = linear.weight.dtype
        scale = scale.to(dtype).float()
        zero = (low + 8 * scale).to(dtype).float()
        dequantized = ((q - 8) * scale + zero).reshape(n, k)
        super().__init__(linear, dequantized)
        scales_zeros = torch.stack([scale[..., 0].t(), zero[..., 0].t()], dim=-1)
        q = q.to(torch.int32).reshape(n, k)
        self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2))
        self.register_buffer("scales_zeros", scales_zeros.to(dtype).contiguous())  # [K/g, N, 2]
        self.group = group

    def packed(self, fmt, x):
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(self.weight.dtype), self.qweight, self.group, self.scales_zeros
        )
        return (out if self.bias is None else out + self.bias).to(x.dtype)


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

    def packed(self, fmt, x):
        out = torch.ops.aten._weight_int8pack_mm(x.to(self.weight.dtype), self.qweight, self.scales)
        return (out if self.bias is None else out + self.bias).to(x.dtype)


def _quantized(linear: nn.Module, kind: str) -> nn.Module:
    """The quantized layer where the kernel supports the shape (N % 16 == 0 and, for int4,
    K % GROUP == 0); the layer unchanged otherwise."""
    if hasattr(linear, "inner"):  # a tensor-parallel wrapper: quantize the local shard
        linear.inner = _quantized(linear.inner, kind)
        return linear
    n, k = linear.weight.shape
    if n % 16:
        return linear
    if kind == "int4":
        return Int4Linear(linear) if k % GROUP == 0 else linear
    return Int8Linear(linear)


def quantize(model: Transformer, kind: str) -> Transformer:
    """Replace every projection and the vocabulary head by an int4 or int8 layer, in place
    ("none" leaves the model as it is).

    CPU only (torch's packed kernels for CPU). The embedding table stays as it is (a lookup
    reads one row per token); a tied head is quantized as its own copy. Layers whose shape
    the kernel does not take stay unquantized.
    """
    if kind not in QUANTS:
        raise InvalidParameterError(
            f"quantization must be one of {', '.join(QUANTS)}, got {kind!r}"
        )
    if kind == "none":
        return model
    if model.device.type != "cpu":
        raise InvalidParameterError(f"{kind} quantization is implemented for CPU only")
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj, attn.o_proj = _quantized(attn.qkv_proj, kind), _quantized(attn.o_proj, kind)
        mlp.gate_up_proj = _quantized(mlp.gate_up_proj, kind)
        mlp.down_proj = _quantized(mlp.down_proj, kind)
    model.lm_head = _quantized(model.lm_head, kind)
    return model


def quantize_int4(model: Transformer) -> Transformer:
    return quantize(model, "int4")
