"""Keys and values of recent prompts, reused by a new prompt that starts the same way.

Requests to one model share their openings: a chat template's system turn (24 of the
Qwen models' ~46-token chat prompts), a server's fixed instructions, the earlier turns of
a conversation. Their keys and values depend only on the tokens before them, so a new
request can copy them and prefill only what differs. Prefill is compute-bound on a CPU
(a 46-token prompt costs the Qwen 1.5B int4 about as much as 15 decode steps), which is
why the peers do the same: vLLM's automatic prefix caching, llama.cpp's reuse of the
previous prompt's cache.

The store keeps whole sequences (a prompt after its prefill, a request's history when it
finishes), newest last, and evicts the least recently used past `max_tokens` positions in
all. A lookup is the longest common prefix with any entry, token by token, capped one
short of the prompt: the prefill must still run the last token to get its logits.

Reuse is exact in the sense that matters: positions get the keys and values a prefill of
their own tokens computed. They may differ in the last bits from what a longer prefill
would compute (matrix products are not batch-invariant), as between any two batchings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.models.kv_cache import KVCache


@dataclass(eq=False)  # entries are found by identity, never by comparing tensors
class _Entry:
    tokens: torch.Tensor  # [n] on the CPU
    keys: list[torch.Tensor]  # per layer [Hkv, n, D]
    values: list[torch.Tensor]


class PrefixCache:
    """Up to `max_tokens` positions of recent sequences' keys and values for one model."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: list[_Entry] = []  # least recently used first
        self.hits = 0  # positions reused, over the store's life
        self.misses = 0  # positions a prefill computed

    @property
    def stored_tokens(self) -> int:
        return sum(len(e.tokens) for e in self._entries)

    def _best(self, tokens: torch.Tensor) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with `tokens`, and that length."""
        best, best_n = None, 0
        for entry in self._entries:
            m = min(len(entry.tokens), len(tokens))
            differ = (entry.tokens[:m] != tokens[:m]).nonzero()
            n = int(differ[0]) if len(differ) else m
            if n > best_n:
                best, best_n = entry, n
        return best, best_n

    def _lookup(self, tokens: Sequence[int]) -> tuple[_Entry | None, int]:
        """The entry to reuse for `tokens` and how many positions, at most all but the last
        (the prefill must run that one for its logits)."""
        if len(tokens) < 2 or not self._entries:
            return None, 0
        entry, n = self._best(torch.tensor(tokens))
        return entry, min(n, len(tokens) - 1)

    def _touch(self, entry: _Entry) -> None:
        """Mark `entry` the most recently used."""
        self._entries.remove(entry)
        self._entries.append(entry)

    def match(self, tokens: Sequence[int]) -> int:
        """Positions of `tokens` a `load` would reuse (at most len(tokens) - 1)."""
        return self._lookup(tokens)[1]

    def load(self, cache: KVCache, row: int, tokens: Sequence[int]) -> int:
        """Copy the longest stored prefix of `tokens` (at most all but the last) into the
        empty row `row` of `cache` and commit it; return its length (0: nothing stored)."""
        if int(cache.lengths[row]) != 0:
            raise ValueError(f"row {row} of the cache is not empty")
        entry, n = self._lookup(tokens)
        if n:
            for k, v, ek, ev in zip(cache.k, cache.v, entry.keys, entry.values, strict=True):
                k[row, :, :n] = ek[:, :n]
                v[row, :, :n] = ev[:, :n]
            cache.lengths[row] = n
            self._touch(entry)
        self.hits += n
        self.misses += len(tokens) - n
        return n

    def save(self, cache: KVCache, row: int, tokens: Sequence[int]) -> None:
        """Keep the first len(tokens) positions of `row`, which hold `tokens`. A stored
        sequence that starts `tokens` gives way to it; one that `tokens` starts stays."""
        n = len(tokens)
        if n > int(cache.lengths[row]):
            raise ValueError(f"row {row} holds {int(cache.lengths[row])} positions, not {n}")
        if n == 0 or n > self.max_tokens:
            return
        new = torch.tensor(tokens)
        for entry in self._entries:
            m = min(len(entry.tokens), n)
            if torch.equal(entry.tokens[:m], new[:m]):
                if len(entry.tokens) >= n:  # already stored: just mark it used
                    self._touch(entry)
                    return
                self._entries.remove(entry)  # a shorter copy of the same start
                break
        keys = [k[row, :, :n].clone() for k in cache.k]
        values = [v[row, :, :n].clone() for v in cache.v]
        self._entries.append(_Entry(new, keys, values))
        while self.stored_tokens > self.max_tokens:
            self._entries.pop(0)
