"""The decoder stack as few GPU kernels: each layer's elementwise work fused around its
matmuls by TorchInductor, for the fixed-shape passes of `specdec.graphs.static_pass`.

Why: a replayed CUDA graph leaves no host time, so a pass costs what its kernels cost, and
an eager layer is ~40 small kernels (norms, RoPE, residuals, SiLU, layout copies), each a
few microseconds whatever its bytes: on an H200 the 1.5B's one-token pass took 3.4 ms for
0.74 ms of weight reads. Here a layer is

    [norm + qkv matmul + RoPE]  cache writes + attention  [o matmul + residual + norm +
    gate/up matmul + SiLU*up + down matmul + residual + the next layer's norm]

where the bracketed parts are compiled functions (TorchInductor, `dynamic=False`). The
matmuls stay the library's (inductor's default mode calls cuBLAS for them; an earlier
whole-layer compile made a 9-token pass 2.3x a one-token one), and attention and the cache
writes stay eager: they depend on the key span, so leaving them out means the compiled
functions depend only on (rows, tokens) and the model's shapes. The functions take the
weights as arguments, so all layers of a model share one compilation per bucket.

Numerics: the same operations as `Transformer.run_layers` (shared functions of
`specdec.models.transformer`), fused, with every cast the eager code makes kept
(`emulate_precision_casts`): fp32 and bf16 agree with the eager stack to rounding, and a
pass scores a token the same whatever its width, as the eager stack does (both checked
on the CPU; on an H200 before the option, a self-drafting bf16 engine rejected its own
drafts). `StaticPasses` races the stacks at a model's first capture and keeps the faster
for all its passes (`Transformer.layer_stack`); `fused_layers_apply` says where this one
can run at all (plain dense layers).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from specdec.kernels.linear import Linear
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import (
    Transformer,
    attend,
    gqa_mask,
    merge_heads,
    rms_norm,
    split_heads,
    swiglu,
)

# Compiled functions, made on first use (compiling is slow to import and start).
_compiled: dict[str, object] = {}
# Recompilations allowed per function: one per (rows, tokens) bucket of each model shape.
RECOMPILE_LIMIT = 512
# Round where eager rounds: without it inductor keeps some bf16 intermediates in fp32,
# and which ones depends on the shape, so a 5-token pass scored its tokens differently
# from five 1-token passes (a model drafting for itself rejected its own drafts).
_OPTIONS = {"emulate_precision_casts": True}


def _qkv(
    h: torch.Tensor,  # [B, T, E] normed
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cos: torch.Tensor,  # [B, T, 1, D]
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q `[B, Hkv, G*T, D]`, k and v `[B, T, Hkv, D]` (`split_heads`)."""
    return split_heads(F.linear(h, weight, bias), cos, sin, num_heads, num_kv_heads)


def _after_attention(
    x: torch.Tensor,  # [B, T, E] the layer's input
    out: torch.Tensor,  # [B, Hkv, G*T, D] attention's output
    num_heads: int,
    o_weight: torch.Tensor,
    o_bias: torch.Tensor | None,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
    next_norm: torch.Tensor,  # the next layer's input norm (the model's final norm last)
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of `DecoderLayer.forward` plus the next norm: (x [B, T, E], its norm)."""
    x = x + F.linear(merge_heads(out, num_heads), o_weight, o_bias)
    h = F.linear(rms_norm(x, post_norm, eps), gate_up_weight, gate_up_bias)
    x = x + F.linear(swiglu(h), down_weight, down_bias)
    return x, rms_norm(x, next_norm, eps)


def _compiled_fn(name: str):
    if name not in _compiled:
        fn = {"norm": rms_norm, "qkv": _qkv, "after": _after_attention}[name]
        _compiled[name] = torch.compile(fn, dynamic=False, fullgraph=True, options=_OPTIONS)
    return _compiled[name]


def fused_layers_apply(model: Transformer) -> bool:
    """Whether `run_fused_layers` can run `model`: every projection a plain dense `Linear`
    (quantized layers have their own kernels) and no native decode stack."""
    if model.decode_stack is not None:
        return False
    return all(
        type(linear) is Linear
        for layer in model.layers
        for linear in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        )
    )


def run_fused_layers(
    model: Transformer,
    tokens: torch.Tensor,  # [B, T]
    cache: KVCache,
    rows: slice,
    cos: torch.Tensor,  # [B, T, 1, D]
    sin: torch.Tensor,
    write: tuple[torch.Tensor, torch.Tensor],  # row index [B, 1], slot index [B, T]
    span: int,
    mask: torch.Tensor | None,  # [B, 1, T, span] bool
    attention: list | None = None,  # SDPA backends to allow (`torch.nn.attention`)
) -> torch.Tensor:  # [B, T, E] final-normed
    """`Transformer.run_layers` with the compiled layer functions (same contract);
    `attention` restricts SDPA's kernels (None: SDPA's own pick)."""
    cfg = model.config
    groups = cfg.num_heads // cfg.num_kv_heads
    mask = gqa_mask(mask, groups)  # once per pass, not once per layer
    if mask is not None:  # additive, as SDPA would convert it in every layer
        mask = torch.zeros(mask.shape, dtype=cos.dtype, device=mask.device).masked_fill(
            ~mask, float("-inf")
        )
    eps = cfg.rms_norm_eps
    norm, qkv, after = (_compiled_fn(name) for name in ("norm", "qkv", "after"))
    backends = sdpa_kernel(attention) if attention else contextlib.nullcontext()
    with (
        backends,
        torch._dynamo.config.patch(
            recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT * 4
        ),
    ):
        x = model.embed_tokens(tokens)
        h = norm(x, model.layers[0].input_layernorm.weight, eps)
        layers = model.layers
        for i, (layer, k_cache, v_cache) in enumerate(zip(layers, cache.k, cache.v, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp
            proj = attn.qkv_proj
            q, k, v = qkv(h, proj.weight, proj.bias, cos, sin, cfg.num_heads, cfg.num_kv_heads)
            out = attend(q, k, v, k_cache[rows], v_cache[rows], write, span, mask)
            following = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
            x, h = after(
                x,
                out,
                cfg.num_heads,
                attn.o_proj.weight,
                attn.o_proj.bias,
                layer.post_attention_layernorm.weight,
                mlp.gate_up_proj.weight,
                mlp.gate_up_proj.bias,
                mlp.down_proj.weight,
                mlp.down_proj.bias,
                following.weight,
                eps,
            )
    return h
