"""The 4-bit weight format (GGUF Q4_K's arithmetic) and its float64 reference product.

A scale and a minimum per group of 32 inputs, themselves quantized per super-block of 256,
so a Q4_K file's tensors run as stored (`gguf_q4`); other checkpoints are quantized at load
(round to nearest, `q4_quantize`). The layers computing with it are in `quant`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

GROUP = 32  # weights per 4-bit group (one scale and minimum)
SUPER = 256  # weights per super-block (one scale for the group scales, Q4_K's)


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
