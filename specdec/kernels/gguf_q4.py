"""A GGUF file's Q4_K tensors taken as they are, so `--quant int4` on a Q4_K model runs the
file's own 4-bit weights instead of re-quantizing their bf16 dequantization.

Q4_K keeps, per row and per 256 weights, an fp16 scale `d` and minimum scale `dmin`, 6-bit
scales and minimums for the eight groups of 32, and 4-bit values; `Q4Weights` is the same
arithmetic with 8-bit group scales, so every Q4_K tensor maps onto it exactly (the bytes of
the 4-bit values are copied as they are). Tensors of other types (a Q4_K_M file keeps half
the layers' `attn_v` and `ffn_down`, and `output`, in Q6_K) are re-quantized to 4 bits from
the loaded weights: fewer bits than the file had, which `QuantReport` counts.

Each mapped tensor is checked against the weights the model loaded (the same file,
dequantized by transformers): a mismatch beyond bf16 rounding (a layout this module does not
know, e.g. permuted rows) falls back to re-quantization rather than running wrong weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.kernels.q4 import Q4Weights, q4_quantize

log = logging.getLogger(__name__)

BLOCK_BYTES = 144  # Q4_K per 256 weights: d, dmin (fp16), 12 bytes of 6-bit scales, 128 of values

# native layer name (format string over the layer index) -> GGUF tensors fused into it, in order
_PARTS = {
    "layers.{i}.self_attn.qkv_proj": ("blk.{i}.attn_q", "blk.{i}.attn_k", "blk.{i}.attn_v"),
    "layers.{i}.self_attn.o_proj": ("blk.{i}.attn_output",),
    "layers.{i}.mlp.gate_up_proj": ("blk.{i}.ffn_gate", "blk.{i}.ffn_up"),
    "layers.{i}.mlp.down_proj": ("blk.{i}.ffn_down",),
}


@dataclass
class QuantReport:
    """Which weights ran as the file stored them and which were re-quantized (rows)."""

    exact: list[str] = field(default_factory=list)
    requantized: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.exact)} tensors taken from the file's Q4_K blocks as they are, "
            f"{len(self.requantized)} re-quantized to 4 bits"
        )


def q4_k_blocks(blocks: np.ndarray) -> Q4Weights:
    """Q4_K blocks [N, K/256 * 144] u8 -> the same weights as `Q4Weights`, exactly."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, BLOCK_BYTES)  # [N, S, 144]
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, S]
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    s = b[..., 4:16].astype(np.uint8)  # [N, S, 12]: eight 6-bit scales and eight 6-bit minimums
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    qs = b[..., 16:].reshape(n, -1)  # [N, K/2]: 64-weight chunks, low nibbles first 32
    return Q4Weights(
        qs=torch.from_numpy(np.ascontiguousarray(qs)),
        sc=torch.from_numpy(np.ascontiguousarray(sc.reshape(n, -1))),
        mn=torch.from_numpy(np.ascontiguousarray(mn.reshape(n, -1))),
        d=torch.from_numpy(np.ascontiguousarray(d)),
        dmin=torch.from_numpy(np.ascontiguousarray(dmin)),
    )


def _cat(parts: list[Q4Weights]) -> Q4Weights:
    if len(parts) == 1:
        return parts[0]
    columns = zip(*(p.tensors() for p in parts), strict=True)  # qs of every part, sc of ...
    return Q4Weights(*(torch.cat(column) for column in columns))


class GGUFWeights:
    """The tensors of one GGUF file, read through a memory map when asked for."""

    def __init__(self, path: Path) -> None:
        from gguf import GGMLQuantizationType

        from specdec.gguf_file import GGUFFile

        self.path = Path(path)
        self.file = GGUFFile(self.path)
        self.tensors = {
            name.removesuffix(".weight"): info for name, info in self.file.tensors.items()
        }
        self.q4_k = GGMLQuantizationType.Q4_K

    def layer(self, name: str, weight: torch.Tensor, report: QuantReport) -> Q4Weights:
        """4-bit weights for the native layer `name` whose loaded weight is `weight` [N, K]:
        the file's blocks where it has Q4_K that matches, re-quantized rows elsewhere."""
        names = self._parts(name)
        rows = [self.tensors[p].shape[0] for p in names]  # [N, K]
        if sum(rows) != weight.shape[0]:
            raise ValueError(
                f"{name}: the file's parts have {sum(rows)} rows, the model {weight.shape[0]}"
            )
        parts, start = [], 0
        for gguf_name, count in zip(names, rows, strict=True):
            loaded, start = weight[start : start + count], start + count
            tensor = self.tensors[gguf_name]
            if tensor.ggml_type == self.q4_k:
                mapped = q4_k_blocks(np.asarray(self.file.raw(tensor.name)))
                if _matches(mapped, loaded):
                    parts.append(mapped)
                    report.exact.append(gguf_name)
                    continue
                log.warning(
                    "specdec: %s's Q4_K blocks differ from the loaded weights; re-quantizing",
                    gguf_name,
                )
            parts.append(q4_quantize(loaded))
            report.requantized.append(gguf_name)
        return _cat(parts)

    def _parts(self, name: str) -> tuple[str, ...]:
        if name == "lm_head":  # a tied head reads the embedding table
            return ("output",) if "output" in self.tensors else ("token_embd",)
        for pattern, parts in _PARTS.items():
            prefix, suffix = pattern.split("{i}")
            if name.startswith(prefix) and name.endswith(suffix):
                i = name[len(prefix) : len(name) - len(suffix)]
                return tuple(p.format(i=i) for p in parts)
        raise KeyError(f"no GGUF tensors known for the layer {name}")


def _matches(mapped: Q4Weights, loaded: torch.Tensor) -> bool:
    """Whether the file's blocks dequantize to the loaded weights, up to the loaded dtype's
    rounding (transformers dequantized the same blocks and cast them)."""
    if mapped.shape != tuple(loaded.shape):
        return False
    exact = mapped.dequantize()
    tolerance = exact.abs() * 2.0**-7 + 1e-6  # bf16 keeps 8 significant bits
    return bool(((exact - loaded.float()).abs() <= tolerance).all())
