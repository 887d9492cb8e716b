"""What speculation costs and gains, measured as it runs; and the window that pays most.

One implementation serves `--speculate auto` and the benchmarks' predictions:

- `CostModel` keeps running averages of the measured seconds of a verify pass of T tokens
  per row, per batch size (rows), and of one drafter step per row count; it interpolates
  between measured T and, for a batch size not measured yet, borrows the measurements of
  others keyed by total new tokens (weights are read once per pass, whatever the split).
- `expected_tokens(alpha, k)`: tokens one step emits when draft position i is accepted with
  conditional probability alpha[i]: 1 + sum_i prod_{j<=i} alpha[j] (DESIGN.md's formula is
  the special case of equal alphas).
- `best_window` maximises expected tokens per second over k = 0..k_max; k = 0 is plain
  decoding, so the choice is never predicted to be slower than not speculating.
- `predict_speedup` is the same prediction for one given k; the benchmarks call it (and
  `best_window`) with costs they measured up front (`CostModel.measured`), so their
  predicted figures and `auto`'s choices come from one formula.
- `startup_pays` prices the one-off cost of starting to speculate with a draft model whose
  prefill is lazy (rows not caught up need a catch-up pass over their history) against
  what speculating would save over the tokens the rows still have to generate. Before a
  verify pass or draft step is timed, it prices them from the kernel plans' own timings
  (`tuning.projection_seconds`) where those exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EMA = 0.2  # weight of a new measurement
PACE_WEIGHT = 0.2  # weight of a pass's log ratio in the host's pace (`CostModel.pace`)
FIRST_TIMINGS = 3  # a pass shape's first timings, of which the fastest is kept
# The share of a one-token verify pass that the projections take, for `PlanGrowth`'s floor:
# the rest barely grows with a few more tokens. Measured, the int4 1.5B at batch 1 (Xeon
# AMX): an 8-token pass cost 1.26x a 4-token one where its projections' timings say 1.30x.
PROJECTION_SHARE = 0.8
CATCH_UP_WIDTHS = 32  # catch-up pass widths kept (the most recently seen)


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


def _faster(old: float | None, new: float) -> float:
    return new if old is None else min(old, new)


def _optimistic_rate(kept: float, reached: float, z: float) -> float:
    """An acceptance rate from `kept` of `reached` draws, z standard errors above its
    estimate (the posterior mean under a uniform prior): what one unlucky draw at batch 1
    must not push down by itself (`AdaptiveWindow.alpha` and its prior, `_look_may_pay`)."""
    mean = (kept + 1) / (reached + 2)
    return min(1.0, mean + z * (mean * (1 - mean) / (reached + 3)) ** 0.5)


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


def _line(table: dict[int, float], x: int) -> float:
    """The least-squares line a + b x through the points, at x; the points' seconds per
    unit times x where they do not rise (noise among close widths)."""
    n = len(table)
    mean_x, mean_y = sum(table) / n, sum(table.values()) / n
    spread = sum((t - mean_x) ** 2 for t in table)
    slope = sum((t - mean_x) * (s - mean_y) for t, s in table.items()) / spread if spread else 0
    if slope <= 0:
        return x * sum(table.values()) / sum(table)
    return max(0.0, mean_y + slope * (x - mean_x))


def _rising(table: dict[int, float], least=None) -> dict[int, float]:
    """A verify curve {tokens per row: s} with each width at most any wider one: a pass
    reads the same weights for more tokens and never costs less, so a narrower pass timed
    dearer than a wider one was timed in a slow moment of the host. The plain step is the
    one that goes stale: `auto` times it in its first steps and, while drafting, once in
    48 (its probes); on the 2-core EPYC an int4 1.5B engine timed its plain step at 48
    and 35 ms at the start, then its 2-token verify passes at 25-28 ms for a whole chat
    request, and priced every window against the 35 (a k = 1 step looked 1.3x better
    than it was).

    `least` (a `PlanGrowth`, or None: no floor) says more: how much dearer a wider pass
    is at least, and a narrower width is priced at most at a wider one's seconds divided
    by that. Without it a width timed in a slow moment is brought down only to the wider
    pass, so the curve goes flat there and every window up to that width looks free: at
    issue 13's floor point (4 rows x 1024 tokens, int4) on a busy host a cold `auto` timed
    a 6-token pass below its plain step and drafted k = 8 at acceptance 0.3."""
    out: dict[int, float] = {}
    lowest = lowest_per_plan = float("inf")
    for width in sorted(table, reverse=True):
        seconds = table[width]
        if least is None:
            lowest = out[width] = min(lowest, seconds)
            continue
        # min over wider w of s_w / max(1, lo(w) / hi(width)), taken apart: min(s_w) and
        # hi(width) x min(s_w / lo(w))
        out[width] = min(seconds, lowest, least.hi(width) * lowest_per_plan)
        lowest = min(lowest, seconds)
        lowest_per_plan = min(lowest_per_plan, seconds / least.lo(width))
    return out


class PlanGrowth:
    """How a verify pass of `rows` rows grows with its tokens per row, at least: the
    target's projection seconds per pass width (`tuning.projection_seconds`) as two
    envelopes, `lo` (at each width the least any wider one took) and `hi` (the most any
    narrower one took), so that lo(wide) / hi(narrow) is a growth the projections' own
    timings allow at the least, less the part of a pass they leave out
    (`PROJECTION_SHARE`). Those timings are noisy (the int4 1.5B's at 64 rows below
    its 32; bf16's 32 rows below its one row), and a floor made from them must never
    price a pass above what it costs: the envelopes keep a dip or a spike in one bucket
    from raising it. Where the projections barely grow (bf16 at a few rows) the floor is 1
    and changes nothing; where they are compute-bound (int4 at 4 x 2 rows: 1.30x the 4-row
    pass, 1.24x with the part left out, the whole step measured 1.4-1.6x at a 1024-token
    context) it is what a timing in a slow moment cannot undercut."""

    def __init__(self, plan_s: dict[int, float], rows: int) -> None:
        widths = sorted(plan_s)
        low = {w: min(plan_s[v] for v in widths if v >= w) for w in widths}
        high = {w: max(plan_s[v] for v in widths if v <= w) for w in widths}
        # The part of a pass that does not grow with its tokens (attention over a short
        # context, norms, sampling, the step's Python), as a share of the one-token pass.
        one = _interpolate(high, rows) or 0.0
        fixed = one * (1 - PROJECTION_SHARE) / PROJECTION_SHARE
        self._low = {w: s + fixed for w, s in low.items()}
        self._high = {w: s + fixed for w, s in high.items()}
        self._rows = rows
        self._lo_at: dict[int, float] = {}  # memo: `auto` asks for the same few widths
        self._hi_at: dict[int, float] = {}

    def lo(self, tokens_per_row: int) -> float:
        return self._at(self._low, self._lo_at, tokens_per_row)

    def hi(self, tokens_per_row: int) -> float:
        return self._at(self._high, self._hi_at, tokens_per_row)

    def _at(self, envelope: dict, memo: dict, tokens_per_row: int) -> float:
        if tokens_per_row not in memo:
            memo[tokens_per_row] = _interpolate(envelope, self._rows * tokens_per_row) or 1.0
        return memo[tokens_per_row]


def _by_total(tables: dict[int, dict[int, float]], rows: int) -> dict[int, float]:
    """{rows -> {tokens per row: s}} -> {total new tokens: s}, the batch size nearest
    `rows` winning where two give the same total."""
    by_total: dict[int, float] = {}
    for r, table in sorted(tables.items(), key=lambda item: abs(item[0] - rows)):
        for t, s in table.items():
            by_total.setdefault(r * t, s)
    return by_total


@dataclass
class CostModel:
    """Measured seconds, keyed by what drives them.

    A verify pass is keyed by (rows, tokens per row): at a short context its cost depends
    on the total new tokens however they split into rows (weights are read once per pass,
    the matmuls see rows * T rows), but attention reads every row's cached keys, so at a
    long context four rows of one token cost more than one row of four. A batch size not
    measured yet borrows the others' points by total tokens, scaled to what it did measure.
    A draft step is keyed by rows (one token per row). A draft model's first pass of a
    step can be wider than the others: after a step that accepted every draft token it
    also feeds the last one, which was sampled but never fed (two tokens per row). Where
    the drafter times its first pass, it is kept apart (`draft_first_s`) and the draft
    steps after it per token (`draft_step_s`); averaged together, the wider first pass
    made every window look dearer per token by the same share, and a k = 1 window that
    paid was never widened to the k = 2 that paid more (the int4 pair on code: `auto` at
    1.11x plain, k = 2 at 1.22x).
    """

    verify_s: dict[int, dict[int, float]] = field(default_factory=dict)  # rows -> {T: s}
    draft_step_s: dict[int, float] = field(default_factory=dict)  # rows -> s per draft token
    draft_first_s: dict[int, float] = field(default_factory=dict)  # rows -> s, a step's first
    # Start-up pricing (`startup_pays`): seconds per prompt token of the target's prefill
    # (rows -> {tokens per row: s} of whole passes, and per token), of the draft's catch-up
    # passes per token, and the draft's cost relative to the target's (None: unknown).
    prefill_pass_s: dict[int, dict[int, float]] = field(default_factory=dict)
    prefill_token_s: float | None = None
    # Seconds of whole catch-up passes by the tokens they fed: a pass costs a fixed part
    # (every weight read once) plus a part per token, so the per-token average of the
    # short catch-ups after a few plain steps overprices the long one of a new prompt
    # (the int4 0.5B draft on a Zen 4: 16 tokens 69 ms, 47 tokens 131 ms; the average
    # of a run's catch-ups, 7.4 ms a token, priced a 47-token one at 350 ms). One width
    # alone prices per token.
    catch_up_pass_s: dict[int, float] = field(default_factory=dict)
    draft_ratio: float | None = None
    # Seconds of one pass of n rows (n -> s, at the kernel buckets) through the target's
    # and through the draft's projections, from the timings behind their kernel plans
    # (`tuning.projection_seconds`; empty: unknown). They price what has not been
    # timed yet: how a pass grows with its rows (`startup_verify_time`) and the draft's
    # cost relative to the target's (`draft_share`). Read from the kernel cache at each
    # start, so neither stored (`to_json`) nor compared: they are no measurement of a run.
    target_plan_s: dict[int, float] = field(default_factory=dict, compare=False)
    draft_plan_s: dict[int, float] = field(default_factory=dict, compare=False)
    # `PlanGrowth` per batch size, for the plan table it was built from (`_plan_growth`),
    # and the priced curve per batch size for the timings it was built from (`_curve`).
    _growth_cache: tuple = field(default=(None, None), compare=False, repr=False)
    _curve_cache: dict = field(default_factory=dict, compare=False, repr=False)
    _seen: dict[tuple[int, int], int] = field(default_factory=dict)  # (rows, T) -> passes timed
    # Draft steps timed (see `observe_draft`); a count, not a measurement: not compared.
    drafts_timed: int = field(default=0, compare=False)
    # The host's pace: how much slower than its tables it runs now. A shared machine's
    # speed drifts by a third over seconds (the int4 1.5B's plain step 20-30 ms in one
    # run), and a pass width timed in a slow minute, priced against a plain step timed in
    # a fast one, made every window look dear (a 4-token pass at 1.6 plain steps, 1.25
    # measured side by side) and switched drafting off. So the verify and draft tables hold
    # seconds at pace 1: each pass of a width timed FIRST_TIMINGS times or more moves the
    # pace by its ratio to the table, and is stored divided by it; the widths not timed
    # meanwhile (the plain step while drafting) move with the pace instead of going stale.
    pace: float = 1.0

    @classmethod
    def measured(cls, rows: int, verify_curve: dict[int, float], draft_step_s: float) -> CostModel:
        """Costs measured up front at one batch size (the benchmarks' way): `verify_curve`
        maps k to the seconds of a pass of k+1 tokens per row (k = 0 is a plain step),
        `draft_step_s` is one draft token per row (0 for a free drafter such as n-gram)."""
        return cls(
            verify_s={rows: {k + 1: s for k, s in verify_curve.items()}},
            draft_step_s={rows: draft_step_s},
            drafts_timed=2,
        )

    def to_json(self) -> dict:
        """Everything measured, as JSON (the warm start of `specdec.cost_cache`)."""
        return {
            "verify_s": self.verify_s,
            "draft_step_s": self.draft_step_s,
            "draft_first_s": self.draft_first_s,
            "prefill_pass_s": self.prefill_pass_s,
            "prefill_token_s": self.prefill_token_s,
            "catch_up_pass_s": self.catch_up_pass_s,
            "draft_ratio": self.draft_ratio,
            "pace": self.pace,
            "seen": [[rows, t, n] for (rows, t), n in self._seen.items()],
        }

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        """The inverse of `to_json` (JSON object keys are strings: ints again here)."""

        def table(d: dict) -> dict[int, float]:
            return {int(k): float(v) for k, v in d.items()}

        return cls(
            verify_s={int(r): table(t) for r, t in data["verify_s"].items()},
            draft_step_s=table(data["draft_step_s"]),
            draft_first_s=table(data.get("draft_first_s", {})),
            prefill_pass_s={int(r): table(t) for r, t in data["prefill_pass_s"].items()},
            prefill_token_s=data["prefill_token_s"],
            catch_up_pass_s=table(data.get("catch_up_pass_s", {})),
            draft_ratio=data["draft_ratio"],
            pace=float(data.get("pace", 1.0)),
            _seen={(int(r), int(t)): int(n) for r, t, n in data["seen"]},
            # A stored draft cost counts as one timing: this process's first replaces it
            # where faster, and one far above the plans' price is looked at again
            # (`look_unsettled`). A cache written on a busy host (the bf16 1.5B with its
            # int4 0.5B draft, timed beside another 2-thread process: the draft at 0.55 of
            # a plain step, quiet 0.15) otherwise kept every later process from drafting:
            # none looked, so none re-timed it (`make demo`: 1.05x plain, 2.2x without the
            # cache; Xeon AMX, stop 37).
            drafts_timed=1 if data["draft_step_s"] or data.get("draft_first_s") else 0,
        )

    def observe_verify(self, rows: int, tokens_per_row: int, seconds: float) -> None:
        """A running average, except that a shape's first FIRST_TIMINGS passes keep the
        fastest: the first call of a shape pays one-off setup, and on a shared machine a
        neighbour only ever adds time (one slow plain step would make every window look
        better than it is, for the whole run). Two were not enough: at issue 13's floor
        point (4 rows x 1024 tokens, int4, eagle head) the plain step after the prefill's
        warm-up ran 92-99 ms in a slow moment against 80 steady, the 2-token pass was
        priced at 1.25-1.30 plain steps against 1.45 measured side by side, and `auto`
        drafted k = 1 through a whole run at 0.87x plain."""
        table = self.verify_s.setdefault(rows, {})
        seen = self._seen.get((rows, tokens_per_row), 0)
        old = table.get(tokens_per_row)
        if seen >= FIRST_TIMINGS and old and seconds > 0:  # established: the host's pace
            ratio = min(2.0, max(0.5, seconds / (old * self.pace)))
            self.pace *= ratio**PACE_WEIGHT
        at_pace = seconds / self.pace
        if seen < FIRST_TIMINGS:
            table[tokens_per_row] = _faster(old, at_pace)
        else:
            table[tokens_per_row] = _blend(old, at_pace)
        self._seen[(rows, tokens_per_row)] = seen + 1

    def timed(self, rows: int, tokens_per_row: int) -> int:
        """How many passes of this shape have been timed."""
        return self._seen.get((rows, tokens_per_row), 0)

    def observe_draft(
        self, rows: int, k: int, seconds: float, first_s: float | None = None
    ) -> None:
        """A step's `seconds` drafting k tokens per row; `first_s` of them its first draft
        token's (None: the drafter does not say).

        The first FIRST_TIMINGS steps timed keep the fastest, as a verify pass's first
        timings do (`observe_verify`): a drafter's first call pays one-off setup, and a
        neighbour on a shared host only ever adds time. The int4 0.5B draft's first step
        took 48-63 ms, its next ones 22-27 (Xeon AMX, stop 37): the first alone priced the
        draft at 1.34 plain steps a token, no window could pay, and a cold `auto` never
        drafted again in the process (`look_unsettled`: a second look where that
        happens)."""
        if k <= 0:
            return
        seconds /= self.pace  # the tables hold seconds at pace 1
        first_s = None if first_s is None else first_s / self.pace
        merge = _faster if self.drafts_timed < FIRST_TIMINGS else _blend
        self.drafts_timed += 1
        if first_s is None:
            self.draft_step_s[rows] = merge(self.draft_step_s.get(rows), seconds / k)
            return
        self.draft_first_s[rows] = merge(self.draft_first_s.get(rows), first_s)
        if k > 1:
            later = max(0.0, seconds - first_s) / (k - 1)
            self.draft_step_s[rows] = merge(self.draft_step_s.get(rows), later)

    def observe_prefill(self, rows: int, tokens_per_row: int, tokens: int, seconds: float) -> None:
        """The target's prefill of `rows` prompts (`tokens_per_row` the longest, `tokens`
        in all): a pass of many tokens per row, the start-up pricing's only view of how a
        multi-token pass grows before any has been timed."""
        if tokens <= 0:
            return
        table = self.prefill_pass_s.setdefault(rows, {})
        table[tokens_per_row] = _blend(table.get(tokens_per_row), seconds)
        self.prefill_token_s = _blend(self.prefill_token_s, seconds / tokens)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A draft catch-up pass: `tokens` history tokens fed in `seconds`."""
        if tokens > 0:
            passes = self.catch_up_pass_s
            passes[tokens] = _blend(passes.pop(tokens, None), seconds)  # newest last
            if len(passes) > CATCH_UP_WIDTHS:
                del passes[next(iter(passes))]

    def catch_up_time(self, tokens: int) -> float | None:
        """Seconds for the draft to catch up on `tokens` history tokens: through the
        measured catch-up passes (`catch_up_pass_s`; one width: its seconds per token),
        until one has run the target's prefill per token scaled by `draft_share` of a pass
        that wide."""
        if self.catch_up_pass_s:
            return _line(self.catch_up_pass_s, tokens)
        if self.prefill_token_s is None:
            return None
        return tokens * self.prefill_token_s * self.draft_share(tokens)

    def look_unsettled(self, rows: int) -> bool:
        """Whether the costs a first look measured rest on one step timed at over twice
        what the kernel plans price it at: the draft step (against `draft_share` of the
        plain step) or the look's two-token pass (against the plain step grown as the
        target's plans grow from one row to two). Most likely that first call's one-off
        setup (`observe_draft`, `observe_verify`), worth a second step before it rules
        drafting out: a cold `auto` whose first two-token pass took 100 ms against a
        47 ms plain step (steady: 52) never drafted in four chat requests (0.96x plain,
        Xeon AMX, stop 37). A look timed near its price is taken as it is (a second look
        there only costs: batch 16, where verification is compute-bound, read 0.96x plain
        with one)."""
        if self.drafts_timed != 1:
            return False
        drafted, plain = self.draft_time(rows), self.verify_time(rows, 1)
        if drafted is None or plain is None:
            return False
        if drafted > 2 * self.draft_share(rows) * plain:
            return True
        pair = self.verify_s.get(rows, {}).get(2)
        if pair is None or self._seen.get((rows, 2), 0) != 1:
            return False
        one, two = (_interpolate(self.target_plan_s, n) for n in (rows, 2 * rows))
        grown = two / one if one and two else 1.0
        return pair * self.pace > 2 * grown * plain

    def draft_share(self, rows: int) -> float:
        """A pass of `rows` rows through the draft as a share of the same pass through the
        target, before the draft is timed: the ratio of their projections' seconds as the
        kernel tuning timed them here when both are known (it sees the draft's weight
        format and the kernels' per-call costs, where the weight count `draft_ratio` sees
        neither: the 0.5B int4 draft of the 1.5B is 0.27 of it by weights), else
        `draft_ratio`, else 1 (a draft is rarely dearer than its target). Still a prior,
        and an optimistic one: it leaves out the draft's per-step work outside the
        projections, and the two models' timings may come from tunings under different
        loads (on the 2-core EPYC, busy: 0.04 by the plans, a draft step measured 0.17-0.19
        of the plain step), so it is held at least at `draft_ratio`, the ratio of the bytes
        a step reads (~0.08 for the 0.5B int4 draft of the bf16 1.5B, ~0.27 of the int4 one)."""
        draft = _interpolate(self.draft_plan_s, rows)
        target = _interpolate(self.target_plan_s, rows)
        if draft and target:  # never below the bytes' ratio, which no tuning load skews
            return max(draft / target, self.draft_ratio or 0.0)
        return self.draft_ratio or 1.0

    def startup_verify_time(self, rows: int, tokens_per_row: int) -> float | None:
        """`verify_time`, except while only one pass width is timed at `rows` (before
        speculation starts: the plain step), where a flat curve would promise every window
        for free. Then the pass grows from the timed one as the target's projections do
        (`target_plan_s`, rows x tokens per row against the timed width): the whole
        step scaled by its projections' growth, an overestimate by the share of the step
        that barely grows with a few more tokens (attention at a short context, norms).
        Measured on the 1.5B (2-core EPYC, busy): a 4-token pass 1.32x the plain step by
        the plans, 1.31x-1.39x timed, 1.58x by the prefill line.

        Without kernel timings the target's prefill passes serve as the far points of the
        curve, by total tokens, scaled to the plain step timed at `rows`: rows that finish
        or join change the batch size, and a batch size whose own prefill was never timed
        must not see a flat curve (at 8 rows at temperature 1, a row's early end let auto
        start a catch-up that the 8-row curve had refused: 0.89x of plain). That line is
        steep on a CPU, where a prefill is compute-bound: the 1.5B's plain step 0.19 s and
        47-token prefill 1.7 s put a 5-token pass at 0.32 s, measured 0.24 s, and a cold
        auto never started the draft that ran 6.7 tok/s against 4.0 plain."""
        own = self.verify_s.get(rows, {})
        if tokens_per_row in own or len(own) >= 2 or not own:
            return self.verify_time(rows, tokens_per_row)
        ((t0, s0),) = own.items()
        s0 *= self.pace
        if self.target_plan_s:
            grown = _interpolate(self.target_plan_s, rows * tokens_per_row)
            timed = _interpolate(self.target_plan_s, rows * t0)
            if grown and timed:
                return s0 * max(1.0, grown / timed)
        if not self.prefill_pass_s:
            return self.verify_time(rows, tokens_per_row)
        by_total = _by_total(self.prefill_pass_s, rows)
        by_total[rows * t0] = s0
        estimate = _interpolate(by_total, rows * tokens_per_row)
        return None if estimate is None else max(estimate, s0)

    def _plan_growth(self, rows: int) -> PlanGrowth | None:
        """The target's projections' least growth at `rows` (None without kernel plans:
        no floor), built once per plan table and batch size."""
        if not self.target_plan_s:
            return None
        plans, built = self._growth_cache
        if plans is not self.target_plan_s:
            plans, built = self.target_plan_s, {}
            self._growth_cache = (plans, built)
        if rows not in built:
            built[rows] = PlanGrowth(plans, rows)
        return built[rows]

    def _curve(self, rows: int, own: dict[int, float], least: PlanGrowth | None) -> dict:
        """`_rising(own, least)`, kept until the timings or the plans change: `auto` prices
        up to k_max windows a step, each through this curve: built afresh, `best_window`
        took 0.43 ms over 6 timed widths, 0.05 ms with the curve kept (a SmolLM2 step is
        13 ms)."""
        key = (tuple(own.items()), least)
        cached = self._curve_cache.get(rows)
        if cached is None or cached[0] != key:
            cached = self._curve_cache[rows] = (key, _rising(own, least))
        return cached[1]

    def widest_measured(self, rows: int) -> int:
        """The most tokens per row of a timed pass at `rows` (0: none yet)."""
        return max(self.verify_s.get(rows, {}), default=0)

    def verify_time(self, rows: int, tokens_per_row: int) -> float | None:
        """Seconds for one target pass of `tokens_per_row` tokens on each of `rows` rows,
        at most any wider pass timed at `rows` divided by how much dearer the target's
        projections make it at least (`_rising`, `PlanGrowth`), and a width not timed at
        least the narrower ones grown as much; None before any measurement."""
        own = self.verify_s.get(rows, {})
        if tokens_per_row in own or len(own) >= 2:
            least = self._plan_growth(rows)
            curve = self._curve(rows, own, least)
            seconds = _interpolate(curve, tokens_per_row)
            if least is not None and tokens_per_row not in curve:  # grown from the narrower
                seconds = max(
                    [seconds]
                    + [
                        s / least.hi(t) * least.lo(tokens_per_row)
                        for t, s in curve.items()
                        if t < tokens_per_row
                    ]
                )
            return seconds * self.pace
        by_total = _by_total(self.verify_s, rows)
        estimate = _interpolate(by_total, rows * tokens_per_row)
        if own and estimate is not None:  # one point here: keep its level, borrow the shape
            ((t0, s0),) = own.items()
            at_t0 = _interpolate(by_total, rows * t0)
            estimate = estimate * s0 / at_t0 if at_t0 else s0
        return None if estimate is None else estimate * self.pace

    def draft_time(self, rows: int) -> float | None:
        """Seconds for one draft token on each of `rows` rows (after a step's first, where
        that is timed apart; before any later one is, the first's)."""
        step = _interpolate(self.draft_step_s, rows)
        step = step if step is not None else _interpolate(self.draft_first_s, rows)
        return None if step is None else step * self.pace

    def draft_seconds(self, rows: int, k: int) -> float | None:
        """Seconds for a step's k draft tokens on each of `rows` rows."""
        if k <= 0:
            return 0.0
        step = self.draft_time(rows)
        first = _interpolate(self.draft_first_s, rows)
        if step is None:
            return None
        return (step if first is None else first * self.pace) + (k - 1) * step

    def predict(self, rows: int, alpha: list[float], k: int) -> float | None:
        """Predicted tokens per second per row for window k; None if a cost is unknown, or
        extrapolated to nothing (noisy timings can make the measured curve fall, and its
        extension reach zero; with a free drafter the step would cost nothing)."""
        verify = self.verify_time(rows, k + 1)
        draft = self.draft_seconds(rows, k)
        if verify is None or draft is None or draft + verify <= 0:
            return None
        return expected_tokens(alpha, k) / (draft + verify)

    def best_window(self, rows: int, alpha: list[float], k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over k = 0) maximising predicted tokens per second."""
        best_k, best = 0, 1.0
        for k in range(1, k_max + 1):
            speedup = predict_speedup(self, rows, alpha, k)
            if speedup is not None and speedup > best:
                best_k, best = k, speedup
        return best_k, best


# The least net saving worth a catch-up, as a share of the plain decoding still ahead: a
# start-up is a bet on estimates made before any draft token was seen (an optimistic prior
# acceptance, the draft's cost guessed from its weights), and in the sweep the starts
# predicted at 9-15% gave 0.89x-1.21x of plain, those at 23% and more 1.15x-2.5x.
STARTUP_MIN_GAIN = 0.2
# Once this engine has drafted, the bet is on its own measured acceptance and costs, and
# the bar drops to a little over the steady-state margin.
INFORMED_MIN_GAIN = 0.05
# A first look at the drafter: the catch-up may cost at most this share of the plain
# decoding ahead, divided by the rows (one row's drafts measure the acceptance as well as
# eight's): the most a look that finds speculation useless loses, besides a few k = 1
# steps. Only where a drafter that is always right would gain at least as much, net.
EXPLORE_SHARE = 0.1
# Drafted rows an earlier run's acceptance counts for at the first position when a fresh
# process starts from it: 8 steps at batch 1 (the window remembers ~50), so a workload
# unlike the last one outweighs it within a few steps of its own.
WARM_ACCEPTANCE_WEIGHT = 8.0
# A first look goes on at k = 1 until it has drafted this many rows at the first position
# (a batch the caller waits for as a whole counts as one), for as long as the drafter may
# still pay: its acceptance LOOK_Z standard errors above the estimate (`_look_may_pay`).
LOOK_DRAWS = 8.0
LOOK_Z = 1.0


def startup_pays(
    costs: CostModel,
    rows: int,
    alpha: list[float],
    k_max: int,
    catch_up_tokens: int,
    remaining: int,
    min_gain: float = STARTUP_MIN_GAIN,
) -> bool:
    """Whether starting to speculate repays the draft's catch-up of `catch_up_tokens`.

    The saving is `remaining` plain steps (the most tokens a row may still generate:
    the batch decodes at least that long) times the fraction of each step speculation
    saves, 1 - 1 / speedup, at the best window up to `k_max` the estimates allow: the
    window the controller will settle on, not the k = 1 step it starts with (priced at
    k = 1, a batch-1 start after a long prompt looked too dear, and a batch-4 start after
    256-token prompts was a bet on a 9% net gain). The cost is `catch_up_time`. The
    saving less the cost must be at least `min_gain` of the plain decoding still ahead:
    both are estimates, a run's timing noise is a few percent, and losing is worse than
    missing a small gain (4 rows x 256-token prompts, 64 tokens: a predicted 9% net gain,
    measured 0.96x-1.05x of plain). Costs not measured yet are estimated: the draft step
    as `draft_share` plain steps, a pass of k + 1 tokens per row from the plain step
    (`startup_verify_time`). True when nothing is known to price the catch-up
    with (no prefill timed)."""
    if catch_up_tokens <= 0 or k_max <= 0:
        return True
    cost = costs.catch_up_time(catch_up_tokens)
    plain = costs.verify_time(rows, 1)
    if cost is None or plain is None:
        return True
    prior = costs.draft_share(rows) * plain  # before the draft is timed
    speedup = 0.0
    for k in range(1, k_max + 1):
        verify = costs.startup_verify_time(rows, k + 1)
        draft = costs.draft_seconds(rows, k)
        step = (k * prior if draft is None else draft) + (verify if verify is not None else plain)
        if step > 0:
            speedup = max(speedup, expected_tokens(alpha, k) * plain / step)
    if speedup <= 1.0:
        return False
    ahead = remaining * plain  # plain decoding still ahead of the batch
    return ahead * (1 - 1 / speedup) - cost >= min_gain * ahead


def relative_cost(draft_model, target_model) -> float | None:
    """The draft's cost per token relative to the target's, by the bytes a one-token step
    reads: each projection in its most compact stored format (an int4 draft reads a
    quarter of its bf16 bytes; the parameter count missed that), other weights as they are,
    leaving out the embedding table and the vocabulary head (a prefill computes logits at
    one position per row, so those barely count). None if either is not a model."""
    sizes = []
    for model in (draft_model, target_model):
        if not hasattr(model, "named_modules"):
            return None
        sizes.append(_step_bytes(model))
    return sizes[0] / sizes[1] if sizes[1] else None


def _step_bytes(model) -> int:
    from specdec.kernels.linear import Linear  # here: the rest of this module needs no torch

    total = 0
    for name, module in model.named_modules():
        if "embed_tokens" in name or "lm_head" in name:
            continue
        if isinstance(module, Linear):
            total += module.stored_bytes()
        else:
            total += sum(p.nbytes for p in module.parameters(recurse=False))
    return total


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
    """`--speculate auto`: picks k each step from measured acceptance and costs, and checks
    that what it picked pays.

    - Plain decoding first (k = 0, FIRST_TIMINGS steps per batch size, the fastest kept):
      the step every window is priced against.
    - The window grows from k = 1: each step takes `best_window` over windows at most
      twice as wide as the widest pass timed at this batch size (k + 1 <= 2 * widest), so
      a wider window is only tried once the model, with costs it has measured, predicts
      it might pay. Where verification is compute-bound (a large batch) one cheap k = 1
      step shows that speculation cannot pay; nothing wider is ever paid for.
    - Speculation only starts where a window is predicted to be `margin` faster than
      plain decoding, so noise does not make it hurt; while drafting, any window
      predicted to pay is kept, and while fewer than LOOK_DRAWS rows have been drafted,
      k = 1 is kept wherever a drafter as good as the acceptance's upper bound would pay
      (`_look_may_pay`): a look's first draws and timings are too few to end it. Every
      `probe_every` steps it probes: while drafting, a window two longer than its choice
      and a plain step in turn (the plain step every window is priced against drifts on
      a shared host, and nothing else re-times it while drafting); k = 1 when
      speculation is off (twice as long a wait after each probe that leaves it off, and
      none while even a drafter that is always right could not pay; a probe that needs a
      lazy draft's catch-up is priced as a look), so acceptance that recovers and costs
      that change are noticed without paying for long or frequent probes.
    - A guard checks what speculation realised, whatever the model predicted: over each
      `guard_steps` speculative steps, the plain-decoding seconds of the tokens they
      emitted (tokens per row x the measured plain step) over the seconds they took. Below
      `floor`, speculation is off for `backoff` steps, twice as long each time it trips
      again, back to `backoff` once a check passes at 1.0 or better.

    Acceptance per position is estimated from decayed counts (each step's counts weigh
    `decay` times the previous ones: a memory of about 1 / (1 - decay) steps), shrunk
    towards the pooled rate, so one unlucky rejection at batch 1 does not swing the window.
    """

    MAX_BACKOFF = 512  # steps: even a window that keeps failing is retried now and then

    def __init__(
        self,
        k_max: int = 8,
        probe_every: int = 24,
        margin: float = 0.03,
        decay: float = 0.98,
        prior_weight: float = 4.0,
        guard_steps: int = 8,
        floor: float = 0.97,
        backoff: int = 32,
    ) -> None:
        self.k_max = k_max
        self.probe_every = probe_every
        self.margin = margin
        self.decay = decay
        self.prior_weight = prior_weight
        self.guard_steps, self.floor, self.backoff = guard_steps, floor, backoff
        self.costs = CostModel()
        self._reached: list[float] = []  # decayed count of rows that tested position i
        self._kept: list[float] = []  # ... and that kept it
        self._since_probe = 0
        self._probe_gap = probe_every  # steps between probes (doubles while off)
        self._saved = self._spent = 0.0  # guard: plain-step seconds emitted, seconds taken
        self._checked = 0  # speculative steps since the guard's last check
        self._off = 0  # steps left with speculation off (the guard tripped)
        self._next_backoff = backoff
        self._admissions = 0  # prefills observed: batches of requests admitted
        # (admissions, rows, catch-up, remaining) when `_may_start` last said no: it stands
        # until the next admission (see `_start_allowed`).
        self._refused: tuple[int, int, int, int] | None = None
        self._drafting = False  # the last step chosen drafted (see `_choose`'s bar)
        self._probing = False  # `_choose` returned a probe while speculation was off
        self._plain_probe = False  # the last step was a plain probe while drafting
        self._wider_probe = False  # a drafting window's probes alternate: wider, then plain
        self._unlooked_s = 0.0  # seconds of plain steps before the first look (then 0)

    @property
    def alpha(self) -> list[float]:
        """Conditional acceptance per draft position from decayed counts, shrunk towards
        the rate pooled over all positions: positions the window rarely reaches (it stays
        short when they look bad) borrow strength from the ones it reaches every step,
        instead of staying at an arbitrary prior.

        The pooled rate is taken one standard error optimistic: after two rejections at
        batch 1 (a 9% event at acceptance 0.7) the plain estimate, 0.25, would switch
        speculation off for a whole probe interval; the optimistic one keeps trying k = 1
        until the evidence is firm. At batch 16 one step's 16 rows make the bonus small."""
        pooled = _optimistic_rate(sum(self._kept), sum(self._reached), 1.0)
        weight = self.prior_weight
        return [
            (kept + weight * pooled) / (reached + weight)
            for kept, reached in zip(self._kept, self._reached, strict=True)
        ]

    def prior_alpha(self) -> list[float]:
        """`alpha`, or before anything was drafted the pooled prior it starts from."""
        return self.alpha or [_optimistic_rate(0, 0, 1.0)]

    def acceptance_state(self, weight: float = WARM_ACCEPTANCE_WEIGHT) -> dict:
        """The decayed acceptance counts, scaled so the first position counts at most
        `weight` drafted rows: what a later process starts from (`start_from`)."""
        scale = min(1.0, weight / self._reached[0]) if self._reached and self._reached[0] else 1.0
        return {
            "reached": [r * scale for r in self._reached],
            "kept": [k * scale for k in self._kept],
        }

    def start_from(self, state: dict) -> None:
        """Begin from an earlier run's acceptance (`acceptance_state`) instead of the
        generic prior: a weak start, which the run's own steps outweigh within a few."""
        reached, kept = list(map(float, state["reached"])), list(map(float, state["kept"]))
        if len(reached) != len(kept):
            raise ValueError("acceptance counts must pair up")
        if any(k < 0 or k > r * (1 + 1e-9) for k, r in zip(kept, reached, strict=True)):
            raise ValueError("acceptance counts must have 0 <= kept <= reached")
        self._reached, self._kept = reached, kept

    def choose(self, rows: int, catch_up: int = 0, remaining: int | None = None) -> int:
        """k for the next step of `rows` rows. `catch_up`: draft tokens the drafter must
        feed before it can draft (a lazy draft model's rows not caught up), `remaining`:
        the most tokens a row may still generate; a window that needs a catch-up is only
        started when `_may_start` says so."""
        resuming, self._plain_probe = self._plain_probe, False
        k = self._choose(rows)
        if k and catch_up and remaining is not None and not resuming:
            if self._probing:  # a probe is a look: bounded by its price alone
                k = k if self._cheap_look(rows, catch_up, remaining) else 0
            elif not self._start_allowed(rows, catch_up, remaining):
                k = 0
        self._drafting = k > 0 or self._plain_probe
        return k

    def _cheap_look(self, rows: int, catch_up: int, remaining: int) -> bool:
        """Whether a catch-up costs at most EXPLORE_SHARE of the plain decoding ahead and,
        before the drafter was first measured, of the plain steps decoded so far, per row:
        the most a look at the drafter (the first start, or a probe once it was switched
        off) may cost.

        The steps decoded before the first look count because a look refused is refused again
        at every request alike: SmolLM2 drafting for itself (quick preset, 32-token
        requests) priced each 19-22-token catch-up at 44-47 ms against 43-44 ms, 10% of
        one request's plain steps, so `auto` never drafted in four requests where k = 4
        ran 1.5x plain. Counting the plain steps already spent, a look is taken by the
        second such request, and what it costs stays a tenth of the decoding. Only until
        the drafter has been measured: a probe after a look that found it poor is bounded
        by the decoding ahead alone (drawing on the steps decoded since, probes paid a
        catch-up at every request, 0.93x plain over four requests at acceptance 0.5-0.67).

        The steps decoded before count only up to the decoding ahead: a look costs at most
        twice what one request's decoding allows. A catch-up dear against a request is paid
        again by every later request on its own prompt, so what such a look learns cannot
        pay; uncapped, the int4 pair on 1024-token prompts (64 tokens ahead, a 1.0 s
        catch-up) looked at a run's fourth request and ran 0.93x plain (AMX Xeon, stop 35)."""
        cost = self.costs.catch_up_time(catch_up)
        plain = self.costs.verify_time(rows, 1)
        if cost is None or plain is None:
            return False
        ahead = remaining * plain
        return cost <= EXPLORE_SHARE * (ahead + min(self._unlooked_s, ahead)) / rows

    def _start_allowed(self, rows: int, catch_up: int, remaining: int) -> bool:
        """`_may_start`, except that a refusal stands until the next admission or a change
        in the rows: until then each step only adds to the catch-up and takes from the
        tokens ahead, so pricing the start again would say no again. It cost 0.3 ms a step
        (2% of a SmolLM2 step) on every step of a run that never drafts."""
        last = self._refused
        if (
            last is not None
            and last[:2] == (self._admissions, rows)
            and catch_up >= last[2]
            and remaining <= last[3]
        ):
            return False
        if self._may_start(rows, catch_up, remaining):
            self._refused = None
            return True
        self._refused = (self._admissions, rows, catch_up, remaining)
        return False

    def _may_start(self, rows: int, catch_up: int, remaining: int) -> bool:
        """Whether to pay a catch-up of `catch_up` draft tokens now.

        Before this engine has drafted anything its acceptance is a prior, and a start is a
        bet `startup_pays` only takes at STARTUP_MIN_GAIN. That bar alone never lets a
        modest drafter start: the Qwen 1.5B int4 with its 0.5B int4 draft measured 1.10-1.13x
        on code at k = 2-3 (64 tokens, batch 1), but at the prior's acceptance no window
        clears 20%, so no request ever drafted and the acceptance was never learnt. So the
        first start is a look: taken where the catch-up is cheap (EXPLORE_SHARE of the
        plain decoding ahead, per row: 8 rows x 64-token prompts, which measured 0.89-1.05x
        of plain when started, do not look) and a drafter that is always right would gain
        at least that share, net (the int4 pair: 19% at best, under the cold bar);
        the steps after it measure the acceptance, and `_choose` turns the window off if it
        does not pay. The first request takes the look too: with the tile layout the int4
        pair ran 1.57x plain on code at k = 3, and waiting for the second request left a
        quarter of a 4-request run plain (`auto` 1.38x); what a look costs a request whose
        drafter is poor is bounded by EXPLORE_SHARE and a few k = 1 steps (8% at
        acceptance 0.5-0.67, simulated), and a process that stores its acceptance
        (`acceptance_state`) takes it once. Later starts are priced with what was
        measured, at INFORMED_MIN_GAIN."""
        if self._reached:  # drafted before: measured acceptance and draft costs
            return startup_pays(
                self.costs, rows, self.alpha, self.k_max, catch_up, remaining, INFORMED_MIN_GAIN
            )
        alpha = self.prior_alpha()
        if startup_pays(self.costs, rows, alpha, self.k_max, catch_up, remaining):
            return True
        if not self._cheap_look(rows, catch_up, remaining):
            return False
        always_right = [1.0] * self.k_max
        return startup_pays(
            self.costs, rows, always_right, self.k_max, catch_up, remaining, EXPLORE_SHARE
        )

    def _choose(self, rows: int) -> int:
        self._probing = False
        if self.costs.timed(rows, 1) < FIRST_TIMINGS:  # the reference: plain passes at rows
            return 0
        if self._off:  # the guard saw speculation lose: plain decoding for a while
            self._off -= 1
            return 0
        if self.costs.draft_time(rows) is None or not self._reached:
            return 1  # nothing drafted yet: the cheapest step that measures the drafter
        if self.costs.look_unsettled(rows):
            # A first look (or a stored cost) timed far above the plans' price: a second
            # look, priced as a probe, before those costs decide anything
            # (`CostModel.look_unsettled`). Two tokens wide, so that it re-times a draft
            # step's first token and the ones after it.
            self._probing = True
            return min(2, self.k_max)
        reach = min(self.k_max, 2 * self.costs.widest_measured(rows) - 1)
        k, speedup = self.costs.best_window(rows, self.alpha, reach)
        # The margin guards a start against noise; once drafting, a window predicted to
        # pay at all is kept (the guard still checks what it realises). Stopping is not
        # free with a lazy draft: starting again costs a catch-up, and a refused start
        # stands, so one early rejection at batch 1 (acceptance 0.8 measured as 1 of 2)
        # ended drafting for the rest of a chat request where k = 3 paid 1.07-1.26x.
        k = k if speedup > (1.0 if self._drafting else 1 + self.margin) else 0
        if not k and self._drafting and self._reached[0] < LOOK_DRAWS and self._look_may_pay(rows):
            return 1  # a look goes on while its few draws leave room for a drafter that pays
        if k:
            self._probe_gap = self.probe_every
        self._since_probe += 1
        if self._since_probe < self._probe_gap:
            return k
        # Probe one step with a slightly longer window: cheap, and it refreshes the
        # estimates the current choice depends on (k = 1 while speculation is off: the
        # cheapest step that still measures whether the first draft token is accepted;
        # each probe that finds it still off doubles the wait for the next).
        self._since_probe = 0
        if k:
            # Drafting, the probes alternate: a window two wider, and a plain step. The
            # plain step is the reference every window is priced against and the guard
            # judges by, and while drafting nothing else times it; on a shared host one
            # row's step drifts apart from the wider passes (the int4 1.5B's plain runs
            # read 26-39 tok/s in one bench while its k = 3 runs held at 34), so a
            # reference timed in a slow minute made a losing window look like a gain. The
            # step after it resumes drafting without start-up pricing: its catch-up is
            # the plain step's token, part of the probe.
            self._wider_probe = not self._wider_probe
            if self._wider_probe:
                return min(reach, k + 2)
            self._plain_probe = True
            return 0
        self._probe_gap = min(2 * self._probe_gap, self.MAX_BACKOFF)
        # No probe where even a drafter that is always right could not pay with the costs
        # measured at this batch size (a compute-bound batch): acceptance is not the
        # question there, and a probe would only cost. A probe that needs a catch-up is
        # priced as a look (`choose`): without that, a lazy draft switched off once never
        # drafted again in the request, its probes refused as starts that do not pay.
        ceiling = self.costs.best_window(rows, [1.0], reach)[1]
        self._probing = ceiling > 1 + self.margin
        return 1 if self._probing else 0

    def _look_may_pay(self, rows: int) -> bool:
        """Whether k = 1 pays by `margin` at the first position's acceptance LOOK_Z
        standard errors above its estimate: what a look that has drafted fewer than
        LOOK_DRAWS rows asks before it stops (`_choose`).

        A look's first step is one draw where the caller waits for a batch as a whole, and
        one timing of the draft step. At the sweep's bf16 256 x 4 point (the 0.5B int4
        draft, Xeon AMX, stop 56) two traced runs each rejected their look's one draw. One
        drafted on, its acceptance reading 0.46, then 0.30, then past 0.8. The other had
        timed its draft step while the host was slow (33 ms against 25-28), priced every
        window under 1.0x and stopped; every later start needed a catch-up that was
        refused, and `auto` read 0.93-0.96x plain (stop 57, going on: 1.03x, 2.4 tokens a
        step). Going on while the bound pays costs at most a few k = 1 steps near
        break-even; the bound shrinks with each draw, so a drafter that is poor stops
        within two or three (the simulated floor cases, `test_adaptive_window.py`), and
        the draft step's first FIRST_TIMINGS timings keep the fastest
        (`CostModel.observe_draft`)."""
        upper = _optimistic_rate(self._kept[0], self._reached[0], LOOK_Z)
        speedup = predict_speedup(self.costs, rows, [upper], 1)
        return speedup is not None and speedup > 1 + self.margin

    def observe(
        self,
        rows: int,
        k: int,
        verify_s: float,
        draft_s: float,
        drafted_at: list[int],
        accepted_at: list[int],
        draft_first_s: float | None = None,
        width: int | None = None,
        judged: int | None = None,
        progress: float | None = None,
    ) -> None:
        """Feed back one step: its timings (`draft_first_s`: of `draft_s`, the first
        draft token's, where the drafter times it), per position, the rows that tested and
        kept a draft token, and `width`, the verify pass's tokens per row where it was
        narrower than k + 1 (no row drafted that far): the pass is timed at its width.
        `judged`: the rows the counts are over, where not all `rows` (the engine counts
        the rows a batch waits for, `Engine._judged_rows`); the guard's tokens per row
        are theirs, 1 + their kept drafts, unless `progress` says how far the step took
        the batch (the engine: how far the most tokens left fell, `Engine._progress`)."""
        self.costs.observe_verify(rows, k + 1 if width is None else width, verify_s)
        self.costs.observe_draft(rows, k, draft_s, draft_first_s)
        grow = len(drafted_at) - len(self._reached)
        if grow > 0:
            self._reached += [0.0] * grow
            self._kept += [0.0] * grow
        for i, (d, a) in enumerate(zip(drafted_at, accepted_at, strict=True)):
            self._reached[i] = self.decay * self._reached[i] + d
            self._kept[i] = self.decay * self._kept[i] + a
        if k > 0:
            if progress is None:
                progress = 1 + sum(accepted_at) / (rows if judged is None else max(judged, 1))
            self._guard(rows, verify_s + draft_s, progress)
            self._unlooked_s = 0.0
        elif not self._reached:
            self.observe_plain_spent(verify_s)

    def observe_plain_spent(self, seconds: float) -> None:
        """A plain step before the drafter was ever measured: the first look may draw on
        it (`_cheap_look`)."""
        self._unlooked_s += seconds

    def observe_prefill(
        self, rows: int, tokens_per_row: int, tokens: int, seconds: float, fresh: bool = False
    ) -> None:
        """The target's prefill of admitted rows (see `CostModel.observe_prefill`).
        `fresh`: no row was live before them, so the batch is wholly new.

        A fresh batch forgets a guard's first trip (`_guard`): one losing stretch says the
        text at hand defeats the drafter, and that text is gone. At batch 1 on the bench's
        4 chat prompts the guard rightly tripped on the third (where k = 3 itself ran 0.8x
        plain), and its 32-64 steps off ran into the fourth, where k = 3 paid: a cold `auto`
        read 0.91x of k = 3 on chat (Xeon AMX, stop 36). A trip again before a check
        passes is evidence about the drafter or the costs, not one text, and stands."""
        self.costs.observe_prefill(rows, tokens_per_row, tokens, seconds)
        self._admissions += 1
        if fresh and self._next_backoff <= 2 * self.backoff:
            self._off = 0

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A lazy draft's catch-up pass, kept out of the draft step's cost and the guard:
        a one-off price `choose` already weighed before starting."""
        self.costs.observe_catch_up(tokens, seconds)

    def set_draft_ratio(self, ratio: float | None) -> None:
        """The draft's cost per token relative to the target's (`relative_cost`)."""
        self.costs.draft_ratio = ratio

    def set_plan_seconds(self, target: dict[int, float], draft: dict[int, float]) -> None:
        """The target's and the draft's projection seconds per pass width, from their
        kernel plans (`tuning.projection_seconds`; empty: unknown)."""
        self.costs.target_plan_s, self.costs.draft_plan_s = target, draft

    def _guard(self, rows: int, seconds: float, tokens_per_row: float) -> None:
        """Count one speculative step; every `guard_steps`, compare with plain decoding."""
        self._saved += tokens_per_row * (self.costs.verify_time(rows, 1) or 0.0)
        self._spent += seconds
        self._checked += 1
        if self._checked < self.guard_steps:
            return
        realised = self._saved / self._spent if self._spent > 0 else 1.0
        self._saved = self._spent = 0.0
        self._checked = 0
        if realised < self.floor:
            self._off = self._next_backoff
            self._next_backoff = min(2 * self._next_backoff, self.MAX_BACKOFF)
        elif realised >= 1.0:
            self._next_backoff = self.backoff


class FixedWindow:
    """`--speculate K`: always draft K tokens (0 = plain decoding)."""

    def __init__(self, k: int) -> None:
        self.k_max = k

    def choose(self, rows: int, catch_up: int = 0, remaining: int | None = None) -> int:
        return self.k_max

    def observe(self, *args, **kwargs) -> None:
        pass

    def observe_prefill(self, *args) -> None:
        pass

    def observe_catch_up(self, *args) -> None:
        pass

    def set_draft_ratio(self, ratio: float | None) -> None:
        pass

    def set_plan_seconds(self, target: dict[int, float], draft: dict[int, float]) -> None:
        pass
