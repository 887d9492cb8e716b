"""Load a model straight into its quantized layers, one projection at a time, after
checking that it fits.

Why: loading the whole model in its dtype and quantizing it afterwards holds every dense
weight (3.1 GB for the 1.5B in bf16, more while q/k/v and gate/up are concatenated) beside
the growing 4-bit ones, so the int4 model peaked at several times its size. Read one tensor
at a time from the safetensors files and quantized as it arrives, a load holds the
quantized model plus one fused projection.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specdec.kernels import mapped
from specdec.kernels.quantize import quantize, with_decode_stack
from specdec.models import footprint, store
from specdec.models.config import ModelConfig
from specdec.models.loading import (
    LazySafetensors,
    load_transformer,
    native_tensors,
    torch_dtype,
)
from specdec.models.transformer import Transformer, on_meta
from specdec.paths import cache_root

# Native names of the layers a quantizing load quantizes (the others load as they are).
_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _is_projection_weight(name: str) -> bool:
    if name == "lm_head.weight":
        return True
    return name.endswith(".weight") and name.removesuffix(".weight").split(".", 2)[-1] in (
        _PROJECTIONS
    )


def load_model(
    path: str | Path,
    dtype: str,
    device: str | torch.device,
    quant: str,
    gguf: Path | None = None,
    what: str = "the model",
) -> Transformer:
    """The model at `path` in `dtype`, quantized (`kernels.quantize`), refused up front where
    it would not fit in the memory available (`footprint.check_fits`). A CPU int4 / int8
    model without tensor parallelism streams its weights into the quantized layers
    (`load_quantized`); others load whole and are quantized after. (A tensor-parallel
    shard: `specdec.distributed.sharding.load_shard`, then `kernels.quantize`.)"""
    path = Path(path)
    device = torch.device(device)
    stores = quant == "int4" and device.type == "cpu" and path.is_dir() and store.enabled()
    if path.is_dir():
        cfg = ModelConfig.from_dir(path)
        stored = stores and _store(path, dtype, gguf).file.is_file()
        needs = footprint.estimate_bytes(cfg, torch_dtype(dtype), quant, device, stored=stored)
        footprint.check_fits(f"{what} ({quant if quant != 'none' else dtype})", needs)
    if stores:
        return load_stored(path, dtype, gguf)
    if quant != "none" and device.type == "cpu":
        return load_quantized(path, dtype, quant, gguf)
    return quantize(load_transformer(path, dtype, device), quant, gguf)


def load_stored(path: Path, dtype: str, gguf: Path | None = None) -> Transformer:
    """The int4 model of `path` (and `gguf`) mapped from its store (`models.store`), built
    by `load_quantized` and stored where there is none yet. A model just stored is read
    back from the file, so the first process also holds mapped weights, not a copy."""
    model_store = _store(path, dtype, gguf)
    cfg, torch_type = ModelConfig.from_dir(path), torch_dtype(dtype)
    model = model_store.load(cfg, torch_type)
    if model is None:
        model = load_quantized(path, dtype, "int4", gguf)
        if model_store.save(model):  # read back: never the built copy and the mapped one
            del model
            model = model_store.load(cfg, torch_type) or load_quantized(path, dtype, "int4", gguf)
    return with_decode_stack(model)


def _store(path: Path, dtype: str, gguf: Path | None) -> store.ModelStore:
    return store.ModelStore.for_sources(path, dtype, "int4", gguf, cache_root() / "int4")


def load_quantized(
    path: str | Path, dtype: str, kind: str, gguf: Path | None = None
) -> Transformer:
    """`quantize(load_transformer(path, dtype), kind, gguf)` computed one projection at a
    time: the same layers and the same 4-bit (or 8-bit) values, never the whole dense model."""
    from specdec.kernels.gguf_q4 import GGUFWeights, QuantReport
    from specdec.kernels.quant import _quantized

    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    torch_type = torch_dtype(dtype)
    hf = LazySafetensors(path)
    with on_meta():
        model = Transformer(cfg)
    if cfg.tie_word_embeddings:  # the head is quantized as its own copy
        model.lm_head = type(model.lm_head)(
            cfg.hidden_size, cfg.vocab_size, bias=False, device="meta"
        )
    # Everything but the projections' weights first (the biases a quantized layer takes).
    for name, tensor in native_tensors(hf, cfg, lambda n: not _is_projection_weight(n)):
        _assign(model, name, tensor.to(torch_type))
    source = GGUFWeights(gguf) if gguf is not None and kind == "int4" else None
    report = QuantReport()
    for name, tensor in native_tensors(hf, cfg, _is_projection_weight):
        layer_name = name.removesuffix(".weight")
        parent_name, _, attr = layer_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, attr)
        linear.weight = nn.Parameter(tensor.to(torch_type), requires_grad=False)
        quantized = _quantized(linear, kind, source, layer_name, report)
        if quantized is not linear:  # the checkpoint pages it was read from are not needed
            mapped.release([tensor])
        setattr(parent, attr, quantized)
        del tensor, linear  # the dense weight goes with it (a layer the format skips keeps it)
    model.quant_report = report
    model.inv_freq = torch.tensor(cfg.inv_freq(), dtype=torch.float32)
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:  # a name the mapping missed: fail here, not with garbage later
        raise RuntimeError(f"quantizing load left tensors unloaded: {meta[:5]}")
    return with_decode_stack(model.eval().requires_grad_(False))


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, nn.Parameter(tensor, requires_grad=False))
