"""What speculation costs and gains, measured as it runs; and the window that pays most.

One implementation serves `--speculate auto` and the benchmarks' predictions:

- `CostModel` keeps running averages of the measured seconds of a verify pass of T tokens
  per row and of one drafter step, per batch size, and interpolates between measured T.
- `expected_tokens(alpha, k)`: tokens one step emits when draft position i is accepted with
  conditional probability alpha[i]: 1 + sum_i prod_{j<=i} alpha[j] (DESIGN.md's formula is
  the special case of equal alphas).
- `best_window` maximises expected tokens per second over k = 0..k_max; k = 0 is plain
  decoding, so the choice is never predicted to be slower than not speculating.
- `predict_speedup` is the same prediction for one given k; the benchmarks call it (and
  `best_window`) with costs they measured up front (`CostModel.measured`), so their
  predicted figures and `auto`'s choices come from one formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EMA = 0.2  # weight of a new measurement


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


def expected_tokens(alpha: list[float], k: int) -> float:
    """Mean tokens emitted by a step drafting k tokens (accepted prefix + 1)."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= alpha[min(i, len(alpha) - 1)] if alpha else 0.0
        total += run
    return total


def conditional_acceptance(per_position: list[float]) -> list[float]:
    """SpecStats' acceptance per position (P(draft token i kept | it was drafted), which
    includes rejections at earlier positions) -> the conditional alpha[i] = P(i kept | all
    before it kept) that `expected_tokens` takes. Zero once a position is never reached."""
    alpha, before = [], 1.0
    for kept in per_position:
        alpha.append(min(1.0, kept / before) if before > 0 else 0.0)
        before = kept
    return alpha


def _interpolate(table: dict[int, float], x: int) -> float | None:
    """Piecewise-linear through the measured points, extended by the nearest segment."""
    if not table:
        return None
    if x in table:
        return table[x]
    points = sorted(table.items())
    if len(points) == 1:
        return points[0][1]
    below = [p for p in points if p[0] < x][-2:]
    above = [p for p in points if p[0] > x][:2]
    pair = (below[-1:] + above[:1]) if below and above else (below or above)
    (x0, y0), (x1, y1) = pair[0], pair[-1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class CostModel:
    """Measured seconds, keyed by what drives them.

    A verify pass costs about the same for the same number of new tokens however they
    split into rows (weights are read once per pass; the matmuls see rows * T rows), so its
    table is keyed by total tokens and what one batch size measures serves the others. A
    draft step is keyed by rows (one token per row).
    """

    verify_s: dict[int, float] = field(default_factory=dict)  # total new tokens -> s
    draft_step_s: dict[int, float] = field(default_factory=dict)  # rows -> s per draft token

    @classmethod
    def measured(cls, rows: int, verify_curve: dict[int, float], draft_step_s: float) -> CostModel:
        """Costs measured up front at one batch size (the benchmarks' way): `verify_curve`
        maps k to the seconds of a pass of k+1 tokens per row (k = 0 is a plain step),
        `draft_step_s` is one draft token per row (0 for a free drafter such as n-gram)."""
        return cls(
            verify_s={rows * (k + 1): s for k, s in verify_curve.items()},
            draft_step_s={rows: draft_step_s},
        )

    def observe_verify(self, rows: int, tokens_per_row: int, seconds: float) -> None:
        key = rows * tokens_per_row
        self.verify_s[key] = _blend(self.verify_s.get(key), seconds)

    def observe_draft(self, rows: int, k: int, seconds: float) -> None:
        if k > 0:
            self.draft_step_s[rows] = _blend(self.draft_step_s.get(rows), seconds / k)

    def verify_time(self, rows: int, tokens_per_row: int) -> float | None:
        """Seconds for one target pass of `tokens_per_row` tokens on each of `rows` rows;
        None before any measurement."""
        return _interpolate(self.verify_s, rows * tokens_per_row)

    def draft_time(self, rows: int) -> float | None:
        """Seconds for one draft token on each of `rows` rows."""
        return _interpolate(self.draft_step_s, rows)

    def predict(self, rows: int, alpha: list[float], k: int) -> float | None:
        """Predicted tokens per second per row for window k; None if a cost is unknown, or
        extrapolated to nothing (noisy timings can make the measured curve fall, and its
        extension reach zero; with a free drafter the step would cost nothing)."""
        verify = self.verify_time(rows, k + 1)
        draft = self.draft_time(rows) if k else 0.0
        if verify is None or draft is None or k * draft + verify <= 0:
            return None
        return expected_tokens(alpha, k) / (k * draft + verify)

    def best_window(self, rows: int, alpha: list[float], k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over k = 0) maximising predicted tokens per second."""
        best_k, best = 0, 1.0
        for k in range(1, k_max + 1):
            speedup = predict_speedup(self, rows, alpha, k)
            if speedup is not None and speedup > best:
                best_k, best = k, speedup
        return best_k, best


def predict_speedup(costs: CostModel, rows: int, alpha: list[float], k: int) -> float | None:
    """Predicted tokens per second of window k over plain decoding (k = 0) at `rows` rows:
    expected_tokens(alpha, k) / (k * draft + verify(k + 1)) * verify(1). None while a cost
    is unknown."""
    plain = costs.predict(rows, alpha, 0)
    spec = costs.predict(rows, alpha, k)
    if plain is None or spec is None or plain <= 0:
        return None
    return spec / plain


class AdaptiveWindow:
    """`--speculate auto`: picks k each step from measured acceptance and costs.

    It first measures plain decoding (k = 0, once per batch size) and a few full windows
    (k = k_max), then exploits `best_window`; costs measured at one batch size inform the
    others through `CostModel`'s keying by total tokens. A window only wins if it is predicted to be
    `margin` faster than plain decoding, so noise does not make speculation hurt. Every
    `probe_every` steps it tries a window two longer than its choice (k = 1 when speculation
    is off), so acceptance that recovers and costs that change are noticed without paying
    for long probes.

    Acceptance per position is estimated from decayed counts (each step's counts weigh
    `decay` times the previous ones: a memory of about 1 / (1 - decay) steps), shrunk
    towards the pooled rate, so one unlucky rejection at batch 1 does not swing the window.
    """

    def __init__(
        self,
        k_max: int = 8,
        probe_every: int = 24,
        margin: float = 0.03,
        decay: float = 0.98,
        prior_weight: float = 4.0,
        explore_steps: int = 4,
    ) -> None:
        self.k_max = k_max
        self.probe_every = probe_every
        self.margin = margin
        self.decay = decay
        self.prior_weight = prior_weight
        self.costs = CostModel()
        self._reached: list[float] = []  # decayed count of rows that tested position i
        self._kept: list[float] = []  # ... and that kept it
        self.explore_steps = explore_steps
        self._explored = 0  # full-window steps taken so far
        self._since_probe = 0

    @property
    def alpha(self) -> list[float]:
        """Conditional acceptance per draft position from decayed counts, shrunk towards
        the rate pooled over all positions: positions the window rarely reaches (it stays
        short when they look bad) borrow strength from the ones it reaches every step,
        instead of staying at an arbitrary prior."""
        pooled = (sum(self._kept) + 1) / (sum(self._reached) + 2)
        weight = self.prior_weight
        return [
            (kept + weight * pooled) / (reached + weight)
            for kept, reached in zip(self._kept, self._reached, strict=True)
        ]

    def choose(self, rows: int) -> int:
        if rows not in self.costs.verify_s:  # a plain pass of `rows` tokens, measured once
            return 0
        if self._explored < self.explore_steps:  # a few full windows: costs and acceptance
            self._explored += 1
            return self.k_max
        k, speedup = self.costs.best_window(rows, self.alpha, self.k_max)
        k = k if speedup > 1 + self.margin else 0
        self._since_probe += 1
        if self._since_probe < self.probe_every:
            return k
        # Probe one step with a slightly longer window: cheap, and it refreshes the
        # estimates the current choice depends on (k = 1 while speculation is off: the
        # cheapest step that still measures whether the first draft token is accepted).
        self._since_probe = 0
        return min(self.k_max, k + 2) if k else 1

    def observe(
        self,
        rows: int,
        k: int,
        verify_s: float,
        draft_s: float,
        drafted_at: list[int],
        accepted_at: list[int],
    ) -> None:
        """Feed back one step: its timings and, per position, drafted/accepted row counts."""
        self.costs.observe_verify(rows, k + 1, verify_s)
        self.costs.observe_draft(rows, k, draft_s)
        grow = len(drafted_at) - len(self._reached)
        if grow > 0:
            self._reached += [0.0] * grow
            self._kept += [0.0] * grow
        for i, (d, a) in enumerate(zip(drafted_at, accepted_at, strict=True)):
            self._reached[i] = self.decay * self._reached[i] + d
            self._kept[i] = self.decay * self._kept[i] + a


class FixedWindow:
    """`--speculate K`: always draft K tokens (0 = plain decoding)."""

    def __init__(self, k: int) -> None:
        self.k_max = k

    def choose(self, rows: int) -> int:
        return self.k_max

    def observe(self, *args, **kwargs) -> None:
        pass
