"""The drafter contract.

A drafter follows the engine's live rows (row i of the drafter is row i of the target's
cache) and keeps its own state; it never touches the target's. For each row the engine
has a history of committed tokens whose last token is not yet in any KV cache.

- `admit(histories)`: new rows appended after the current ones, each with its history.
- `propose(k, params, generators) -> Draft`: up to k tokens per row continuing the history.
  The engine may shorten a row's draft afterwards (`Draft.lengths`, e.g. near max_tokens);
  `commit` then reports at most that many accepted. A drafter may instead return a
  `TreeDraft` (`specdec.speculator.tree`) of up to k levels: candidate continuations the
  engine verifies in one pass; the accepted tokens then form one of its paths, so a tree
  drafter must not need to know which (speculator heads only need `next_tokens`).
- `commit(num_accepted [B], next_tokens [B])`: the target kept the first num_accepted
  draft tokens (of a tree: along the accepted path) and added next_tokens; roll back
  whatever else was drafted.
- `move_row(src, dst)` / `reset_row(row)`: the engine repacks rows when sequences finish.
- optional `observe(hidden [B, H], first_row=0)`: a drafter that has it gets the target's
  final-normed hidden state at each row's last cached position (the state the row's last
  committed token was sampled from), after the prefill of admitted rows (rows first_row..)
  and after every verify pass (all rows, following `commit`). Speculator heads use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from specdec.acceptors import Draft
from specdec.config import SamplingParams


class Drafter(Protocol):
    def admit(self, histories: Sequence[Sequence[int]]) -> None: ...

    def propose(
        self,
        k: int,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
    ) -> Draft: ...

    def commit(self, num_accepted: torch.Tensor, next_tokens: torch.Tensor) -> None: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def reset_row(self, row: int) -> None: ...
