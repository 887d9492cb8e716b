"""A preallocated key/value cache whose rollback is setting a length.

Speculative decoding writes k+1 positions per step and keeps only the accepted prefix, so
rollback must be free: each row has a committed length, writes are addressed by position,
and `truncate` only lowers lengths. Nothing is ever copied or freed on rollback; stale
entries past a row's length are simply never attended to (and get overwritten).

Rows are batch slots. The model always runs on the first `B` rows, so an engine keeps its
live sequences packed at the front and moves a row with `move_row` when one finishes.
"""

from __future__ import annotations

import torch

from specdec.errors import ContextLengthError


class KVCache:
    """Per-layer K and V tensors `[max_batch, kv_heads, max_len + 1, head_dim]`.

    The extra slot at index `max_len` is scratch: padded tokens of a ragged batch write
    there, so they never clobber a real position.
    """

    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (max_batch, num_kv_heads, max_len + 1, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_batch = max_batch
        self.max_len = max_len
        self.scratch_slot = max_len
        # Committed tokens per row, kept on the host: the engine plans every step from these
        # without a device sync.
        self.lengths = torch.zeros(max_batch, dtype=torch.long)

    def reserve(self, num_new: torch.Tensor, rows: slice) -> None:
        """Check that `num_new[b]` more tokens fit each row; raise before anything is written."""
        if rows.stop > self.max_batch:
            raise ContextLengthError(
                f"rows up to {rows.stop} exceed the cache's {self.max_batch} batch slots"
            )
        need = self.lengths[rows] + num_new
        if int(need.max()) > self.max_len:
            row = rows.start + int(need.argmax())
            raise ContextLengthError(
                f"row {row} needs {int(need[row])} positions but the KV cache holds "
                f"{self.max_len} (the model's context or the engine's max_len)"
            )

    def advance(self, num_new: torch.Tensor, rows: slice) -> None:
        """Commit `num_new [B]` freshly written positions on `rows`."""
        self.lengths[rows] += num_new

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll the first `len(lengths)` rows back to `lengths [B]`: O(1), nothing copied."""
        rows = lengths.shape[0]
        if bool((lengths > self.lengths[:rows]).any()) or bool((lengths < 0).any()):
            raise ValueError("truncate can only shorten rows")
        self.lengths[:rows] = lengths

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V of slots `src [B, m]` to slots `dst [B, m]` in rows 0..B-1 (all layers),
        reading every source before writing: how a verified tree is compacted to its
        accepted path. Entries with src == dst are no-ops (use them as padding)."""
        if src.numel() == 0:
            return
        device = self.k[0].device
        rows = torch.arange(src.shape[0], device=device)[:, None]
        src, dst = src.to(device), dst.to(device)
        for k, v in zip(self.k, self.v, strict=True):
            k[rows, :, dst] = k[rows, :, src]  # [B, m, Hkv, D]
            v[rows, :, dst] = v[rows, :, src]

    def reset_row(self, row: int) -> None:
        self.lengths[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Copy row `src` (its committed prefix) into slot `dst`, to keep live rows packed."""
        n = int(self.lengths[src])
        for k, v in zip(self.k, self.v, strict=True):
            k[dst, :, :n] = k[src, :, :n]
            v[dst, :, :n] = v[src, :, :n]
        self.lengths[dst] = n
        self.lengths[src] = 0
