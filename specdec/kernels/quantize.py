"""A whole model's CPU projections as they will compute: quantized in place (`quantize`)
and stepped through the native decode stack where it applies (`with_decode_stack`).

Above the layer formats (`quant`, `gguf_q4`) and the stack (`decode_stack`), which each
know one kind of layer or pass.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from specdec.errors import InvalidParameterError
from specdec.kernels.decode_stack import DecodeStack
from specdec.kernels.gguf_q4 import GGUFWeights, QuantReport
from specdec.kernels.linear import drop_unread_rows
from specdec.kernels.quant import QUANTS, _quantized

if TYPE_CHECKING:  # annotations only: the models are built on these kernels
    from specdec.models.transformer import Transformer

log = logging.getLogger(__name__)


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
    drop_unread_rows(model)
    model.decode_stack = DecodeStack.for_model(model)
    return model


def quantize_int4(model: Transformer) -> Transformer:
    return quantize(model, "int4")
