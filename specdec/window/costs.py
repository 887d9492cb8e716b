"""Measured seconds of verify passes and draft steps, the host's pace, and the window that
pays most: k maximising expected tokens over the step's cost (docs/design/auto.md, "Costs")."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from specdec.window.config import WindowConfig


def expected_tokens(alpha: list[float], k: int) -> float:
    """Mean tokens a step drafting k emits, alpha[i] = P(i kept | all before kept):
    1 + sum_i prod_{j<=i} alpha[j]."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= alpha[min(i, len(alpha) - 1)] if alpha else 0.0
        total += run
    return total


def conditional_acceptance(per_position: list[float]) -> list[float]:
    """SpecStats' P(draft i kept | drafted) -> the conditional alpha[i] `expected_tokens` takes."""
    alpha, before = [], 1.0
    for kept in per_position:
        alpha.append(min(1.0, kept / before) if before > 0 else 0.0)
        before = kept
    return alpha


def interpolate(table: dict[int, float], x: int) -> float | None:
    """Piecewise-linear through the points, extended by the nearest segment."""
    if x in table:
        return table[x]
    if len(table) < 2:
        return next(iter(table.values()), None)
    points = sorted(table.items())
    i = min(max(bisect_left(points, (x,)), 1), len(points) - 1)  # the segment below x, or nearest
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _rising(table: dict[int, float], least: PlanGrowth) -> dict[int, float]:
    """The verify curve with each width at most any wider one's seconds (over its least
    growth, `PlanGrowth`): a narrower pass timed dearer ran in a slow moment ("Costs")."""
    out: dict[int, float] = {}
    lowest = lowest_per_plan = float("inf")
    for width in sorted(table, reverse=True):
        seconds = table[width]
        out[width] = min(seconds, lowest, least.hi(width) * lowest_per_plan)
        lowest = min(lowest, seconds)
        lowest_per_plan = min(lowest_per_plan, seconds / least.lo(width))
    return out


class PlanGrowth:
    """How a pass of `rows` rows grows with its tokens per row at least, from the target's
    projection timings (`tuning.projection_seconds`) as envelopes: `lo` (the least
    any wider took) and `hi` (the most any narrower took), plus the part they leave out;
    without plans both are 1 (the curve as timed)."""

    def __init__(self, plan_s: dict[int, float], rows: int, projection_share: float) -> None:
        widths = sorted(plan_s)
        high = {w: max(plan_s[v] for v in widths if v <= w) for w in widths}
        low = {w: min(plan_s[v] for v in widths if v >= w) for w in widths}
        fixed = (interpolate(high, rows) or 0.0) * (1 - projection_share) / projection_share
        self._envelopes = [{w: s + fixed for w, s in t.items()} for t in (low, high)]
        self._rows, self._memo = rows, {}

    def _at(self, high: int, tokens_per_row: int) -> float:
        if (high, tokens_per_row) not in self._memo:  # a step prices up to k_max windows
            seconds = interpolate(self._envelopes[high], self._rows * tokens_per_row)
            self._memo[high, tokens_per_row] = seconds or 1.0
        return self._memo[high, tokens_per_row]

    def lo(self, tokens_per_row: int) -> float:
        return self._at(0, tokens_per_row)

    def hi(self, tokens_per_row: int) -> float:
        return self._at(1, tokens_per_row)


def by_total(tables: dict[int, dict[int, float]], rows: int) -> dict[int, float]:
    """{rows: {tokens per row: s}} -> {total tokens: s}, the batch size nearest `rows` first."""
    out: dict[int, float] = {}
    for r, table in sorted(tables.items(), key=lambda item: abs(item[0] - rows)):
        for t, s in table.items():
            out.setdefault(r * t, s)
    return out


# What a warm start stores (`to_json`): every measured table and the pace.
_STORED = ("verify_s", "draft_step_s", "draft_first_s", "prefill_pass_s", "prefill_token_s",
           "catch_up_pass_s", "draft_ratio", "pace")  # fmt: skip


@dataclass
class CostModel:
    """Seconds at pace 1: verify passes by (rows, tokens per row), draft tokens by rows (a
    step's first apart where timed), the target's prefill and a draft's catch-up passes."""

    verify_s: dict[int, dict[int, float]] = field(default_factory=dict)  # rows -> {T: s}
    draft_step_s: dict[int, float] = field(default_factory=dict)  # rows -> s per draft token
    draft_first_s: dict[int, float] = field(default_factory=dict)  # rows -> a step's first
    prefill_pass_s: dict[int, dict[int, float]] = field(default_factory=dict)  # rows -> {T: s}
    prefill_token_s: float | None = None
    catch_up_pass_s: dict[int, float] = field(default_factory=dict)  # tokens fed -> s
    draft_ratio: float | None = None  # bytes a draft step reads over the target's
    # Projection seconds per pass width from the kernel plans (read at each start, so
    # neither stored nor compared): what prices a pass or draft step before it is timed.
    target_plan_s: dict[int, float] = field(default_factory=dict, compare=False)
    draft_plan_s: dict[int, float] = field(default_factory=dict, compare=False)
    _seen: dict[tuple[int, int], int] = field(default_factory=dict)  # (rows, T) -> passes timed
    drafts_timed: int = field(default=0, compare=False)
    pace: float = 1.0  # how much slower than its tables the host runs now
    config: WindowConfig = field(default_factory=WindowConfig, compare=False, repr=False)
    _growth: tuple = field(default=(None, None), compare=False, repr=False)
    _curves: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def measured(cls, rows: int, verify_curve: dict[int, float], draft_step_s: float) -> CostModel:
        """Costs measured up front (the benchmarks'): k -> seconds of a k + 1 token pass."""
        return cls(
            verify_s={rows: {k + 1: s for k, s in verify_curve.items()}},
            draft_step_s={rows: draft_step_s},
            drafts_timed=2,
        )

    def to_json(self) -> dict:
        """Everything measured, as JSON (the warm start, `specdec.window.cache`)."""
        seen = [[rows, t, n] for (rows, t), n in self._seen.items()]
        return {name: getattr(self, name) for name in _STORED} | {"seen": seen}

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        """The inverse of `to_json`; stored draft costs are none of this process's timings,
        so its first ones replace them where faster ("Warm start")."""

        def keyed(value):  # JSON's string keys back to ints, the seconds to floats
            if isinstance(value, dict):
                return {int(k): keyed(v) for k, v in value.items()}
            return value if value is None else float(value)

        stored = {name: keyed(data[name]) for name in _STORED if name in data}
        seen = {(int(r), int(t)): int(n) for r, t, n in data["seen"]}
        return cls(**stored, _seen=seen)

    def _merge(self, old: float | None, new: float, first: bool) -> float:
        """The fastest of a shape's first timings, then a running average."""
        if old is None:
            return new
        return min(old, new) if first else (1 - self.config.ema) * old + self.config.ema * new

    def observe_verify(self, rows: int, tokens_per_row: int, seconds: float) -> None:
        """A verify pass; an established shape's ratio to its table moves the pace."""
        table = self.verify_s.setdefault(rows, {})
        seen, old = self.timed(rows, tokens_per_row), table.get(tokens_per_row)
        first = seen < self.config.first_timings
        if not first and old and seconds > 0:
            ratio = min(2.0, max(0.5, seconds / (old * self.pace)))
            self.pace *= ratio**self.config.ema
        table[tokens_per_row] = self._merge(old, seconds / self.pace, first)
        self._seen[(rows, tokens_per_row)] = seen + 1

    def timed(self, rows: int, tokens_per_row: int) -> int:
        return self._seen.get((rows, tokens_per_row), 0)

    def observe_draft(
        self, rows: int, k: int, seconds: float, first_s: float | None = None
    ) -> None:
        """A step's `seconds` drafting k tokens a row; `first_s` its first token's, if timed."""
        if k <= 0:
            return
        seconds /= self.pace
        first = self.drafts_timed < self.config.first_timings
        self.drafts_timed += 1
        if first_s is not None:  # the first token apart, the later ones a step each
            first_s /= self.pace
            self.draft_first_s[rows] = self._merge(self.draft_first_s.get(rows), first_s, first)
            seconds, k = max(0.0, seconds - first_s), k - 1
        if k:
            self.draft_step_s[rows] = self._merge(self.draft_step_s.get(rows), seconds / k, first)

    def widest_measured(self, rows: int) -> int:
        return max(self.verify_s.get(rows, {}), default=0)

    def growth(self, rows: int) -> PlanGrowth:
        """The target's projections' least growth at `rows`, built once per plans."""
        if self._growth[0] is not self.target_plan_s:
            self._growth = (self.target_plan_s, {})
        built = self._growth[1]
        if rows not in built:
            built[rows] = PlanGrowth(self.target_plan_s, rows, self.config.projection_share)
        return built[rows]

    def verify_time(self, rows: int, tokens_per_row: int) -> float | None:
        """Seconds of a pass at `rows`: the rising curve of its own timings (at least the
        narrower grown by the plans), else other batch sizes' by total tokens."""
        own = self.verify_s.get(rows, {})
        if tokens_per_row in own or len(own) >= 2:
            least = self.growth(rows)
            key = (tuple(own.items()), least)
            cached = self._curves.get(rows)
            if cached is None or cached[0] != key:  # a step prices up to k_max windows
                cached = self._curves[rows] = (key, _rising(own, least))
            curve = cached[1]
            seconds = interpolate(curve, tokens_per_row)
            if self.target_plan_s and tokens_per_row not in curve:
                grown = [s / least.hi(t) * least.lo(tokens_per_row) for t, s in curve.items()
                         if t < tokens_per_row]  # fmt: skip
                seconds = max([seconds, *grown])
            return seconds * self.pace
        totals = by_total(self.verify_s, rows)
        estimate = interpolate(totals, rows * tokens_per_row)
        if own and estimate is not None:  # one point here: keep its level, borrow the shape
            ((t0, s0),) = own.items()
            at_t0 = interpolate(totals, rows * t0)
            estimate = estimate * s0 / at_t0 if at_t0 else s0
        return None if estimate is None else estimate * self.pace

    def draft_time(self, rows: int) -> float | None:
        """Seconds of one draft token a row (after a step's first, where timed apart)."""
        step = interpolate(self.draft_step_s, rows)
        step = step if step is not None else interpolate(self.draft_first_s, rows)
        return None if step is None else step * self.pace

    def draft_seconds(self, rows: int, k: int) -> float | None:
        """Seconds of a step's k draft tokens a row."""
        if k <= 0:
            return 0.0
        step, first = self.draft_time(rows), interpolate(self.draft_first_s, rows)
        if step is None:
            return None
        return (step if first is None else first * self.pace) + (k - 1) * step

    def draft_share(self, rows: int) -> float:
        """A draft pass over the target's before the draft is timed: by the plans, held at
        least at the bytes' ratio; else that ratio; else 1 ("Start-up")."""
        draft = interpolate(self.draft_plan_s, rows)
        target = interpolate(self.target_plan_s, rows)
        if draft and target:
            return max(draft / target, self.draft_ratio or 0.0)
        return self.draft_ratio or 1.0

    def set_prices(self, draft_ratio: float | None, target_plan_s: dict, draft_plan_s: dict):
        """What prices a pass before it is timed. A stored draft timing over twice that price
        (a profiler, a busy host) is dropped: trusted, it would keep every later process
        from drafting to learn otherwise ("Warm start")."""
        self.draft_ratio = draft_ratio
        self.target_plan_s, self.draft_plan_s = target_plan_s, draft_plan_s
        stored = self.draft_step_s | self.draft_first_s
        if not self.drafts_timed and any(self.draft_overpriced(rows) for rows in stored):
            self.draft_step_s, self.draft_first_s = {}, {}

    def draft_overpriced(self, rows: int) -> bool:
        """Whether a draft token is timed over twice its planned price."""
        drafted, plain = self.draft_time(rows), self.verify_time(rows, 1)
        if drafted is None or plain is None:
            return False
        return drafted > 2 * self.draft_share(rows) * plain

    def look_unsettled(self, rows: int) -> bool:
        """Whether a first look's costs rest on one timing over twice its planned price
        (one-off setup, most likely): worth a second look before they decide ("Looks")."""
        if self.drafts_timed != 1:
            return False
        if self.draft_overpriced(rows):
            return True
        plain = self.verify_time(rows, 1)
        if plain is None:
            return False
        one, two = (interpolate(self.target_plan_s, n) for n in (rows, 2 * rows))
        limit = 2 * (two / one if one and two else 1.0) * plain
        pair = self.verify_s.get(rows, {}).get(2)  # a two-token pass timed once, over its limit
        return pair is not None and self.timed(rows, 2) == 1 and pair * self.pace > limit

    def expected_verify_time(self, rows: int, k: int, fill: list[float] | None) -> float | None:
        """Seconds of a window-k step's verify pass, which is as wide as its longest draft:
        time(1) + sum over j <= k of fill[j-1] x (time(j+1) - time(j)), fill[j-1] the chance
        a pass is at least j drafts wide (a drafter that sizes its drafts by its match), as
        its last past its end; without `fill` every pass is k + 1 wide ("Costs")."""
        if not fill or k == 0 or min(fill[:k]) >= 1.0:
            return self.verify_time(rows, k + 1)
        times = [self.verify_time(rows, w) for w in range(1, k + 2)]  # widths 1 .. k + 1
        if times[0] is None:  # nothing timed yet
            return None
        share = [fill[min(j, len(fill) - 1)] for j in range(k)]  # past it: as the last
        return times[0] + sum(f * (times[j + 1] - times[j]) for j, f in enumerate(share))

    def predict(
        self, rows: int, alpha: list[float], k: int, fill: list[float] | None = None
    ) -> float | None:
        """Tokens per second a row at window k; None while a cost is unknown or zero."""
        verify = self.expected_verify_time(rows, k, fill)
        draft = self.draft_seconds(rows, k)
        if verify is None or draft is None or draft + verify <= 0:
            return None
        return expected_tokens(alpha, k) / (draft + verify)

    def best_window(
        self, rows: int, alpha: list[float], k_max: int, fill: list[float] | None = None
    ) -> tuple[int, float]:
        """(k, predicted speedup over k = 0) maximising tokens per second; k = 0 is plain."""
        speedups = {
            k: predict_speedup(self, rows, alpha, k, fill) or 0.0 for k in range(1, k_max + 1)
        }
        k = max(speedups, key=speedups.get, default=0)  # the narrowest of equals
        return (k, speedups[k]) if k and speedups[k] > 1.0 else (0, 1.0)


def predict_speedup(
    costs: CostModel, rows: int, alpha: list[float], k: int, fill: list[float] | None = None
) -> float | None:
    """Predicted speed of window k over plain decoding at `rows`; None while unknown."""
    plain, spec = costs.predict(rows, alpha, 0), costs.predict(rows, alpha, k, fill)
    if plain is None or spec is None or plain <= 0:
        return None
    return spec / plain
