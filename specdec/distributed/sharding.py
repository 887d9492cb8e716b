"""Megatron-style sharding of the native transformer over a tensor-parallel group.

Each rank holds:

- attention: its `num_heads / tp` query heads and `num_kv_heads / tp` key/value heads
  (column parallel: rows of the fused qkv projection, GQA groups kept whole), so its KV
  cache holds only its own kv heads; `o_proj` takes the matching input columns (row
  parallel) and one all-reduce sums the partial outputs;
- MLP: `intermediate_size / tp` columns of gate and up (column parallel), the matching
  rows of down (row parallel), one all-reduce;
- vocabulary head: `ceil(V / tp)` rows (the vocabulary padded to a multiple of tp with zero
  rows); the logits are all-gathered and trimmed to V;
- embedding table and norms: replicated (a lookup and a few vectors).

Biases of column-parallel layers are split with their rows; a row-parallel layer's bias is
added once, after the all-reduce. Two all-reduces per layer and one all-gather per forward
are the only communication.

The sharded model is an ordinary `Transformer` built from this rank's `local_config`
(heads and intermediate size divided, vocabulary whole), with `o_proj`, `down_proj` and
`lm_head` wrapped by the collective layers below. The wrappers keep the wrapped layer as
`inner`, so `quantize_int4` can quantize a shard in place. DTensor/`parallelize_module` is
not used: the native model's `Linear` picks its own CPU kernels and drafts may be packed
int4, and plain collectives keep the decode path's cost visible (one call per block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from specdec.distributed.group import TPGroup
from specdec.errors import ModelNotFoundError, UnsupportedModelError
from specdec.kernels.linear import Linear
from specdec.models.config import ModelConfig
from specdec.models.loading import native_state_dict, read_safetensors, torch_dtype
from specdec.models.transformer import Transformer, on_meta


def check_divisible(cfg: ModelConfig, tp: int) -> None:
    """Refuse, before loading, a model whose heads or MLP do not split `tp` ways."""
    bad = [
        f"{name} = {value}"
        for name, value in (
            ("num_attention_heads", cfg.num_heads),
            ("num_key_value_heads", cfg.num_kv_heads),
            ("intermediate_size", cfg.intermediate_size),
        )
        if value % tp
    ]
    if bad:
        raise UnsupportedModelError(
            f"tensor parallelism {tp} must divide the model's {', '.join(bad)} "
            f"(heads, key/value heads and the MLP are split across ranks)"
        )


def check_tp_split(path, draft: str | None, dtype: str, tp: int) -> None:
    """Refuse, before any weights are read, a target (and a sharded draft) whose heads do
    not split `tp` ways."""
    from specdec.hub import resolve

    check_divisible(ModelConfig.from_dir(path), tp)
    if draft not in (None, "ngram", "suffix"):
        check_divisible(ModelConfig.from_dir(resolve(draft, dtype)), tp)


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one rank holds: heads and MLP divided by `tp`, the vocabulary whole
    (logits are gathered), the head untied (each rank keeps a slice of it)."""
    check_divisible(cfg, tp)
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // tp,
        num_kv_heads=cfg.num_kv_heads // tp,
        intermediate_size=cfg.intermediate_size // tp,
        tie_word_embeddings=False,
    )


def padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def shard_hf_state(
    hf: Mapping[str, torch.Tensor], cfg: ModelConfig, rank: int, tp: int
) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slice of a Hugging Face Llama-family state dict (names unchanged).

    Slices are copied, so the full tensors can be freed once every slice is taken.
    """
    D, I = cfg.head_dim, cfg.intermediate_size  # noqa: E741
    q_rows = cfg.num_heads // tp * D
    kv_rows = cfg.num_kv_heads // tp * D
    mlp_rows = I // tp
    split = {  # HF suffix -> (dim, slice length): dim 0 = column parallel, 1 = row parallel
        "self_attn.q_proj.weight": (0, q_rows),
        "self_attn.q_proj.bias": (0, q_rows),
        "self_attn.k_proj.weight": (0, kv_rows),
        "self_attn.k_proj.bias": (0, kv_rows),
        "self_attn.v_proj.weight": (0, kv_rows),
        "self_attn.v_proj.bias": (0, kv_rows),
        "self_attn.o_proj.weight": (1, q_rows),
        "mlp.gate_proj.weight": (0, mlp_rows),
        "mlp.gate_proj.bias": (0, mlp_rows),
        "mlp.up_proj.weight": (0, mlp_rows),
        "mlp.up_proj.bias": (0, mlp_rows),
        "mlp.down_proj.weight": (1, mlp_rows),
    }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        suffix = name.split(".", 3)[-1] if name.startswith("model.layers.") else None
        if suffix in split:
            dim, size = split[suffix]
            out[name] = tensor.narrow(dim, rank * size, size).clone()
        elif name != "lm_head.weight":
            out[name] = tensor  # embedding, norms, row-parallel biases: replicated
    head = hf["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    out["lm_head.weight"] = _vocab_slice(head, rank, tp)
    return out


def _vocab_slice(head: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rows `[rank * n, (rank + 1) * n)` of the head, zero rows past the vocabulary."""
    vocab = head.shape[0]
    n = padded_vocab(vocab, tp) // tp
    start, stop = rank * n, min(vocab, (rank + 1) * n)
    part = head.new_zeros(n, head.shape[1])
    if stop > start:
        part[: stop - start] = head[start:stop]
    return part


def build_sharded_transformer(
    cfg: ModelConfig,
    hf_state: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    group: TPGroup,
) -> Transformer:
    """This rank's shard of the model, on `group.device`, ready for collective forwards."""
    tp, rank = group.world_size, group.rank
    local = local_config(cfg, tp)
    with on_meta():
        model = Transformer(local)
        model.lm_head = Linear(cfg.hidden_size, padded_vocab(cfg.vocab_size, tp) // tp, bias=False)
    state = native_state_dict(shard_hf_state(hf_state, cfg, rank, tp), local)
    state = {k: v.to(device=group.device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = torch.tensor(cfg.inv_freq(), dtype=torch.float32, device=group.device)
    return parallelize(model.eval().requires_grad_(False), cfg, group)


def parallelize(model: Transformer, cfg: ModelConfig, group: TPGroup) -> Transformer:
    """Wrap the row-parallel projections and the vocabulary head of a model holding this
    rank's shards with their collectives."""
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, group)
    model.lm_head = VocabParallelHead(model.lm_head, cfg.vocab_size, group)
    model.tp_group = group
    model.full_config = cfg
    return model


class RowParallel(nn.Module):
    """`inner` holds input columns of a projection: partial outputs summed over ranks,
    then the bias, once."""

    def __init__(self, inner: nn.Module, group: TPGroup) -> None:
        super().__init__()
        self.inner = inner
        self.bias = inner.bias
        inner.bias = None
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.all_reduce(self.inner(x))
        return out if self.bias is None else out + self.bias


class VocabParallelHead(nn.Module):
    """`inner` holds a slice of the vocabulary's rows: logits gathered over ranks, padding
    dropped."""

    def __init__(self, inner: nn.Module, vocab_size: int, group: TPGroup) -> None:
        super().__init__()
        self.inner = inner
        self.vocab_size = vocab_size
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
        return self.group.all_gather_last(self.inner(x))[..., : self.vocab_size]

    def full_weight(self) -> torch.Tensor:
        """The whole head `[V, H]`, gathered from every rank's rows (a collective: every
        rank calls it). For what reads the target's head outside its forward: speculator
        heads that reuse it score the whole vocabulary on every rank."""
        return self.group.all_gather(self.inner.weight, dim=0)[: self.vocab_size]


def load_shard(path: str | Path, dtype: str, group: TPGroup) -> Transformer:
    """This rank's tensor-parallel shard of the model in a Hugging Face directory, on
    `group.device`; the split is checked before any weights are read."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"model path {path} does not exist")
    cfg = ModelConfig.from_dir(path)
    check_divisible(cfg, group.world_size)
    return build_sharded_transformer(cfg, read_safetensors(path), torch_dtype(dtype), group)
