"""One native decoder for the whole Llama family (Llama, Qwen2, Mistral, SmolLM2).

Why native rather than transformers' modules: speculative decoding needs things a generic
`generate` stack makes awkward or slow — a preallocated cache rolled back by setting a
length, several new tokens per row on a ragged batch, logits only where the engine will
read them, and the last hidden state for speculator heads. Architectures differ only in
`ModelConfig` switches; there are no per-model forks.

Weights are the Hugging Face names, with q/k/v and gate/up fused at load time into one
matmul each (fewer, larger kernels: decoding here is memory-bound and overhead-sensitive).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels.linear import Linear
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import KVCache


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [B, n, V] float32, at the requested positions
    hidden: torch.Tensor  # [B, T, H] final-normed hidden states of every new position
    # [B, T, k*H]: the inputs of the pass's `aux_layers` (k of them, concatenated in that
    # order) at every new position, for EAGLE-3 heads; None when none are asked
    aux: torch.Tensor | None = None


def right_pad(
    sequences: list[list[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as one right-padded batch `[B, T]` (on `device`) and their lengths `[B]`
    (on the host), the form `Transformer.forward` takes for a ragged batch."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tokens = torch.zeros(len(sequences), max(1, int(lengths.max())), dtype=torch.long)
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return tokens.to(device), lengths


def pass_spans(lengths: torch.Tensor, chunk: int | None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """A right-padded batch of `lengths` [B] (host) cut into passes of at most `chunk`
    positions, the B rows sharing them (`chunk // B` each, at least 1; None: one pass):
    each pass's (start, stop) columns and `num_new` [B], 0 for a row that ended earlier."""
    T = max(1, int(lengths.max()))
    width = min(max(1, chunk // len(lengths)), T) if chunk else T
    for start in range(0, T, width):
        stop = min(start + width, T)
        yield start, stop, (lengths - start).clamp(0, stop - start)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32 and scale in the model dtype, as the reference implementation
    does; F.rms_norm is one fused op (measured: equal results, ~25 us less per call than
    the five-op formula, ~1.4 ms of a 1.5B decode step)."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]; cos/sin [B, T, 1, D] (non-interleaved halves, HF layout)."""
    return x * cos + _rotate_half(x) * sin


def split_heads(
    qkv: torch.Tensor,  # [B, T, (H + 2 Hkv) D]: the fused projection's output
    cos: torch.Tensor,  # [B, T, 1, D]
    sin: torch.Tensor,  # [B, T, 1, D]
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values with RoPE applied: q `[B, Hkv, G*T, D]` (GQA as plain
    attention over Hkv heads: the G query heads sharing a key/value head become G*T query
    rows; with a mask, SDPA's GQA path falls back to the math kernel on CPU, 2x slower for
    a 5-token verify at 1k context, and this shape does not), k and v `[B, T, Hkv, D]`."""
    B, T, _ = qkv.shape
    D = cos.shape[-1]
    q, k, v = qkv.split((num_heads * D, num_kv_heads * D, num_kv_heads * D), dim=-1)
    q = apply_rope(q.view(B, T, num_heads, D), cos, sin)
    k = apply_rope(k.view(B, T, num_kv_heads, D), cos, sin)
    G = num_heads // num_kv_heads
    q = q.transpose(1, 2).reshape(B, num_kv_heads, G * T, D)
    return q, k, v.view(B, T, num_kv_heads, D)


def merge_heads(out: torch.Tensor, num_heads: int) -> torch.Tensor:
    """SDPA's output `[B, Hkv, G*T, D]` as `[B, T, H*D]` (head h uses kv head h // G).
    reshape, not view: CUDA's SDPA kernels may return strides no view can split."""
    B, _, GT, D = out.shape
    T = GT * out.shape[1] // num_heads
    out = out.reshape(B, num_heads, T, D)
    return out.transpose(1, 2).reshape(B, T, num_heads * D)


def gqa_mask(mask: torch.Tensor | None, groups: int) -> torch.Tensor | None:
    """`[B, 1, T, S]` -> `[B, 1, G*T, S]`: the mask of `split_heads`' query rows."""
    if mask is None:
        return None
    B, _, T, S = mask.shape
    return mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(B, 1, groups * T, S)


def attend(
    q: torch.Tensor,  # [B, Hkv, G*T, D]
    k: torch.Tensor,  # [B, T, Hkv, D]
    v: torch.Tensor,  # [B, T, Hkv, D]
    k_cache: torch.Tensor,  # [B, Hkv, L+1, D] (a view of this batch's cache rows)
    v_cache: torch.Tensor,  # [B, Hkv, L+1, D]
    write: tuple[torch.Tensor, torch.Tensor],  # row index [B, 1], slot index [B, T]
    span: int,  # keys attended: cache positions [0, span)
    mask: torch.Tensor | None,  # [B, 1, G*T, span] (`gqa_mask`), None = all of span
) -> torch.Tensor:  # [B, Hkv, G*T, D]
    """Write the new keys and values to their cache slots, then attend over `[0, span)`."""
    rows, slots = write
    k_cache[rows, :, slots] = k  # advanced indices first: [B, T, Hkv, D]
    v_cache[rows, :, slots] = v
    keys, values = k_cache[:, :, :span], v_cache[:, :, :span]  # [B, Hkv, S, D]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """`[..., 2I]` (gate and up, fused) -> `[..., I]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        qkv_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, qkv_out, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [B, T, 1, D]
        sin: torch.Tensor,  # [B, T, 1, D]
        k_cache: torch.Tensor,  # [B, Hkv, L+1, D] (a view of this batch's cache rows)
        v_cache: torch.Tensor,  # [B, Hkv, L+1, D]
        write: tuple[torch.Tensor, torch.Tensor],  # row index [B, 1], slot index [B, T]
        span: int,  # keys attended: cache positions [0, span)
        mask: torch.Tensor | None,  # [B, 1, T, span] bool, None = attend to all of span
    ) -> torch.Tensor:
        q, k, v = split_heads(self.qkv_proj(x), cos, sin, self.num_heads, self.num_kv_heads)
        mask = gqa_mask(mask, self.num_heads // self.num_kv_heads)
        out = attend(q, k, v, k_cache, v_cache, write, span, mask)
        return self.o_proj(merge_heads(out, self.num_heads))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, k_cache, v_cache, write, span, mask):
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, k_cache, v_cache, write, span, mask
        )
        return x + self.mlp(self.post_attention_layernorm(x))


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules with meta tensors and no initialisation, for a loader that assigns every
    weight. Why: a random init on meta tensors (`normal_`) imports torch's compiler stack the
    first time, 3-5 s of every process's load on a Zen 3."""
    saved = nn.Embedding.reset_parameters, nn.Linear.reset_parameters
    nn.Embedding.reset_parameters = nn.Linear.reset_parameters = lambda self: None
    try:
        with torch.device("meta"):
            yield
    finally:
        nn.Embedding.reset_parameters, nn.Linear.reset_parameters = saved


class Transformer(nn.Module):
    """Llama-family decoder over a `KVCache`; see `forward` for the batching contract."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer(
            "inv_freq", torch.tensor(cfg.inv_freq(), dtype=torch.float32), persistent=False
        )
        # Set by `kernels.quantize` where every layer is int4 (or bf16 on a CPU the native bf16
        # kernel serves): the native stack that runs the layers of small steps in one call
        # (`specdec.kernels.decode_stack`).
        self.decode_stack = None
        # The layer stack this model's fixed-shape passes run (`static_pass.StaticPasses`):
        # "eager" (`run_layers`), "fused" (`specdec.graphs.fused_layers`), or None: the
        # first bucket captured races them and sets the winner here. `--no-fused-layers`
        # sets "eager".
        self.layer_stack: str | None = None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, max_batch: int, max_len: int | None = None) -> KVCache:
        cfg = self.config
        return KVCache(
            cfg.num_layers,
            max_batch,
            cfg.num_kv_heads,
            cfg.head_dim,
            max_len or cfg.max_position_embeddings,
            self.dtype,
            self.device,
        )

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] new tokens for cache rows 0..B-1
        cache: KVCache,
        num_new: torch.Tensor | None = None,  # [B] host int64: valid tokens per row (<= T)
        logits_at: torch.Tensor | None = None,  # [B, n] positions in T to compute logits for
        first_row: int = 0,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,  # [B, T], [B, T, T] host
        aux_layers: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """Append `tokens` to each row's cache and return logits and hidden states.

        Row b's token t sits at position `cache.lengths[b] + t`; tokens at t >= num_new[b]
        are padding (written to the scratch slot, outputs meaningless). The batch covers
        cache rows `first_row .. first_row + B - 1` (admitting new rows touches only them).
        Each row attends
        causally to its committed prefix and its own new tokens. The cache lengths advance
        by `num_new`; callers roll back with `cache.truncate`. Logits are computed only at
        `logits_at` (all positions when None) because the vocabulary head dominates the
        cost of a prefill.

        `tree = (offsets, visible)` verifies a token tree instead of a chain: new token t
        still goes to cache slot `lengths[b] + t`, but its position (RoPE) is
        `lengths[b] + offsets[b, t]` and it attends to the committed prefix and to the new
        tokens j with `visible[b, t, j]` (itself and its ancestors). Positions are shared
        between siblings, so the slots of an accepted path must be compacted afterwards
        (`KVCache.move_slots`) before the cache is truncated to it.

        `aux_layers` names layers whose inputs (the residual stream before them, vLLM's
        "auxiliary hidden states": id 0 is the embedding) the pass also returns, as `aux`:
        what an EAGLE-3 head reads. Each pass asks for its own, so one target serves any
        drafter.
        """
        B, T = tokens.shape
        if num_new is None:
            num_new = torch.full((B,), T, dtype=torch.long)
        rows = slice(first_row, first_row + B)
        cache.reserve(num_new, rows)
        lengths = cache.lengths[rows]  # [B] host
        offsets = torch.arange(T)
        slots = lengths[:, None] + offsets  # [B, T] host
        slots = torch.where(offsets < num_new[:, None], slots, cache.scratch_slot)
        span = int((lengths + num_new).max())
        if tree is None:
            positions = lengths[:, None] + offsets  # [B, T] host
            ragged = bool((num_new < T).any())
            mask = self._attention_mask(lengths, positions, span, ragged=ragged)
        else:
            positions = lengths[:, None] + tree[0]
            mask = self._tree_mask(lengths, tree[0], tree[1], span)

        device = self.device
        positions_d = positions.to(device, non_blocking=True)
        write = (
            torch.arange(B, device=device)[:, None],
            slots.to(device, non_blocking=True),
        )
        cos, sin = self._rope(positions_d)
        if mask is not None:
            mask = mask.to(device, non_blocking=True)

        hidden, aux = self.run_layers(  # [B, T, H], [B, T, k*H] or None
            tokens, cache, rows, cos, sin, write, span, mask, tuple(aux_layers)
        )
        cache.advance(num_new, rows)
        index = None if logits_at is None else logits_at.to(device)
        logits = self.head(hidden, index)
        return ForwardOutput(logits, hidden, aux)

    def run_layers(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: KVCache,
        rows: slice,  # the cache rows of the batch
        cos: torch.Tensor,  # [B, T, 1, D]
        sin: torch.Tensor,  # [B, T, 1, D]
        write: tuple[torch.Tensor, torch.Tensor],  # row index [B, 1], slot index [B, T]
        span: int,
        mask: torch.Tensor | None,  # [B, 1, T, span] bool
        aux_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [B, T, H] final-normed, [B, T, k*H]
        """The decoder stack on prepared positions, write slots and mask: shared by
        `forward` and the fixed-shape passes of `specdec.graphs.static_pass`, which build
        those inputs on the device from preallocated buffers. Also returns the inputs of
        the layers `aux_layers` side by side, in that order (None where it is empty)."""
        x = self.embed_tokens(tokens)
        stack = self.decode_stack
        if stack is not None and stack.takes(tokens.numel()):
            out, aux = stack.run(x, cache, rows, cos, sin, write[1], span, mask, aux_layers)
            return self.norm(out), aux
        inputs = dict.fromkeys(aux_layers)
        for i, (layer, k_cache, v_cache) in enumerate(
            zip(self.layers, cache.k, cache.v, strict=True)
        ):
            if i in inputs:
                inputs[i] = x  # by reference: each layer returns a new tensor
            x = layer(x, cos, sin, k_cache[rows], v_cache[rows], write, span, mask)
        aux = torch.cat([inputs[i] for i in aux_layers], -1) if aux_layers else None
        return self.norm(x), aux

    def head(self, hidden: torch.Tensor, logits_at: torch.Tensor | None) -> torch.Tensor:
        """float32 logits `[B, n, V]` at positions `logits_at [B, n]` (on the device) of
        `hidden [B, T, H]`, or at every position when None."""
        if logits_at is None:
            picked = hidden
        else:
            index = logits_at[..., None].expand(-1, -1, hidden.shape[-1])
            picked = hidden.gather(1, index)  # [B, n, H]
        return self.lm_head(picked).float()

    def _attention_mask(
        self, lengths: torch.Tensor, positions: torch.Tensor, span: int, ragged: bool
    ) -> torch.Tensor | None:
        """Causal mask over cache positions, `[B, 1, T, span]`, or None when all of span is
        visible to the single new token of every row (the plain-decode fast path)."""
        window = self.config.sliding_window
        T = positions.shape[1]
        uniform = bool((lengths == lengths[0]).all())
        if T == 1 and uniform and not ragged and (window is None or span <= window):
            return None
        keys = torch.arange(span)
        mask = keys[None, None, :] <= positions[:, :, None]  # [B, T, span]
        if window is not None:
            mask &= keys[None, None, :] > positions[:, :, None] - window
        return mask[:, None]

    def _tree_mask(
        self, lengths: torch.Tensor, offsets: torch.Tensor, visible: torch.Tensor, span: int
    ) -> torch.Tensor:
        """`[B, 1, T, span]`: the committed prefix, plus the new tokens `visible [B, T, T]`
        marks (stored at slots `lengths + j`); the sliding window counts RoPE positions."""
        T = offsets.shape[1]
        keys = torch.arange(span)[None, :]  # [1, span]
        new = keys - lengths[:, None]  # [B, span]: index among the new tokens
        is_new = (new >= 0) & (new < T)
        index = new.clamp(0, T - 1)
        tree = visible.gather(2, index[:, None, :].expand(-1, T, -1)) & is_new[:, None, :]
        mask = (keys < lengths[:, None])[:, None, :] | tree  # [B, T, span]
        window = self.config.sliding_window
        if window is not None:
            key_pos = torch.where(is_new, lengths[:, None] + offsets.gather(1, index), keys)
            positions = lengths[:, None] + offsets  # [B, T]
            mask &= key_pos[:, None, :] > positions[:, :, None] - window
        return mask[:, None]

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin `[B, T, 1, D]` in the model dtype for integer positions `[B, T]`."""
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)
