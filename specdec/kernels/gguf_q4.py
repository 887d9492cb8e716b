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
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from specdec.kernels.quant import Q4Weights, q4_quantize

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
        from gguf import GGMLQuantizationType, GGUFReader

        self.path = Path(path)
        self.tensors = {
            t.name.removesuffix(".weight"): t for t in GGUFReader(self.path, "r").tensors
        }
        self.q4_k = GGMLQuantizationType.Q4_K

    def layer(self, name: str, weight: torch.Tensor, report: QuantReport) -> Q4Weights:
        """4-bit weights for the native layer `name` whose loaded weight is `weight` [N, K]:
        the file's blocks where it has Q4_K that matches, re-quantized rows elsewhere."""
        names = self._parts(name)
        rows = [int(self.tensors[p].shape[-1]) for p in names]  # GGUF shapes are [K, N]
        if sum(rows) != weight.shape[0]:
            raise ValueError(
                f"{name}: the file's parts have {sum(rows)} rows, the model {weight.shape[0]}"
            )
        parts, start = [], 0
        for gguf_name, count in zip(names, rows, strict=True):
            loaded, start = weight[start : start + count], start + count
            tensor = self.tensors[gguf_name]
            if tensor.tensor_type == self.q4_k:
                mapped = q4_k_blocks(np.asarray(tensor.data))
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


_Q4_FIELDS = tuple(f.name for f in fields(Q4Weights))  # qs, sc, mn, d, dmin


class StoredGGUFWeights:
    """`GGUFWeights` whose answers are kept on disk, so a later load of the same file skips
    reading it: parsing a Qwen GGUF's metadata took 8.5 s here, checking its blocks against
    the loaded weights and re-quantizing its Q6_K tensors another ~15 s per model.

    One safetensors file per (GGUF file, its size and mtime, the loaded dtype, this code's
    version) under `$SPECDEC_HOME/int4/`, written once every layer was asked for (`save`).
    A file that cannot be read (truncated, corrupt) is ignored with a warning and written
    again. The file is opened only when a layer is missing from the store."""

    VERSION = 1  # bump when the mapping or the Q4Weights layout changes

    def __init__(self, path: Path, dtype: torch.dtype, root: Path | None = None) -> None:
        import hashlib

        from specdec.paths import cache_root

        self.gguf = Path(path)
        stat = self.gguf.stat()
        key = f"{self.gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}|{self.VERSION}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.file = (root or cache_root() / "int4") / f"{self.gguf.stem}-{digest}.safetensors"
        self.stored, self.parts = self._read()
        self.new = False
        self._source: GGUFWeights | None = None

    def _read(self) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
        if not self.file.is_file():
            return {}, {}
        import json

        from safetensors import safe_open

        try:
            with safe_open(str(self.file), "pt") as f:
                parts = json.loads(f.metadata()["parts"])
                return {name: f.get_tensor(name) for name in f.keys()}, parts  # noqa: SIM118
        except Exception as err:  # noqa: BLE001 - any unreadable file is recomputed
            log.warning("specdec: ignoring the unreadable int4 store %s (%s)", self.file, err)
            return {}, {}

    def layer(self, name: str, weight: torch.Tensor, report: QuantReport) -> Q4Weights:
        if name in self.parts:
            stored = Q4Weights(*(self.stored[f"{name}.{f}"] for f in _Q4_FIELDS))
            if stored.shape == tuple(weight.shape):
                report.exact += self.parts[name]["exact"]
                report.requantized += self.parts[name]["requantized"]
                return stored
        if self._source is None:
            self._source = GGUFWeights(self.gguf)
        own = QuantReport()
        weights = self._source.layer(name, weight, own)
        report.exact += own.exact
        report.requantized += own.requantized
        self.parts[name] = {"exact": own.exact, "requantized": own.requantized}
        for f in _Q4_FIELDS:
            self.stored[f"{name}.{f}"] = getattr(weights, f)
        self.new = True
        return weights

    def save(self) -> None:
        """Write the store if a layer was computed; atomically, so a crash leaves none."""
        if not self.new:
            return
        import json
        import os

        from safetensors.torch import save_file

        partial = self.file.with_suffix(f".{os.getpid()}.partial")
        tensors = {k: v.contiguous() for k, v in self.stored.items()}
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(partial), metadata={"parts": json.dumps(self.parts)})
            os.replace(partial, self.file)
        except OSError as err:  # a full or read-only disk costs the next load time, no more
            log.warning("specdec: could not store int4 layers in %s (%s)", self.file, err)
            partial.unlink(missing_ok=True)
        self.new = False
