"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (Saxena 2023). Needs no model; deterministic, so q is one-hot.

It pays off where outputs copy their context: code edits, summaries, extraction.

Each row keeps an index of where every n-gram of its history last started (among those
whose next token is known), brought up to date as the history grows, so a lookup is one
dictionary probe per n instead of a scan of the history. Measured on a Zen 3 over a
256-456-token synthetic history: 132 µs a row per step for the scan where nothing
matches (17 where matches come early), 10 µs for the index.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.acceptors import Draft
from specdec.errors import InvalidParameterError


class NgramDrafter:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError("n-gram sizes need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.histories: list[list[int]] = []
        self._last: list[list[int]] = []  # the proposal of the current step, per row
        # Per row: n-gram -> start of its latest occurrence whose next token is known, and
        # how many history tokens that index covers (it catches up lazily in `lookup`).
        self._starts: list[dict[tuple[int, ...], int]] = []
        self._indexed: list[int] = []

    def admit(self, histories: Sequence[Sequence[int]]) -> None:
        self.histories.extend(list(h) for h in histories)
        self._starts.extend({} for _ in histories)
        self._indexed.extend(0 for _ in histories)

    def lookup(self, row: int, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier match of the longest suffix
        of row `row`'s history (recent context predicts best)."""
        history = self.histories[row]
        self._index(row)
        starts = self._starts[row]
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            start = starts.get(tuple(history[-n:]))
            if start is not None:
                return history[start + n : start + n + k]
        return []

    def _index(self, row: int) -> None:
        """Record the n-grams whose next token arrived since the last call: an n-gram
        starting at s once the history holds token s + n, later starts overwriting."""
        history, starts = self.histories[row], self._starts[row]
        done, size = self._indexed[row], len(history)
        for end in range(done, size):  # the token after the n-grams ending at end - 1
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    starts[tuple(history[end - n : end])] = end - n
        self._indexed[row] = size

    def propose(self, k, params, generators) -> Draft:
        self._last = [self.lookup(row, k) if k else [] for row in range(len(self.histories))]
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
        self._starts[dst], self._indexed[dst] = self._starts[src], self._indexed[src]
        self.reset_row(src)

    def reset_row(self, row: int) -> None:
        if row == len(self.histories) - 1:
            self.histories.pop()
            self._starts.pop()
            self._indexed.pop()
        else:
            self.histories[row] = []
            self._starts[row], self._indexed[row] = {}, 0
