"""How long a load may spend timing kernels, and the progress bar that shows it.

A first load on a machine starts from predicted plans (`kernel_plans`) and measures the
choices a rule leaves uncertain while the process's budget lasts: `SPECDEC_TUNE_BUDGET`
seconds (default 60, about what the default int4 pair needs for its uncertain choices on
two cores; 0: predicted plans only, nothing timed). The budget is the process's, shared by
the target and the draft (the target loads first, so its choices are measured first). A
step starts only while some budget is left, so a load overshoots by at most one step.
Whatever stays predicted is stored as such and measured by a later load's budget.

The steps show as one tqdm bar on stderr (what is being timed, steps left, an ETA), off
where stderr is no terminal or `SPECDEC_PROGRESS=0` (the CLI sets it under --json); then
one status line says what is being timed, as before.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from tqdm import tqdm

DEFAULT_BUDGET_S = 60.0

_spent = 0.0  # seconds this process has measured so far
_bar: tqdm | None = None


def budget_s() -> float:
    """The process's tuning budget in seconds (`SPECDEC_TUNE_BUDGET`)."""
    from specdec.errors import InvalidParameterError

    raw = os.environ.get("SPECDEC_TUNE_BUDGET", "")
    if not raw:
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        raise InvalidParameterError(
            f"SPECDEC_TUNE_BUDGET={raw!r}: expected seconds (0: predicted plans only)"
        ) from None
    if value < 0:
        raise InvalidParameterError(f"SPECDEC_TUNE_BUDGET={raw!r}: must be >= 0")
    return value


def left_s() -> float:
    return max(0.0, budget_s() - _spent)


def allows() -> bool:
    """Whether a measurement may start now (some of the budget is left)."""
    return left_s() > 0


def spent_s() -> float:
    return _spent


def reset() -> None:
    """Start the budget afresh (tests; a process that loads another pair)."""
    global _spent
    _spent = 0.0


def progress_enabled() -> bool:
    if os.environ.get("SPECDEC_PROGRESS", "1") == "0":
        return False
    return sys.stderr.isatty()


def plan_steps(total: int, what: str) -> None:
    """Announce `total` measurements about to be tried for `what` (a model's tuning): opens
    the bar, or one status line where the bar is off."""
    global _bar
    if total <= 0:
        return
    if progress_enabled():
        if _bar is None:
            _bar = tqdm(total=0, desc="tuning kernels", unit="step", file=sys.stderr, leave=False)
        _bar.total += total
        _bar.refresh()
    else:
        from specdec.console import status

        if allows():
            status(
                f"timing up to {total} kernel choice(s) of {what} on this machine, within "
                f"{left_s():.0f} s (SPECDEC_TUNE_BUDGET; 0: the plans predicted for its CPU)"
            )
        else:
            status(f"{total} kernel choice(s) of {what} on the plans predicted for this CPU")


@contextmanager
def measuring(what: str):
    """Time one measurement against the budget, shown on the bar as `what`."""
    global _spent
    if _bar is not None:
        _bar.set_postfix_str(f"{what} (budget left {left_s():.0f} s)", refresh=True)
    start = time.perf_counter()
    try:
        yield
    finally:
        _spent += time.perf_counter() - start
        if _bar is not None:
            _bar.update(1)


def skipped(n: int = 1) -> None:
    """`n` planned steps left predicted (the budget ran out): the bar moves past them."""
    if _bar is not None:
        _bar.update(n)


def close() -> None:
    """Close the bar (after a load's tuning)."""
    global _bar
    if _bar is not None:
        _bar.close()
        _bar = None
