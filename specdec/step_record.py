"""What a window sees of a step: the batch before it (`Batch`) and what it did (`StepRecord`).

The engine times and counts; the window (`specdec.window`) decides what counts. Both are
plain values, so a window can be driven by a simulation as well as by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """The next step's batch, as `Window.choose` sees it."""

    rows: int
    remaining: int = 0  # the most tokens any row may still generate
    catch_up: int = 0  # draft tokens a lazy drafter must feed before it can draft


@dataclass(frozen=True)
class StepRecord:
    """One decode step (or, with `prefilled`, one admission's prefill) as it ran.

    Per row (tuples of B): `drafted` the draft positions the row was asked for (the window
    capped by the row's tokens left; a tree: its deepest path), whether or not the drafter
    proposed them; `accepted` the drafts the target kept; `left` the tokens the row could
    still generate before the step and `left_after` after it (0 once finished). Seconds are
    wall time less one-off graph captures; `draft_s` excludes the catch-up pass.
    """

    rows: int
    k: int = 0  # the window chosen
    width: int = 1  # tokens per row of the verify pass (narrower than k + 1 when trimmed)
    drafted: tuple[int, ...] = ()  # [B]
    accepted: tuple[int, ...] = ()  # [B]
    left: tuple[int, ...] = ()  # [B]
    left_after: tuple[int, ...] = ()  # [B]
    whole_batch: bool = False  # the caller waits for the batch as a whole (`Engine.generate`)
    draft_s: float = 0.0
    first_s: float | None = None  # of draft_s, the first draft token's, where timed apart
    verify_s: float = 0.0
    catch_up_tokens: int = 0  # a lazy draft's catch-up pass in this step ...
    catch_up_s: float = 0.0  # ... and its seconds
    prefilled: tuple[int, ...] = ()  # [B] positions prefilled per admitted row (an admission)
    prefill_s: float = 0.0
    fresh: bool = False  # an admission into an empty batch
