"""A model's memory: what it holds once loaded, what a load will need, and a guard that
refuses a load which would not fit, before it starts.

Why a guard: a load that does not fit is killed by the kernel's OOM killer part way through
(minutes in, no message), or pushes the machine into swap. Refused up front with the
figures, a user can pick a smaller model or quantization, or free memory.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.kernels.linear import Linear
from specdec.models.config import ModelConfig

GB = 1e9
# Bytes a 4-bit weight takes in `q4.Q4Weights`: the nibble, a u8 scale and minimum per
# 32 weights, two fp32 per 256.
INT4_BYTES = 0.5 + 2 / 32 + 8 / 256
# Python, torch, the tokenizer and the kernels' scratch: measured ~0.45 GB RSS for a process
# that has imported torch and loaded a tokenizer, before any weight.
RUNTIME_BYTES = int(0.5 * GB)
# `SPECDEC_MEMORY_LIMIT` (bytes, or with a G/M suffix) caps what the guard takes as
# available: a container's limit psutil does not see, or a test's simulated small machine.
LIMIT_ENV = "SPECDEC_MEMORY_LIMIT"


class InsufficientMemoryError(SpecdecError, MemoryError):
    """A model that would not fit in the memory available, refused before loading."""


def resident_bytes(module: nn.Module) -> int:
    """Bytes `module` holds: every distinct storage of its parameters, buffers and the
    kernels' prepared weight formats (`Linear.formats`), counted once however many
    tensors view it (tied heads, a decode stack's references)."""
    seen: dict[int, int] = {}

    def add(t) -> None:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(t, (tuple, list)):
            for item in t:
                add(item)

    for t in (*module.parameters(), *module.buffers()):
        add(t)
    for m in module.modules():
        for fmt in getattr(m, "formats", {}).values():
            add(fmt)
    return sum(seen.values())


def step_bytes(model) -> int | None:
    """Bytes a one-token step reads: each projection in its most compact stored format and
    the other weights, but not the embedding or vocabulary head (a row of one; the same in
    a pair sharing a vocabulary). None for a drafter that is not a model."""
    if not isinstance(model, nn.Module):
        return None
    total = 0
    for name, module in model.named_modules():
        if "embed_tokens" in name or "lm_head" in name:
            continue
        if isinstance(module, Linear):
            total += module.stored_bytes()
        else:
            total += sum(p.nbytes for p in module.parameters(recurse=False))
    return total


def projection_weights(cfg: ModelConfig) -> tuple[int, int]:
    """(weights of every decoder projection, of the vocabulary head)."""
    q = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    layer = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    layer += 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_layers * layer, cfg.vocab_size * cfg.hidden_size


def resident_estimate(cfg: ModelConfig, dtype: torch.dtype, quant: str) -> int:
    """What a model will hold once loaded on a CPU: the embedding table in `dtype`;
    projections and head in 4 bits (int4), in int8 beside their dequantized copy (int8),
    or in `dtype`, twice for a half-precision one (a bf16 model on a CPU keeps the native
    kernel's panel layout beside the row one)."""
    size = torch.finfo(dtype).bits // 8
    layers, head = projection_weights(cfg)
    per_weight = {"int4": INT4_BYTES, "int8": 1 + size}.get(quant, 2 * size if size == 2 else size)
    return int(cfg.vocab_size * cfg.hidden_size * size + (layers + head) * per_weight)


def estimate_bytes(
    cfg: ModelConfig, dtype: torch.dtype, quant: str, device: str = "cpu", *, stored: bool = False
) -> int:
    """The most a load holds: `resident_estimate` plus its largest transient (a quantizing
    load: one fused projection read and concatenated, and for int4 the native kernel's tile
    layout built beside the blocks until the store is written; a whole load: the
    checkpoint's tensors while they are adopted). `stored`: an int4 model mapped from its
    store, which reads one of the two layouts. 0 on a GPU (another budget)."""
    if torch.device(device).type != "cpu":
        return 0
    size = torch.finfo(dtype).bits // 8
    layers, head = projection_weights(cfg)
    if quant == "none":
        transient = (layers + head) * size
    else:
        transient = 2 * 2 * cfg.intermediate_size * cfg.hidden_size * size  # gate/up: parts + cat
        if quant == "int4" and not stored:
            transient += (layers + head) * INT4_BYTES  # the tiles (kernels/quant.py)
    return resident_estimate(cfg, dtype, quant) + int(transient)


def available_bytes() -> int:
    """Memory a new load may take: psutil's available, capped by `SPECDEC_MEMORY_LIMIT`."""
    import psutil

    free = psutil.virtual_memory().available
    limit = os.environ.get(LIMIT_ENV)
    return free if not limit else min(free, parse_bytes(limit))


def parse_bytes(text: str) -> int:
    """'2.5G', '800M', '1073741824' -> bytes."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    try:
        return int(float(number) * scale)
    except ValueError:
        raise InsufficientMemoryError(f"{LIMIT_ENV}={text!r}: expected bytes, e.g. 8G") from None


def check_fits(what: str, needs: int, runtime: int = 0) -> None:
    """Refuse (InsufficientMemoryError, one line) a load of `needs` bytes (plus `runtime`)
    that the memory available would not hold."""
    have = available_bytes()
    total = needs + runtime
    if total > have:
        smaller = "a smaller model" if "int4" in what else "--quant int4, a smaller model"
        raise InsufficientMemoryError(
            f"not enough memory to load {what}: it needs about {total / GB:.1f} GB and "
            f"{have / GB:.1f} GB is available (try {smaller}, or free memory)"
        )
