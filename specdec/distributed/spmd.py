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

from specdec.cost_model import AdaptiveWindow, FixedWindow
from specdec.distributed.group import TPGroup
from specdec.params import SamplingParams


class SharedWindow:
    """A window policy whose choice of k is rank 0's on every rank."""

    def __init__(self, inner: FixedWindow | AdaptiveWindow, group: TPGroup) -> None:
        self.inner = inner
        self.group = group

    @property
    def k_max(self) -> int:
        return self.inner.k_max

    def choose(self, rows: int, catch_up: int = 0, remaining: int | None = None) -> int:
        return self.group.broadcast_int(self.inner.choose(rows, catch_up, remaining))

    def observe(self, *args, **kwargs) -> None:
        self.inner.observe(*args, **kwargs)

    def observe_prefill(self, *args) -> None:
        self.inner.observe_prefill(*args)

    def observe_catch_up(self, *args) -> None:
        self.inner.observe_catch_up(*args)

    def set_draft_ratio(self, ratio: float | None) -> None:
        self.inner.set_draft_ratio(ratio)

    def set_plan_seconds(self, target: dict[int, float], draft: dict[int, float]) -> None:
        self.inner.set_plan_seconds(target, draft)


def shared_window(
    window: FixedWindow | AdaptiveWindow, group: TPGroup | None
) -> FixedWindow | AdaptiveWindow | SharedWindow:
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
