"""Every decoder layer of a small int4 step in one native call (native/decode_stack.cpp).

Why: once the int4 kernel streams the weights at the memory's speed, what is left of a
decode step on a CPU is PyTorch's per-op cost: ~40 ops per layer (norms, RoPE, cache writes,
attention, activations), each a few microseconds of dispatch and allocation, for a few rows
of arithmetic. A 0.5B draft has 24 layers: measured on a Zen 3, its int4 step took 46 ms
eagerly, ~13 of them in the products. The native stack does the same computation with the
same roundings (see the .cpp) and nothing else, and it is batch-invariant, so a verify pass
scores each token exactly as a one-token step does.

When it runs: the model is on the CPU, every projection of every layer is an
`quant.Int4Linear`, the native build is available, and the step is small enough that the
layers' measured plan runs it through the int4 kernel (`q4_native`; without a plan, up to
`PACKED_MAX_ROWS` rows). Prefills and everything else take the eager layers.
`SPECDEC_FUSED=0` turns it off (for comparisons).
"""

from __future__ import annotations

import os

import torch

from specdec.models import native
from specdec.models.kv_cache import KVCache
from specdec.models.linear import bucket_of
from specdec.models.quant import PACKED_MAX_ROWS, Int4Linear, _q4_bias
from specdec.models.transformer import Transformer


class DecodeStack:
    """The native stack over a quantized `Transformer`'s layers (it keeps references to the
    layers' int4 buffers; the norms are copied)."""

    def __init__(self, model: Transformer, native_stack) -> None:
        cfg = model.config
        self._probe = model.layers[0].mlp.gate_up_proj  # whose plan decides (all layers agree)
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
        return plan.get(bucket_of(rows)) == "q4_native" if plan else rows <= PACKED_MAX_ROWS

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
    return (
        model.device.type == "cpu"
        and model.dtype in (torch.float32, torch.bfloat16)
        and cfg.head_dim % 8 == 0
        and cfg.head_dim <= 512
        and all(type(p) is Int4Linear for p in projections)
    )


def _layer_tensors(layer) -> list[torch.Tensor]:
    """The 26 tensors of a layer in decode_stack.cpp's order: the two norms, then qkv, o,
    gate_up and down as (qs, sc, mn, d, dmin, fp32 bias or an empty tensor)."""
    norms = layer.input_layernorm, layer.post_attention_layernorm
    tensors = [norm.weight.detach() for norm in norms]
    for p in _projections(layer):
        bias = _q4_bias(p)  # the fp32 bias the int4 kernel adds, as the eager layer passes it
        tensors += [*p.q4.tensors(), torch.empty(0) if bias is None else bias]
    return tensors
