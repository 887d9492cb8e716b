"""Every tunable of `auto`, in one frozen config (why each has its value: docs/design/auto.md)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class WindowConfig:
    """Each line: what it guards against; the measurement behind it (docs/design/auto.md)."""

    # The widest window `auto` may draft (the user's `--k-max`, not a tunable of the model).
    k_max: int = 8
    # A busy host's one slow pass repricing every window: a new timing's weight in a running
    # average and in the host's pace (a 4-token pass read 1.6 plain steps across minutes and
    # 1.25 side by side; "Costs").
    ema: float = 0.2
    # One-off setup in a shape's first calls: the fastest of its first timings is kept (a
    # slow first plain step made k = 1 look cheap and run 0.87x plain; two were too few).
    first_timings: int = 3
    # A busy host flattening the verify curve: the share of a one-token pass the projections
    # cover, the least a wider pass grows (int4 1.5B: 8 tokens 1.26x of 4, 1.30x by plans).
    projection_share: float = 0.8
    # Timing noise: a start must be predicted `margin` over plain, and the guard trips below
    # 1 - `margin` realised (an early stop at batch 1 gave up k = 3 at 1.07-1.26x; "Guard").
    margin: float = 0.03
    # Judging on too few draws: a guard check spans this many drafting steps, a look this
    # many first-position draws, a stored acceptance counts for as many rows, and a position
    # leans on the pooled rate with half as many (one rejected draw stopped a look that paid
    # 1.03-1.07x; "Looks", "Warm start").
    evidence: int = 8
    # Drafting on after the guard saw it lose: steps off, doubling per trip up to 16x ("Guard").
    backoff: int = 32
    # Stale measurements: steps between probes (a wider window and a plain step in turn while
    # drafting, k = 1 while not): a plain step drifted 26-39 tok/s while k = 3 held ("Probes").
    probe_every: int = 24
    # Acceptance of another text: each step's counts weigh `decay` x the previous (~50 steps).
    decay: float = 0.98
    # One unlucky draw at batch 1 ending drafting: standard errors of optimism in the pooled
    # rate and a look's bound (two rejections read 0.25 where acceptance was 0.7).
    optimism: float = 1.0
    # Catch-ups that do not repay: a look's catch-up may cost this share of the plain decoding
    # ahead; a blind start must net twice it, a measured one half (starts predicted at 9-15%
    # ran 0.89-1.21x plain, those at 23% and more 1.15-2.5x; "Start-up").
    explore_share: float = 0.1

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
