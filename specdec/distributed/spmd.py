"""What every rank must decide alike: the engine runs on each rank, so any choice made
from local state is made by rank 0 and broadcast.

- The adaptive window picks k from measured timings, which differ between ranks:
  `SharedWindow` broadcasts rank 0's choice (one small broadcast per step; a fixed window
  needs none).
- A request without a seed draws one from the OS: `shared_seeds` has rank 0 draw the seeds
  and broadcast them before the engine builds the generators.

Everything else is a deterministic function of identical inputs: the logits after the
all-reduce/all-gather are bitwise equal on all ranks, and sampling, acceptance, n-gram
lookup and a replicated draft model then compute the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from specdec.distributed.group import TPGroup
from specdec.params import SamplingParams
from specdec.types import Batch, StepRecord
from specdec.window import FixedWindow, PricesModels, Window


class SharedWindow:
    """A window whose choice of k is rank 0's on every rank."""

    def __init__(self, inner: Window, group: TPGroup) -> None:
        self.inner = inner
        self.group = group
        self.k_max = inner.k_max

    def choose(self, batch: Batch) -> int:
        return self.group.broadcast_int(self.inner.choose(batch))

    def observe(self, record: StepRecord) -> None:
        self.inner.observe(record)

    def price_models(self, target, draft) -> None:
        if isinstance(self.inner, PricesModels):
            self.inner.price_models(target, draft)


def shared_window(window: Window, group: TPGroup | None) -> Window:
    """`window` as every rank must see it (a fixed window is already deterministic)."""
    if group is None or isinstance(window, FixedWindow):
        return window
    return SharedWindow(window, group)


def shared_seeds(
    params: SamplingParams | Sequence[SamplingParams], n: int, group: TPGroup | None
) -> SamplingParams | list[SamplingParams]:
    """`params` with rank 0's fresh seeds filled in where a request has none (one per
    request: `n` prompts)."""
    if group is None:
        return params
    listed = [params] * n if isinstance(params, SamplingParams) else list(params)
    if all(p.seed is not None for p in listed):
        return params
    fresh = [random.SystemRandom().randrange(2**63) for _ in listed] if group.is_leader else None
    seeds = group.broadcast_object(fresh)
    return [
        p if p.seed is not None else dataclasses.replace(p, seed=s)
        for p, s in zip(listed, seeds, strict=True)
    ]
