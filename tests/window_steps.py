"""Drive a window with per-position counts, as simulations of a host count them."""

from specdec.types import Batch, StepRecord
from specdec.window import pricing


def counted(
    rows, k, verify_s, draft_s, reached, kept, first_s=None, width=None, progress=None
) -> StepRecord:
    """The step whose rows tested position i `reached[i]` times and kept it `kept[i]`; with
    `progress`, a batch the caller waits for, its tied rows all `progress` tokens on."""
    timings = dict(draft_s=draft_s, first_s=first_s, verify_s=verify_s)
    width = k + 1 if width is None else width
    if progress is not None:
        n, left = len(reached), 1 << 30
        return StepRecord(
            rows, k, width, drafted=(n,) * rows, accepted=(progress - 1,) * rows,
            left=(left,) * rows, left_after=(left - progress,) * rows, whole_batch=True,
            **timings,
        )  # fmt: skip
    drafted, accepted, n = [], [], len(reached)
    reached = [min(r, kept[i - 1]) if i else r for i, r in enumerate(reached)]  # possible ones
    for i in range(n):
        rejected = reached[i] - kept[i]
        after = reached[i + 1] if i + 1 < n else 0
        stopped = max(0, kept[i] - after)  # kept i, drafted no further
        drafted += [i + 1] * (rejected + stopped)
        accepted += [i] * rejected + [i + 1] * stopped
    assert len(drafted) <= rows, (reached, kept)
    rest = [0] * (rows - len(drafted))
    return StepRecord(
        rows, k, width, drafted=tuple(drafted + rest), accepted=tuple(accepted + rest),
        left=(1 << 30,) * rows, left_after=(1 << 30,) * rows, **timings,
    )  # fmt: skip


def feed(window, rows, k, verify_s, draft_s, reached, kept, draft_first_s=None, progress=None):
    step = counted(rows, k, verify_s, draft_s, reached, kept, draft_first_s, None, progress)
    window.observe(step)


def pick(window, rows, catch_up=0, remaining=0) -> int:
    return window.choose(Batch(rows, remaining, catch_up))


def prefilled(rows, tokens_per_row, tokens, seconds, fresh=False) -> StepRecord:
    """An admission of `rows` prompts, the longest `tokens_per_row`, `tokens` in all."""
    rest = tokens - tokens_per_row
    lengths = [tokens_per_row] + [rest // (rows - 1) if rows > 1 else 0] * (rows - 1)
    lengths[-1] += tokens - sum(lengths)
    return StepRecord(rows, prefilled=tuple(lengths), prefill_s=seconds, fresh=fresh)


def feed_prefill(window, *args) -> None:
    window.observe(prefilled(*args))


def feed_catch_up(window, tokens, seconds) -> None:
    """A catch-up pass (a `StepRecord`'s `catch_up_tokens`, `catch_up_s`) on its own."""
    if hasattr(window, "costs"):
        pricing.observe_catch_up(window.costs, tokens, seconds)


def price(window, target_plans=None, draft_plans=None, ratio=None) -> None:
    """The kernel plans' seconds and the bytes' ratio, as `price_models` sets them (a fixed
    window prices nothing)."""
    costs = getattr(window, "costs", None)
    if costs is None:
        return
    if target_plans is None:
        target_plans, draft_plans = costs.target_plan_s, costs.draft_plan_s
    costs.set_prices(costs.draft_ratio if ratio is None else ratio, target_plans, draft_plans or {})
