"""Weight-only int4 for drafters: a quarter of the bytes of bf16 per decode step.

A drafter only has to be cheap and usually right; the acceptor corrects everything else,
so quantizing the draft model cannot change the output distribution (q may be anything).
Decoding is bound by weight bytes, so 4-bit weights (asymmetric, one bf16 scale and zero
per group of 32 input channels) make a draft step cheaper, which raises the speedup
directly through the `k * c` term. The bundled models were Q4 GGUF files to begin with, so
most of their weights already sit on such a grid.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.errors import InvalidParameterError
from specdec.models.transformer import Transformer

GROUP = 32
# The packed kernel is made for decoding: at 1 row it streams a quarter of the bytes, but
# past a few rows it falls far behind a dense matmul (measured on the reference CPU:
# 256 rows, 896 -> 9728, 104 ms int4 vs 15 ms bf16). Prefills take the dense weights.
INT4_MAX_ROWS = 8


class Int4Linear(nn.Module):
    """y = x @ dequant(W).T [+ bias] through torch's packed int4 CPU kernel for the few rows
    of a draft step; products of more rows (a prompt's prefill) use the original weights,
    kept for that (a draft model is small: the extra memory buys fast admission)."""

    def __init__(self, linear: nn.Linear, group: int = GROUP) -> None:
        super().__init__()
        n, k = linear.weight.shape
        w = linear.weight.detach().float().reshape(n, k // group, group)
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp_min(1e-8)
        q = ((w - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        # The kernel computes (q - 8) * scale + zero.
        zero = low + 8 * scale
        scales_zeros = torch.stack([scale[..., 0].t(), zero[..., 0].t()], dim=-1)
        dtype = linear.weight.dtype
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2))
        self.register_buffer("scales_zeros", scales_zeros.to(dtype).contiguous())  # [k/g, n, 2]
        self.bias = linear.bias
        self.dense = linear
        self.group, self.out_features, self.dtype = group, n, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        if x.numel() // x.shape[-1] > INT4_MAX_ROWS:
            return self.dense(x)
        flat = x.reshape(-1, x.shape[-1]).to(self.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed, self.group, self.scales_zeros
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _int4(linear: nn.Module) -> nn.Module:
    """`Int4Linear` where the kernel supports the shape (N % 16 == 0, K % GROUP == 0)."""
    if hasattr(linear, "inner"):  # a tensor-parallel wrapper: quantize the local shard
        linear.inner = _int4(linear.inner)
        return linear
    n, k = linear.weight.shape
    return Int4Linear(linear) if n % 16 == 0 and k % GROUP == 0 else linear


def quantize_int4(model: Transformer) -> Transformer:
    """Replace every projection and the vocabulary head by `Int4Linear`, in place.

    CPU only (torch's packed int4 kernel for CPU). The embedding table stays as it is (a
    lookup reads one row per token); a tied head is quantized as its own copy. Layers whose
    shape the kernel does not take stay unquantized.
    """
    if model.device.type != "cpu":
        raise InvalidParameterError("int4 draft quantization is implemented for CPU only")
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj, attn.o_proj = _int4(attn.qkv_proj), _int4(attn.o_proj)
        mlp.gate_up_proj, mlp.down_proj = _int4(mlp.gate_up_proj), _int4(mlp.down_proj)
    model.lm_head = _int4(model.lm_head)
    return model
