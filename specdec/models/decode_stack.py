"""Every decoder layer of a small int4 or bf16 step in one native call (native/decode_stack.cpp).

Why: once the int4 kernel streams the weights at the memory's speed, what is left of a
decode step on a CPU is PyTorch's per-op cost: ~40 ops per layer (norms, RoPE, cache writes,
attention, activations), each a few microseconds of dispatch and allocation, for a few rows
of arithmetic. A 0.5B draft has 24 layers: measured on a Zen 3, its int4 step took 46 ms
eagerly, ~13 of them in the products. The native stack does the same computation with the
same roundings (see the .cpp) and nothing else, and it is batch-invariant, so a verify pass
scores each token exactly as a one-token step does.

When it runs: the model is on the CPU, every projection of every layer is a
`quant.Int4Linear` (or every one a bf16 `linear.Linear` in a bf16 model), the native build
is available, and the step is small enough that the layers' measured plan runs it through
the native kernel (`q4_native` or `native_bf16`; without a plan, int4 steps of up to
`PACKED_MAX_ROWS` rows). Prefills and everything else take the eager layers.
`SPECDEC_FUSED=0` turns it off (for comparisons).
"""

from __future__ import annotations

import os

import torch

from specdec.models import native
from specdec.models.kv_cache import KVCache
from specdec.models.linear import Linear, bucket_of
from specdec.models.quant import PACKED_MAX_ROWS, Int4Linear, _q4_bias
from specdec.models.transformer import Transformer


class DecodeStack:
    """The native stack over a `Transformer`'s layers (it keeps references to the layers'
    int4 buffers or bf16 weights; the norms are copied)."""

    def __init__(self, model: Transformer, native_stack) -> None:
        cfg = model.config
        self._probe = model.layers[0].mlp.gate_up_proj  # whose plan decides (all layers agree)
        self._kernel = "q4_native" if type(self._probe) is Int4Linear else "native_bf16"
        self._stack = native_stack(
            [_layer_tensors(layer) for layer in model.layers],
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
        )

    @classmethod
    def for_model(cls, model: Transformer) -> DecodeStack | None:
        """The stack for `model`, or None where it does not apply (see the module doc)."""
        if os.environ.get("SPECDEC_FUSED", "1") == "0" or not _applies(model):
            return None
        built = native.decode_stack()
        return None if built is None else cls(model, built)

    def takes(self, rows: int) -> bool:
        """Whether a step of `rows` new tokens in all should run here."""
        plan = self._probe.plan
        if not plan:  # untuned: int4 steps the int4 kernel serves well; bf16 ones stay eager
            return self._kernel == "q4_native" and rows <= PACKED_MAX_ROWS
        return plan.get(bucket_of(rows)) == self._kernel

    def run(
        self,
        x: torch.Tensor,  # [B, T, H] embedded tokens
        cache: KVCache,
        rows: slice,
        cos: torch.Tensor,  # [B, T, 1, D]
        sin: torch.Tensor,
        slots: torch.Tensor,  # [B, T] cache slot of each token
        span: int,
        mask: torch.Tensor | None,  # [B, 1, T, span] bool
    ) -> torch.Tensor:  # [B, T, H] after the last layer (before the final norm)
        return self._stack.run(x, cache.k, cache.v, rows.start, slots, cos, sin, span, mask)


def _projections(layer) -> tuple:
    return (
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
    )


def _applies(model: Transformer) -> bool:
    cfg = model.config
    projections = [p for layer in model.layers for p in _projections(layer)]
    int4 = all(type(p) is Int4Linear for p in projections)
    bf16 = model.dtype == torch.bfloat16 and all(_native_bf16(p) for p in projections)
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and cfg.head_dim % 8 == 0
        and cfg.head_dim <= 512
        and (int4 or bf16)
    )


def _native_bf16(p) -> bool:
    """A plain bf16 `Linear` (not a tensor-parallel shard) the native bf16 kernel takes."""
    return type(p) is Linear and "native_bf16" in p.kernels()


def _layer_tensors(layer) -> list[torch.Tensor]:
    """The 30 tensors of a layer in decode_stack.cpp's order: the two norms, then qkv, o,
    gate_up and down as (qs, sc, mn, d, dmin, fp32 bias or an empty tensor, the tile layout
    or an empty tensor), bf16 ones as (weight, four empty tensors, fp32 bias or an empty
    tensor, an empty tensor)."""
    norms = layer.input_layernorm, layer.post_attention_layernorm
    tensors = [norm.weight.detach() for norm in norms]
    for p in _projections(layer):
        if type(p) is Int4Linear:
            bias = _q4_bias(p)  # the fp32 bias the int4 kernel adds, as the eager layer does
            tensors += [*p.q4.tensors(), torch.empty(0) if bias is None else bias, p.tiles]
        else:  # bf16: the eager native_bf16 kernel adds the bias in fp32 too
            bias = torch.empty(0) if p.bias is None else p.bias.detach().float()
            tensors += [p.weight.detach(), *[torch.empty(0)] * 4, bias, torch.empty(0)]
    return tensors
