"""A GGUF file's metadata and tensors, read from a memory map in well under a second.

Why not `gguf.GGUFReader`: it builds a numpy view per element of every metadata array, and
a Qwen2 vocabulary is two arrays of ~150,000 strings, so opening the 1.5B's file took ~18 s
on a 2-vCPU Zen 3, once per reader (transformers' GGUF conversion opened it three times).
Here string arrays are skipped by their lengths unless asked for, and a tensor is a view of
the mapping until it is dequantized.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

# Metadata value types of fixed width (GGUF spec): u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64.
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
VERSIONS = (2, 3)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (GGUF stores the fastest-moving dimension first)
    ggml_type: int
    offset: int  # from the start of the data section


class GGUFFile:
    """`metadata` (string arrays as their lengths unless named in `string_arrays`),
    `tensors` (name -> TensorInfo) and `raw(name)` / `dequantized(name)` of one file."""

    def __init__(self, path: str | Path, string_arrays: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self._blob = np.memmap(self.path, mode="r", dtype=np.uint8)
        if bytes(self._blob[:4]) != b"GGUF":
            raise ValueError(f"{self.path} does not start with the GGUF magic bytes")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", self._blob, 4)
        if version not in VERSIONS:
            raise ValueError(f"{self.path} is GGUF version {version}; readable: {VERSIONS}")
        self._pos = 24
        self.metadata = {}
        for _ in range(kv_count):
            key = self._string()
            self.metadata[key] = self._value(self._u32(), keep=key in string_arrays)
        self.tensors: dict[str, TensorInfo] = {}
        for _ in range(tensor_count):
            name = self._string()
            dims = struct.unpack_from(f"<{self._u32()}Q", self._blob, self._pos)
            self._pos += 8 * len(dims)
            ggml_type, offset = struct.unpack_from("<IQ", self._blob, self._pos)
            self._pos += 12
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, offset)
        alignment = self.metadata.get("general.alignment", 32)
        self._data = (self._pos + alignment - 1) // alignment * alignment
        for info in self.tensors.values():  # a truncated file shows here, not mid-conversion
            if self._data + info.offset + self.nbytes(info.name) > len(self._blob):
                raise ValueError(f"{self.path}: tensor {info.name} runs past the end of the file")

    @cached_property
    def architecture(self) -> str:
        architecture = self.metadata.get("general.architecture")
        if not isinstance(architecture, str):
            raise ValueError(f"{self.path} has no general.architecture string in its header")
        return architecture

    def row_bytes(self, name: str) -> int:
        """Bytes of one row (the last dimension) of the tensor as stored."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        info = self.tensors[name]
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        except (ValueError, KeyError):
            raise ValueError(
                f"{self.path}: tensor {name} has unknown ggml type {info.ggml_type}"
            ) from None
        return info.shape[-1] // block * block_bytes

    def nbytes(self, name: str) -> int:
        shape = self.tensors[name].shape
        return int(np.prod(shape[:-1], dtype=np.int64)) * self.row_bytes(name)

    def raw(self, name: str) -> np.ndarray:
        """The tensor as stored: [*shape[:-1], bytes of a row] u8 (a view of the mapping)."""
        info = self.tensors[name]
        start = self._data + info.offset
        return self._blob[start : start + self.nbytes(name)].reshape(
            *info.shape[:-1], self.row_bytes(name)
        )

    def dequantized(self, name: str) -> torch.Tensor:
        """The tensor's values in fp32, [*shape]: transformers' torch dequantization where it
        reads the type (2x gguf-py's numpy one on the 1.5B, and bitwise the same there),
        gguf-py's for the rest (Q5_0, in some AWQ files) and for fp16 / bf16 / fp32."""
        from gguf.quants import dequantize as numpy_dequantize
        from transformers.integrations.gguf.dequant import GGML_BLOCK
        from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

        info = self.tensors[name]
        if info.ggml_type in GGML_BLOCK:
            blocks = torch.from_numpy(np.array(self.raw(name)))
            return torch_dequantize(blocks, info.ggml_type, torch.float32).reshape(info.shape)
        return torch.from_numpy(numpy_dequantize(np.array(self.raw(name)), info.ggml_type))

    def _u32(self) -> int:
        (value,) = struct.unpack_from("<I", self._blob, self._pos)
        self._pos += 4
        return value

    def _string(self) -> str:
        (length,) = struct.unpack_from("<Q", self._blob, self._pos)
        start = self._pos + 8
        self._pos = start + length
        return bytes(self._blob[start : self._pos]).decode("utf-8")

    def _value(self, kind: int, keep: bool = False):
        if kind in _SCALAR:
            (value,) = struct.unpack_from("<" + _SCALAR[kind], self._blob, self._pos)
            self._pos += struct.calcsize(_SCALAR[kind])
            return value
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"{self.path}: unknown GGUF metadata type {kind}")
        element, count = struct.unpack_from("<IQ", self._blob, self._pos)
        self._pos += 12
        if element in _SCALAR:
            values = struct.unpack_from(f"<{count}{_SCALAR[element]}", self._blob, self._pos)
            self._pos += count * struct.calcsize(_SCALAR[element])
            return list(values)
        if element != _STRING:
            raise ValueError(f"{self.path}: GGUF metadata array of type {element} is not readable")
        if keep:
            return [self._string() for _ in range(count)]
        for _ in range(count):  # skipped by their lengths: a vocabulary nobody asked for
            (length,) = struct.unpack_from("<Q", self._blob, self._pos)
            self._pos += 8 + length
        return count
