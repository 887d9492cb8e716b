"""Every tunable of `auto`, in one frozen config (why each has its value: docs/design/auto.md)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class WindowConfig:
    """Each line: what it guards against; the measurement that set it (docs/design/auto.md,
    "The tunables"). Derived: the guard's floor is 1 - `margin`; `evidence` is a guard
    check's steps and memory, a look's draws, a stored acceptance's rows and, halved, a position's
    prior weight; a start nets 2x `explore_share` blind and 0.5x once measured; the most
    steps off is 16 x `backoff`."""

    k_max: int = 8  # the widest window: the user's `--k-max`, not a tunable of the model
    ema: float = 0.2  # one slow pass repricing all: 4 tokens read 1.6 plain, 1.25 side by side
    first_timings: int = 3  # setup in first calls: slow first plain steps gave 0.87x with 2
    projection_share: float = 0.8  # a flattened curve: int4 8 tokens 1.26x of 4, plans 1.30x
    margin: float = 0.03  # noise starting/stopping (floor 1 - margin): k = 3 lost at 1.07-1.26x
    evidence: int = 8  # judging on few draws: a look stopped at one draw gave up 1.03-1.07x
    backoff: int = 32  # drafting on where the guard saw a loss: steps off, doubling up to 16x
    probe_every: int = 24  # stale costs: a plain step drifted 26-39 tok/s while k = 3 held 34
    decay: float = 0.98  # another text's acceptance: counts weigh 0.98 a step (~50 steps)
    optimism: float = 1.0  # one unlucky draw: two rejections read 0.25 where 0.7 was true
    explore_share: float = 0.1  # unrepaid catch-ups: starts predicted at 9-15% ran 0.89-1.21x

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise InvalidParameterError(f"k_max must be >= 0, got {self.k_max}")
        for name in ("evidence", "backoff", "probe_every", "first_timings"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ema", "decay", "projection_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise InvalidParameterError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def max_backoff(self) -> int:
        return 16 * self.backoff
