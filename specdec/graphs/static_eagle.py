"""An eagle head's drafting step as fixed-shape passes over preallocated buffers, so that
on CUDA each bucket is captured as one CUDA graph (`specdec.graphs.static_pass.Replay`).

Why: the head is one decoder layer, but a draft step of n tokens is n + 1 small passes,
each a few dozen kernel launches; eager, a GPU spends the step launching them (the 0.5B
draft model's eager step cost 0.67 of a target step on an H200 for the same reason,
archived runs, git tag archive/bench-runs). Captured, a whole step, the feed of the pending
entries and the n draft tokens, is one replay and one host sync.

What `EagleDrafter._feed_pending` and `_step` do, with every shape fixed by a bucket
(rows R, pending entries per row T, draft tokens n, key span S) and every value that
changes in buffers updated in place (`EagleBuffers`): the target's states of each row's
pending entries are copied into `feats [R, T, E]` (device to device), their next tokens,
entry counts and start positions into `nexts`, `counts`, `start`. Inside the pass the
write slots, the masks and the RoPE positions come from those buffers. Padding is inert:
padding entries (t >= counts of a row) and padding rows (counts 0) write their keys and
values to the drafter cache's scratch slot (position `max_len`, which no span reaches),
and a padding row's query sees key 0 only, so no NaN is made. The head's speculative
entries are written at each row's `lengths + i` as the eager drafter writes them (and
overwritten by the next step's true entries).

On the CPU the same buffers run eagerly (what tests compare token for token with the
eager drafter). Trees still draft eagerly.
"""

from __future__ import annotations

import torch

from specdec.graphs.static_pass import MIN_SPAN, Replay, bucket_sizes, pick


class EagleBuffers:
    """The inputs of one (rows, entries) bucket, shared by its (n, span) passes."""

    def __init__(self, rows: int, entries: int, hidden: int, dtype, device) -> None:
        R, T = rows, entries
        self.feats = torch.zeros(R, T, hidden, dtype=dtype, device=device)  # [R, T, E]
        self.nexts = torch.zeros(R, T, dtype=torch.long, device=device)  # [R, T]
        self.packed = torch.zeros(2 * R, dtype=torch.long, device=device)
        self.counts = self.packed[:R]  # [R] pending entries per row (0: a padding row)
        self.start = self.packed[R:]  # [R] each row's true entries before them

    def fill(
        self,
        states: list[list[torch.Tensor]],  # per row: [n_i, E] pieces on the device
        tokens: list[list[int]],  # per row: the token after each pending entry
        start: torch.Tensor,  # [B] host
    ) -> None:
        """Copy the rows' pending entries in (stale entries past a row's count stay: they
        are finite and go to the scratch slot)."""
        R, T = self.nexts.shape
        host = torch.zeros(2 * R, dtype=torch.long)
        nexts = torch.zeros(len(tokens), T, dtype=torch.long)  # [B, T]
        for row, (pieces, after) in enumerate(zip(states, tokens, strict=True)):
            at = 0
            for piece in pieces:
                self.feats[row, at : at + len(piece)].copy_(piece)
                at += len(piece)
            nexts[row, : len(after)] = torch.tensor(after, dtype=torch.long)
            host[row] = len(after)
        host[R : R + len(start)] = start
        non_blocking = self.nexts.device.type == "cuda"
        self.nexts[: len(tokens)].copy_(nexts, non_blocking=non_blocking)
        self.packed.copy_(host, non_blocking=non_blocking)


class StaticEagle:
    """Chain drafting of an `EagleDrafter` through bucketed fixed-shape passes.

    `k`, `v`: the drafter's head cache `[max_batch, Hkv, max_len + 1, D]` (the last
    position is the scratch slot). `max_entries`: the most pending entries per row a
    static step takes (a verify pass keeps at most n_predict + 1); a step with more (a
    prefill's catch-up) is the drafter's eager path. `graphs=True` (CUDA) captures each
    bucket on its first call."""

    def __init__(
        self,
        head,
        k: torch.Tensor,
        v: torch.Tensor,
        max_entries: int,
        graphs: bool = False,
        min_span: int = MIN_SPAN,
    ) -> None:
        if graphs and k.device.type != "cuda":
            raise ValueError("CUDA graphs need the head on a CUDA device")
        self.head, self.k, self.v, self.graphs = head, k, v, graphs
        max_rows, max_len = k.shape[0], k.shape[2] - 1
        self.scratch_slot = max_len
        self.max_entries = max_entries
        self.row_sizes = bucket_sizes(max_rows)
        self.entry_sizes = bucket_sizes(max_entries)
        self.span_sizes = bucket_sizes(max_len, min(min_span, max_len))
        self._buffers: dict[tuple[int, int], EagleBuffers] = {}
        self._passes: dict[tuple[int, int, int, int], Replay] = {}
        self._pool = None

    def bucket(self, rows: int, entries: int, n: int, span: int) -> tuple[int, int, int, int]:
        return (
            pick(self.row_sizes, rows),
            pick(self.entry_sizes, entries),
            n,
            pick(self.span_sizes, span),
        )

    def propose(
        self,
        states: list[list[torch.Tensor]],
        tokens: list[list[int]],
        start: torch.Tensor,  # [B] host: true entries per row before the pending ones
        n: int,
    ) -> torch.Tensor:  # [B, n] on the device
        """n greedy draft tokens per row after feeding each row's pending entries (at
        least one per row, at most `max_entries`)."""
        B = len(tokens)
        counts = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        span = int((start + counts).max()) + n - 1  # the last draft step's keys
        key = self.bucket(B, int(counts.max()), n, span)
        R, T = key[:2]
        if (R, T) not in self._buffers:
            E = self.head.config.hidden_size
            self._buffers[R, T] = EagleBuffers(R, T, E, self.k.dtype, self.k.device)
        buffers = self._buffers[R, T]
        buffers.fill(states, tokens, start)
        if key not in self._passes:
            S = key[3]
            self._passes[key] = Replay(lambda: self._draft(buffers, n, S), self.graphs, self._pool)
            self._pool = self._pool or self._passes[key].pool
        return self._passes[key]()[:B].clone()

    def _draft(self, b: EagleBuffers, n: int, span: int) -> torch.Tensor:  # [R, n]
        """The step over the buffers: no host reads, every shape fixed."""
        head, scratch = self.head, self.scratch_slot
        R, T = b.nexts.shape
        device = b.nexts.device
        rows = torch.arange(R, device=device)
        keys = torch.arange(span, device=device)  # [S]
        offsets = torch.arange(T, device=device)  # [T]
        counts, start = b.counts, b.start
        x = head.inputs(b.nexts, b.feats)  # [R, T, E]
        positions = start[:, None] + offsets  # [R, T]
        last = (counts - 1).clamp(min=0)  # [R] each row's newest entry
        newest = x[rows, last]  # [R, E]
        if T == 1:  # as `EagleDrafter._step`: one entry runs the whole layer
            q, k, v = head.qkv(x, positions)  # [R, H, 1, D], [R, Hkv, 1, D] x 2
        else:  # the earlier entries need only their keys and values
            k, v = head.kv(x, positions)  # [R, Hkv, T, D] x 2
            q = head.qkv(newest[:, None], (start + last)[:, None])[0]  # [R, H, 1, D]
        slots = torch.where(offsets < counts[:, None], positions, scratch)  # [R, T]
        self.k[rows[:, None], :, slots] = k.transpose(1, 2)  # [R, T, Hkv, D]
        self.v[rows[:, None], :, slots] = v.transpose(1, 2)
        state = self._attend(q, newest[:, None], (start + last)[:, None], keys, R)  # [R, E]
        lengths = start + counts  # [R] true entries after the feed
        live = counts > 0
        drafted = []
        for i in range(n):
            token = head.vocab_map[head.logits(state).argmax(-1)]  # [R]
            drafted.append(token)
            if i < n - 1:  # a speculative entry at lengths + i
                x = head.inputs(token[:, None], state[:, None])  # [R, 1, E]
                at = (lengths + i)[:, None]  # [R, 1]
                q, k, v = head.qkv(x, at)
                slot = torch.where(live, lengths + i, scratch)  # [R]
                self.k[rows, :, slot] = k[:, :, 0]  # [R, Hkv, D]
                self.v[rows, :, slot] = v[:, :, 0]
                state = self._attend(q, x, at, keys, R)
        return torch.stack(drafted, 1)

    def _attend(self, q, x, newest, keys, R: int) -> torch.Tensor:
        """The state `[R, E]` of entries `x [R, 1, E]` (queries `q`) at positions
        `newest [R, 1]`, attending to their rows' entries up to them."""
        span = len(keys)
        mask = keys[None, :] <= newest  # [R, S]; a padding row sees key 0
        out = self.head.attend(
            q, self.k[:R, :, :span], self.v[:R, :, :span], mask=mask[:, None, None]
        )  # [R, 1, E]
        return self.head.finish(x + out)[:, 0]
