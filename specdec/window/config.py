"""Every tunable of `auto`, in one frozen config (why each has its value: docs/design/auto.md)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class WindowConfig:
    """Each line: what it guards against; the measurement behind it (docs/design/auto.md)."""

    # The widest window `auto` may draft (a user's choice, `--k-max`).
    k_max: int = 8
    # Weight of a new timing in a running average and in the host's pace: a busy host's
    # single slow pass must not reprice every window ("Costs").
    ema: float = 0.2
    # A pass shape's first timings, of which the fastest is kept: one-off setup and a
    # neighbour only ever add time (a slow first plain step made k = 1 look cheap, "Costs").
    first_timings: int = 3
    # Share of a one-token verify pass spent in the projections: the floor a wider pass
    # costs at least (int4 1.5B: 8 tokens 1.26x of 4 measured, 1.30x by its plans, "Costs").
    projection_share: float = 0.8
    # Predicted gain a start needs over plain: timing noise must not make drafting lose.
    margin: float = 0.03
    # Realised speed over plain below which the guard turns drafting off ("Guard").
    floor: float = 0.97
    # Speculative steps per guard check.
    guard_steps: int = 8
    # Steps off after the guard trips, doubling on each trip up to `max_backoff` ("Guard").
    backoff: int = 32
    max_backoff: int = 512
    # Steps between probes: a wider window and a plain step while drafting, k = 1 while
    # off, so recovering acceptance and drifting costs are seen ("Probes").
    probe_every: int = 24
    # Memory of the acceptance counts: each step's counts weigh `decay` x the previous.
    decay: float = 0.98
    # Drafted rows' worth of the pooled rate each position's estimate is shrunk towards.
    prior_weight: float = 4.0
    # Standard errors of optimism in the pooled rate and a look's bound: one unlucky draw
    # at batch 1 must not end drafting ("Acceptance").
    optimism: float = 1.0
    # Drafted rows a first look takes before it may stop, and what a stored acceptance
    # counts for in a fresh process ("Looks", "Warm start").
    look_draws: float = 8.0
    # Net saving a catch-up must buy, as a share of the plain decoding ahead: before any
    # draft was seen (starts predicted at 9-15% ran 0.89-1.21x plain) and after ("Start-up").
    start_gain: float = 0.2
    informed_gain: float = 0.05
    # Most a look's catch-up may cost, as a share of the plain decoding ahead per row.
    explore_share: float = 0.1

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise InvalidParameterError(f"k_max must be >= 0, got {self.k_max}")
        for name in ("guard_steps", "backoff", "probe_every", "first_timings"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ema", "decay", "projection_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise InvalidParameterError(f"{name} must be in [0, 1], got {getattr(self, name)}")
