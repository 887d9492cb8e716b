"""An eagle head's drafting step as fixed-shape passes over preallocated buffers, so that
on CUDA each bucket is captured as one CUDA graph (`specdec.graphs.static_pass.Replay`).

Why: the head is one decoder layer, but a draft step of n tokens is n + 1 small passes,
each a few dozen kernel launches; eager, a GPU spends the step launching them (the 0.5B
draft model's eager step cost 0.67 of a target step on an H200 for the same reason,
archived runs, commit 1f7ab6a). Captured, a whole step, the feed of the pending
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

A tree step (`propose_tree`) feeds the same way, then expands the candidate tree from the
newest state as the eager drafter does (`expand_tree`, `node_step`: both paths run this
code; the nodes' entries are held apart from the cache); its shapes are fixed by the
tree's top-k per level and its beam, so it is captured the same way. The tree's paths
and scores come back to the host, where `tree_draft` builds the `TreeDraft`.

On the CPU the same buffers run eagerly (what tests compare token for token with the
eager drafter).
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
        counts = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        span = int((start + counts).max()) + n - 1  # the last draft step's keys
        replay = self._replay("chain", n, states, tokens, start, span)
        return replay()[: len(tokens)].clone()

    def propose_tree(
        self,
        states: list[list[torch.Tensor]],
        tokens: list[list[int]],
        start: torch.Tensor,  # [B] host
        topk: tuple[int, ...],
        n_candidates: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # [B, P, len(topk)] paths, [B, P] scores
        """The candidate tree of `topk` (a beam of `n_candidates`) after the feed."""
        counts = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        span = int((start + counts).max())  # the nodes' own entries are held apart
        replay = self._replay(("tree", topk, n_candidates), 0, states, tokens, start, span)
        paths, scores = replay()
        return paths[: len(tokens)].clone(), scores[: len(tokens)].clone()

    def _replay(self, kind, n: int, states, tokens, start, span: int) -> Replay:
        """The bucket's pass (captured on its first call) with the buffers filled."""
        B = len(tokens)
        key = (kind, *self.bucket(B, max(len(t) for t in tokens), n, span))
        R, T, S = key[1], key[2], key[4]
        if (R, T) not in self._buffers:
            E = self.head.config.hidden_size
            self._buffers[R, T] = EagleBuffers(R, T, E, self.k.dtype, self.k.device)
        buffers = self._buffers[R, T]
        buffers.fill(states, tokens, start)
        if key not in self._passes:
            if kind == "chain":
                fn = lambda: self._draft(buffers, n, S)  # noqa: E731
            else:
                fn = lambda: self._draft_tree(buffers, kind[1], kind[2], S)  # noqa: E731
            self._passes[key] = Replay(fn, self.graphs, self._pool)
            self._pool = self._pool or self._passes[key].pool
        return self._passes[key]

    def _feed(self, b: EagleBuffers, keys: torch.Tensor):
        """Each row's pending entries into the cache; (the head's state after each row's
        newest `[R, E]`, true entries per row after them `[R]`, live rows `[R]`)."""
        head, scratch = self.head, self.scratch_slot
        R, T = b.nexts.shape
        device = b.nexts.device
        rows = torch.arange(R, device=device)
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
        return state, start + counts, counts > 0

    def _draft(self, b: EagleBuffers, n: int, span: int) -> torch.Tensor:  # [R, n]
        """The chain step over the buffers: no host reads, every shape fixed."""
        head, scratch = self.head, self.scratch_slot
        R = b.nexts.shape[0]
        rows = torch.arange(R, device=b.nexts.device)
        keys = torch.arange(span, device=b.nexts.device)  # [S]
        state, lengths, live = self._feed(b, keys)
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

    def _draft_tree(self, b: EagleBuffers, topk, n_candidates: int, span: int):
        """The tree step over the buffers: paths `[R, P, d]`, scores `[R, P]`."""
        keys = torch.arange(span, device=b.nexts.device)  # [S]
        state, lengths, _ = self._feed(b, keys)

        def step(x, depth, chain):
            return node_step(self.head, self.k, self.v, x, depth, chain, lengths, span)

        return expand_tree(self.head, state, topk, n_candidates, step)

    def _attend(self, q, x, newest, keys, R: int) -> torch.Tensor:
        """The state `[R, E]` of entries `x [R, 1, E]` (queries `q`) at positions
        `newest [R, 1]`, attending to their rows' entries up to them."""
        span = len(keys)
        mask = keys[None, :] <= newest  # [R, S]; a padding row sees key 0
        out = self.head.attend(
            q, self.k[:R, :, :span], self.v[:R, :, :span], mask=mask[:, None, None]
        )  # [R, 1, E]
        return self.head.after_attention(x, out)[:, 0]


def expand_tree(head, state: torch.Tensor, topk: tuple[int, ...], n_candidates: int, step):
    """An eagle head's candidate tree from each row's state `[B, E]`: the top-k of each
    level's draft-vocabulary distribution, each node's state from its own path
    (`step(x [B, W, E], depth, chain) -> (states [B, W, E], chain)`, `node_step`),
    paths scored by summed log-probability, each level a beam of at most `n_candidates`
    nodes. Returns paths `[B, P, len(topk)]` (target ids) and scores `[B, P]`. Every
    shape follows from `topk` and `n_candidates`, so it captures as a graph."""
    B = state.shape[0]
    logp = torch.log_softmax(head.logits(state).float(), -1)  # [B, N]
    scores, index = logp.topk(topk[0], -1)  # [B, W]
    paths = head.vocab_map[index][..., None]  # [B, W, 1] tokens
    parents = state[:, None].expand(-1, topk[0], -1)  # [B, W, E]: each node's source
    chain = None  # the ancestors' entries: keys and values [B, W, d, Hkv, D]
    for depth, k in enumerate(topk[1:]):
        W = paths.shape[1]
        x = head.inputs(paths[:, :, -1], parents)  # [B, W, E]
        node_state, chain = step(x, depth, chain)  # [B, W, E]
        logp = torch.log_softmax(head.logits(node_state).float(), -1)  # [B, W, N]
        top, index = logp.topk(k, -1)  # [B, W, k]
        scores = (scores[:, :, None] + top).reshape(B, W * k)
        paths = torch.cat(
            [paths[:, :, None].expand(-1, -1, k, -1), head.vocab_map[index][..., None]], -1
        ).reshape(B, W * k, depth + 2)
        parents = node_state.repeat_interleave(k, 1)  # [B, W * k, E]
        chain = tuple(c.repeat_interleave(k, 1) for c in chain)
        if W * k > n_candidates:  # the beam: the best n_candidates nodes
            scores, keep = scores.topk(n_candidates, -1)
            paths = paths.gather(1, keep[..., None].expand(-1, -1, paths.shape[-1]))
            parents = parents.gather(1, keep[..., None].expand(-1, -1, parents.shape[-1]))
            chain = tuple(_gather_nodes(c, keep) for c in chain)
    return paths, scores


def node_step(
    head,
    k_cache: torch.Tensor,  # [max_batch, Hkv, L, D] the drafter's head cache
    v_cache: torch.Tensor,
    x: torch.Tensor,  # [B, W, E] the nodes' entries
    depth: int,
    chain,  # the ancestors' keys and values [B, W, depth, Hkv, D] each, or None
    lengths: torch.Tensor,  # [B] true entries per row, on the device
    span: int,  # cache positions read, >= lengths.max()
):
    """Tree nodes' entries at position `lengths + depth`, each attending to its row's
    true entries, its ancestors' entries and itself. Returns the head's states
    `[B, W, E]` and the chain with these entries appended (the cache is not written)."""
    c = head.config
    B, W, E = x.shape
    positions = (lengths + depth)[:, None].expand(B, W).reshape(B * W, 1)
    q, k, v = head.qkv(x.reshape(B * W, 1, E), positions)  # [BW, H, 1, D], [BW, Hkv, 1, D]
    new_k = k[:, :, 0].reshape(B, W, 1, c.num_kv_heads, c.head_dim)
    new_v = v[:, :, 0].reshape(B, W, 1, c.num_kv_heads, c.head_dim)
    chain = (new_k, new_v) if chain is None else (
        torch.cat([chain[0], new_k], 2), torch.cat([chain[1], new_v], 2)
    )  # fmt: skip
    own = depth + 1

    def keys(cache: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
        shared = cache[:B, :, :span].repeat_interleave(W, 0)  # [BW, Hkv, span, D]
        path = mine.reshape(B * W, own, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return torch.cat([shared, path], 2)  # [BW, Hkv, span + own, D]

    seen = torch.arange(span + own, device=x.device)[None, :]
    mask = (seen < lengths[:, None]) | (seen >= span)  # [B, span + own]
    mask = mask.repeat_interleave(W, 0)[:, None, None]  # [BW, 1, 1, span + own]
    out = head.attend(q, keys(k_cache, chain[0]), keys(v_cache, chain[1]), mask=mask)
    state = head.after_attention(x.reshape(B * W, 1, E), out)  # [BW, 1, S]
    return state.reshape(B, W, -1), chain


def _gather_nodes(entries: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`entries [B, W, ...]` at node indices `keep [B, W']`."""
    shape = keep.shape + entries.shape[2:]
    index = keep.reshape(*keep.shape, *([1] * (entries.dim() - 2))).expand(shape)
    return entries.gather(1, index)
