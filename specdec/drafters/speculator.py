"""Trained MLP speculator heads as a drafter (see `specdec.speculator.model`).

Per row the drafter keeps two things: the target's final hidden state at the last position
in the target's KV cache (given by the engine through `observe` after every prefill and
verify pass) and the token sampled from that state, the last of the committed history
(given by `admit` and `commit`). From those it proposes a chain of up to n tokens, greedy
top-1 per head. The proposal is a deterministic function of the committed history, so q is
one-hot (`probs` None) and the lossless acceptors stay lossless, at any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptors import Draft


class SpeculatorDrafter:
    def __init__(self, speculator, max_batch: int, device: torch.device | str = "cpu") -> None:
        self.speculator = speculator
        cfg = speculator.config
        self.n_predict = cfg.n_predict
        dtype = speculator.proj[0].weight.dtype
        self.hidden = torch.zeros(max_batch, cfg.emb_dim, dtype=dtype, device=device)  # [B, E]
        self.last = torch.zeros(max_batch, dtype=torch.long, device=device)  # [B]
        self.rows = 0

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        """New rows; their hidden states arrive through `observe(hidden, first_row)`."""
        start, self.rows = self.rows, self.rows + len(histories)
        self.last[start : self.rows] = torch.tensor([h[-1] for h in histories])

    def observe(self, hidden: torch.Tensor, first_row: int = 0) -> None:
        """The target's final-normed state `[B, E]` at the last cached position of rows
        `first_row ..` (the state the last committed token was sampled from)."""
        self.hidden[first_row : first_row + len(hidden)] = hidden

    def propose(self, k, params, generators) -> Draft:
        n = min(k, self.n_predict)
        B = self.rows
        if n == 0:
            return Draft.empty(B, self.hidden.device)
        tokens = self.speculator.propose_greedy(self.hidden[:B], self.last[:B], n)  # [B, n]
        return Draft(tokens, None, torch.full((B,), n, dtype=torch.long))

    def commit(self, num_accepted, next_tokens) -> None:
        self.last[: self.rows] = next_tokens.to(self.last.device)

    def move_row(self, src: int, dst: int) -> None:
        self.hidden[dst] = self.hidden[src]
        self.last[dst] = self.last[src]
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        if row == self.rows - 1:
            self.rows -= 1
