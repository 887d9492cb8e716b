"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (Saxena 2023). Needs no model; deterministic, so q is one-hot.

It pays off where outputs copy their context: code edits, summaries, extraction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.drafters.base import DrafterBase
from specdec.errors import InvalidParameterError


class NgramDrafter(DrafterBase):
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError("n-gram sizes need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.histories: list[list[int]] = []
        self._last: list[list[int]] = []  # the proposal of the current step, per row

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        self.histories.extend(list(h) for h in histories)

    def lookup(self, history: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier match of the longest suffix."""
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            suffix = history[-n:]
            # Scan right to left: recent context predicts best.
            for start in range(len(history) - n - 1, -1, -1):
                if history[start : start + n] == suffix:
                    return history[start + n : start + n + k]
        return []

    def propose(self, k, params, generators) -> Draft:
        self._last = [self.lookup(h, k) if k else [] for h in self.histories]
        tokens = torch.zeros(len(self.histories), k, dtype=torch.long)
        for row, found in enumerate(self._last):
            tokens[row, : len(found)] = torch.tensor(found, dtype=torch.long)
        lengths = torch.tensor([len(f) for f in self._last], dtype=torch.long)
        return Draft(tokens=tokens, probs=None, lengths=lengths)

    def commit(self, num_accepted, next_tokens) -> None:
        pairs = zip(num_accepted.tolist(), next_tokens.tolist(), strict=True)
        for row, (n, nxt) in enumerate(pairs):
            self.histories[row].extend(self._last[row][:n] + [nxt])

    def move_row(self, src: int, dst: int) -> None:
        self.histories[dst] = self.histories[src]
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        if row == len(self.histories) - 1:
            self.histories.pop()
        else:
            self.histories[row] = []
