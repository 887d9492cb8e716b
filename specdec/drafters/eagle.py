"""An eagle head (`specdec.speculator.eagle`) as a drafter.

Per row the drafter keeps the head's keys and values of the row's committed positions,
each entered with the target's true state there and the token that followed it. Those
arrive through `observe_pass` (the engine hands every kept position's state after each
prefill and verify pass) and wait as `pending` until a step drafts: a step with k = 0
feeds nothing, so a run that never speculates never runs the head.

A drafting step feeds each row's pending entries (one ragged pass; after a verify pass
that is the last committed position and the accepted drafts, after a prefill the whole
prompt). The newest entry's output is the first draft token; each later one feeds back
the head's predicted state with the token it drafted. Those speculative entries are
dropped at `commit`, since the true states of the accepted ones arrive next. Drafts are
greedy (top-1 of the draft vocabulary), a deterministic function of the committed history,
so q is one-hot (`probs` None) and the lossless acceptors stay lossless at any temperature.

With the engine's prefix store (`use_prefix_cache`) a prefill that reused a stored prompt
prefix hands over states only past it. This drafter's own store keeps the target's states
of recent prompts, keyed by their tokens as the target's keys and values are (a state
depends on the tokens up to its position), and gives back those of the reused prefix, so
the head's entries are what a full prefill would give. (Its entries themselves could not
be stored that way: entry j also depends on token j + 1, where two prompts that share j
positions part.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from specdec.acceptors import Draft
from specdec.drafters.base import DrafterBase, PassStates
from specdec.models.prefix_cache import PrefixCache
from specdec.speculator.eagle import EagleHead


class EagleDrafter(DrafterBase):
    def __init__(self, head: EagleHead, max_batch: int, max_len: int) -> None:
        self.head = head
        c = head.config
        dtype, device = head.fc.weight.dtype, head.fc.weight.device
        self.n_predict = c.n_predict
        shape = (max_batch, c.num_kv_heads, max_len, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(max_batch, dtype=torch.long)  # true entries per row
        self.last: list[int] = []  # each row's newest committed token
        self.pending_states: list[list[torch.Tensor]] = []  # [n, E] pieces per row
        self.pending_tokens: list[list[int]] = []  # the token after each pending state
        # (entries, seconds) of the latest step's catch-up (entries beyond two per row),
        # which the engine takes out of the step's draft time. Unlike a draft model's it
        # is not priced before starting (no `catch_up_tokens`): all but each row's newest
        # entry need only their keys and values, a few percent of the layer.
        self.last_catch_up: tuple[int, float] = (0, 0.0)
        self.history: list[list[int]] = []  # each row's committed tokens
        self.admitted: list[bool] = []  # rows whose prefill's states have not come yet
        self.store: PrefixCache | None = None  # the target's states of recent prompts
        self._drafted: list[list[int]] = []  # the latest proposal, per row

    def use_prefix_cache(self, store: PrefixCache) -> None:
        self.store = store

    @staticmethod
    def _as_cache(states: torch.Tensor) -> SimpleNamespace:
        """`states [n, E]` as one row of a one-layer cache: what `PrefixCache` copies
        (keys: the states; values: empty)."""
        n = len(states)
        return SimpleNamespace(
            k=[states[None, None]],
            v=[states.new_empty(1, 1, n, 0)],
            lengths=torch.tensor([n]),
        )

    def _restore_prefix(self, row: int, reused: int) -> None:
        """Queue the stored states of the first `reused` prompt positions of a new row
        (as many as the store holds; a shorter run leaves a gap the head skips over) and
        store the prompt's states once they are all known."""
        E = self.head.config.hidden_size
        prompt = self.history[row][:-1]
        found = torch.empty(reused, E, dtype=self.k.dtype, device=self.k.device)
        got = 0
        if reused and self.store is not None:
            view = self._as_cache(found)
            view.lengths.zero_()
            got = self.store.load(view, 0, prompt[: reused + 1])
        if got:
            self.pending_states[row].insert(0, found[:got])
            self.pending_tokens[row][:0] = prompt[1 : got + 1]
        if got == reused and self.store is not None:
            states = torch.cat(self.pending_states[row]).to(self.k.dtype)
            self.store.save(self._as_cache(states), 0, prompt)

    @property
    def rows(self) -> int:
        return len(self.last)

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """New rows; their states arrive through `observe_pass` (the prefill's)."""
        for h in histories:
            self.last.append(int(h[-1]))
            self.history.append(list(h))
            self.admitted.append(True)
            self.pending_states.append([])
            self.pending_tokens.append([])

    def observe_pass(self, states: PassStates) -> None:
        """Queue each kept position's state with the token that followed it: the next
        kept token, or for the newest the row's committed token. A new row's prefill that
        skipped a stored prefix takes that prefix's entries from this drafter's store."""
        lengths = states.lengths.tolist()
        tokens = states.tokens.tolist()
        for i, n in enumerate(lengths):
            row = states.first_row + i
            self.pending_states[row].append(states.hidden[i, :n].clone())
            self.pending_tokens[row].extend(tokens[i][1:n] + [self.last[row]])
            if self.admitted[row]:  # the prefill: it lacks the positions a stored prefix gave
                self.admitted[row] = False
                self._restore_prefix(row, max(0, len(self.history[row]) - 1 - n))

    @torch.inference_mode()
    def propose(self, k, params, generators) -> Draft:
        B = self.rows
        device = self.k.device
        self.last_catch_up = (0, 0.0)
        n = min(k, self.n_predict)
        if n == 0:
            self._drafted = [[] for _ in range(B)]
            return Draft.empty(B, device)
        started = time.perf_counter()
        feed = [len(t) for t in self.pending_tokens]
        state = self._feed_pending()  # [B, E] f^ after each row's newest true entry
        if max(feed) > 2:
            self.last_catch_up = (sum(max(0, f - 2) for f in feed), time.perf_counter() - started)
        drafted = []
        for i in range(n):
            token = self.head.vocab_map[self.head.logits(state).argmax(-1)]  # [B]
            drafted.append(token)
            if i < n - 1:  # a speculative entry at position lengths + i
                x = self.head.inputs(token[:, None], state[:, None])
                state = self._step(x, torch.ones(B, dtype=torch.long), self.lengths[:B] + i)
        tokens = torch.stack(drafted, 1).cpu()  # [B, n]
        self._drafted = tokens.tolist()
        return Draft(tokens, None, torch.full((B,), n, dtype=torch.long))

    def _feed_pending(self) -> torch.Tensor:
        """One ragged pass over every row's pending entries; `[B, E]` the head's state
        after each row's newest one. Every row has at least one (its newest position)."""
        B, dtype = self.rows, self.k.dtype
        counts = torch.tensor([len(t) for t in self.pending_tokens], dtype=torch.long)
        T = int(counts.max())
        E = self.head.config.hidden_size
        feats = torch.zeros(B, T, E, dtype=dtype, device=self.k.device)
        nexts = torch.zeros(B, T, dtype=torch.long, device=self.k.device)
        for row in range(B):
            n = int(counts[row])
            feats[row, :n] = torch.cat(self.pending_states[row]).to(dtype)
            nexts[row, :n] = torch.tensor(self.pending_tokens[row])
            self.pending_states[row], self.pending_tokens[row] = [], []
        x = self.head.inputs(nexts, feats)  # [B, T, E]
        state = self._step(x, counts, self.lengths[:B])
        self.lengths[:B] += counts
        return state

    def _step(self, x: torch.Tensor, counts: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Write `x [B, T, E]` (row b's first `counts[b]` entries) at positions
        `start[b] ..` and return the head's state `[B, E]` after each row's last one,
        which attends to the row's entries up to itself.

        Only that last entry runs the whole layer: with one layer, an entry's key and
        value depend on its input alone, so the earlier entries of a catch-up need only
        their keys and values (3 of the layer's ~50M weights per entry for the 1.5B)."""
        head = self.head
        B, T, _ = x.shape
        offsets = torch.arange(T)
        positions = start[:, None] + offsets  # [B, T]
        valid = offsets[None, :] < counts[:, None]
        q, k, v = head.qkv(x, positions.to(x.device))  # [B, H, T, D], [B, Hkv, T, D] x 2
        rows, cols = valid.nonzero(as_tuple=True)
        slots = positions[rows, cols]
        self.k[rows, :, slots] = k.transpose(1, 2)[rows, cols]
        self.v[rows, :, slots] = v.transpose(1, 2)[rows, cols]
        last = counts - 1  # [B]: each row's last new entry
        span = int((start + counts).max())
        mask = torch.arange(span)[None, :] <= (start + last)[:, None]  # [B, span]
        at = torch.arange(B), last.to(x.device)
        out = head.attend(
            q[at[0], :, at[1]][:, :, None],  # [B, H, 1, D]
            self.k[:B, :, :span],
            self.v[:B, :, :span],
            mask=mask[:, None, None].to(x.device),
        )  # [B, 1, E]
        return head.finish(x[at][:, None] + out)[:, 0]

    def commit(self, num_accepted, next_tokens) -> None:
        """The speculative entries go (the accepted drafts' true states come next); the
        committed token follows each row's newest state."""
        self.last[:] = [int(t) for t in next_tokens.tolist()]
        for row, (a, nxt) in enumerate(zip(num_accepted.tolist(), self.last, strict=True)):
            drafted = self._drafted[row] if row < len(self._drafted) else []
            self.history[row].extend(drafted[:a] + [nxt])

    def move_row(self, src: int, dst: int) -> None:
        n = int(self.lengths[src])
        self.k[dst, :, :n] = self.k[src, :, :n]
        self.v[dst, :, :n] = self.v[src, :, :n]
        self.lengths[dst] = n
        for rows in self._per_row():
            rows[dst] = rows[src]
        self.reset_row(src)

    def _per_row(self) -> tuple[list, ...]:
        return (
            self.last,
            self.history,
            self.admitted,
            self.pending_states,
            self.pending_tokens,
        )

    def reset_row(self, row: int) -> None:
        self.lengths[row] = 0
        if row == self.rows - 1:
            for rows in self._per_row():
                rows.pop()
        else:
            self.pending_states[row], self.pending_tokens[row] = [], []
            self.history[row] = []
