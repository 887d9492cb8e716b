"""Start-up pricing, which only a lazy draft model needs: whether the rows' remaining
tokens repay the draft's catch-up on their history (docs/design/auto.md, "Start-up")."""

from __future__ import annotations

from statistics import StatisticsError, linear_regression

from specdec.types import Batch
from specdec.window.costs import CostModel, by_total, expected_tokens, interpolate

CATCH_UP_WIDTHS = 32  # catch-up pass widths kept, the most recent: a bound on memory


def observe_prefill(costs: CostModel, lengths: tuple[int, ...], seconds: float) -> None:
    """The target's prefill of rows of `lengths` positions: until a catch-up is timed, the
    only view of how a many-token pass costs."""
    tokens = sum(lengths)
    if tokens <= 0:
        return
    table = costs.prefill_pass_s.setdefault(len(lengths), {})
    width = max(lengths)
    table[width] = costs._merge(table.get(width), seconds, False)
    costs.prefill_token_s = costs._merge(costs.prefill_token_s, seconds / tokens, False)


def observe_catch_up(costs: CostModel, tokens: int, seconds: float) -> None:
    """A draft catch-up pass: `tokens` history tokens fed in `seconds`."""
    if tokens > 0:
        passes = costs.catch_up_pass_s
        passes[tokens] = costs._merge(passes.pop(tokens, None), seconds, False)  # newest last
        if len(passes) > CATCH_UP_WIDTHS:
            del passes[next(iter(passes))]


def _line(table: dict[int, float], x: int) -> float:
    """Least-squares a + b x at x (a pass: every weight read once, plus a part per token);
    seconds per token where the points do not rise."""
    try:
        slope, intercept = linear_regression(list(table), list(table.values()))
    except StatisticsError:  # one width timed
        slope = intercept = 0.0
    if slope <= 0:
        return x * sum(table.values()) / sum(table)
    return max(0.0, intercept + slope * x)


def catch_up_time(costs: CostModel, tokens: int) -> float | None:
    """Seconds to catch up on `tokens`: the timed catch-up passes' line, else the target's
    prefill per token times the draft's share."""
    if costs.catch_up_pass_s:
        return _line(costs.catch_up_pass_s, tokens)
    if costs.prefill_token_s is None:
        return None
    return tokens * costs.prefill_token_s * costs.draft_share(tokens)


def startup_verify_time(costs: CostModel, rows: int, tokens_per_row: int) -> float | None:
    """`verify_time`, except while one width is timed at `rows` (the plain step): then
    grown as the target's plans grow, else along its prefill passes by total tokens."""
    own = costs.verify_s.get(rows, {})
    if len(own) != 1 or tokens_per_row in own:
        return costs.verify_time(rows, tokens_per_row)
    ((t0, s0),) = own.items()
    s0 *= costs.pace
    grown, timed = (interpolate(costs.target_plan_s, rows * t) for t in (tokens_per_row, t0))
    if grown and timed:
        return s0 * max(1.0, grown / timed)
    if not costs.prefill_pass_s:
        return costs.verify_time(rows, tokens_per_row)
    totals = by_total(costs.prefill_pass_s, rows) | {rows * t0: s0}
    return max(interpolate(totals, rows * tokens_per_row), s0)


def startup_pays(
    costs: CostModel, batch: Batch, alpha: list[float], k_max: int, min_gain: float
) -> bool:
    """Whether the batch's remaining plain steps x (1 - 1 / best speedup) less its catch-up's
    cost is at least `min_gain` of the plain decoding ahead (unknown costs: True)."""
    rows = batch.rows
    if batch.catch_up <= 0 or k_max <= 0:
        return True
    cost, plain = catch_up_time(costs, batch.catch_up), costs.verify_time(rows, 1)
    if cost is None or plain is None:
        return True
    prior = costs.draft_share(rows) * plain  # a draft token before the draft is timed
    speedup = 0.0
    for k in range(1, k_max + 1):
        draft, verify = costs.draft_seconds(rows, k), startup_verify_time(costs, rows, k + 1)
        step = (k * prior if draft is None else draft) + (plain if verify is None else verify)
        if step > 0:
            speedup = max(speedup, expected_tokens(alpha, k) * plain / step)
    ahead = batch.remaining * plain
    return speedup > 1.0 and ahead * (1 - 1 / speedup) - cost >= min_gain * ahead
