"""The window policies: `FixedWindow` (`--speculate K`) and `AdaptiveWindow` (`auto`), a
state machine over measured costs and acceptance (docs/design/auto.md, "Controller")."""

from __future__ import annotations

from enum import Enum
from typing import Protocol, runtime_checkable

from specdec.types import Batch, StepRecord
from specdec.window import pricing
from specdec.window.acceptance import Acceptance, step_counts
from specdec.window.config import WindowConfig
from specdec.window.costs import CostModel, predict_speedup


class Window(Protocol):
    """The window contract: a k for the next step, and what each step (or prefill) did."""

    k_max: int

    def choose(self, batch: Batch) -> int: ...

    def observe(self, record: StepRecord) -> None: ...


@runtime_checkable
class PricesModels(Protocol):
    """A window that prices the target and a draft network before timing them."""

    def price_models(self, target, draft) -> None: ...


class FixedWindow:
    """`--speculate K`: always K (0 = plain decoding)."""

    def __init__(self, k: int) -> None:
        self.k_max = k

    def choose(self, batch: Batch) -> int:
        return self.k_max

    def observe(self, record: StepRecord) -> None:
        pass


class Phase(Enum):
    """What the last step chosen was, and so what the next may be."""

    WARM_UP = "warm-up"  # timing the plain step every window is priced against
    LOOK = "look"  # k = 1 steps that measure a drafter not yet known
    DRAFT = "drafting"  # the window the costs and acceptance say pays most
    PLAIN = "plain"  # no window pays (or a start's catch-up does not)
    OFF = "off"  # the guard saw drafting realise less than plain: backing off
    PROBE = "probe"  # k = 1 (or a second look) while not drafting, priced as a look
    WIDE_PROBE = "wide probe"  # while drafting: a window two wider than chosen
    PLAIN_PROBE = "plain probe"  # while drafting: re-times the plain step

    @property
    def drafting(self) -> bool:
        return self not in (Phase.WARM_UP, Phase.PLAIN, Phase.OFF)


class Guard:
    """Realised speed: plain-step seconds of the tokens emitted over the seconds spent,
    over a fading memory of about `evidence` steps, so one short loss in a stretch that
    pays does not stop drafting (docs/design/auto.md, "The guard")."""

    def __init__(self, config: WindowConfig) -> None:
        self.config = config
        self.saved, self.spent, self.checked = 0.0, 0.0, 0  # plain-step s, s, steps counted
        self.off = 0  # steps left with drafting off
        self.next_backoff = config.backoff
        self.fade = 1 - 1 / config.evidence  # a step's weight a step later: ~`evidence` steps

    def count(self, plain_s: float, seconds: float, tokens_per_row: float) -> None:
        c = self.config
        self.saved = self.fade * self.saved + tokens_per_row * plain_s
        self.spent = self.fade * self.spent + seconds
        self.checked += 1
        if self.checked < c.evidence:
            return
        self.checked = 0
        realised = self.saved / self.spent if self.spent > 0 else 1.0
        if realised < 1 - c.margin:
            self.saved = self.spent = 0.0  # judged afresh after the steps off
            self.off = self.next_backoff
            self.next_backoff = min(2 * self.next_backoff, c.max_backoff)
        elif realised >= 1.0:
            self.next_backoff = c.backoff


class AdaptiveWindow:
    """`auto`: the k maximising expected tokens per measured second (k = 0: plain), started
    only where it pays by `margin` (and repays a catch-up), checked by the guard."""

    def __init__(self, config: WindowConfig | None = None, **overrides) -> None:
        self.config = config = WindowConfig(**overrides) if config is None else config
        self.k_max = config.k_max
        self.costs = CostModel(config=config)
        self.acceptance = Acceptance(config)
        self.guard = Guard(config)
        self.phase = Phase.WARM_UP
        self._since_probe = 0
        self._probe_gap = config.probe_every  # doubles while off
        self._wide_next = False  # drafting probes alternate: wider, then plain
        self._admissions = 0
        self._refused: tuple | None = None  # (admissions, rows, catch-up, remaining) refused
        self._unlooked_s = 0.0  # plain seconds before the first look (then 0)

    def price_models(self, target, draft) -> None:
        """What prices a pass before it is timed: the bytes a draft step reads over the
        target's, and both models' kernel plans."""
        from specdec.kernels.tuning import projection_seconds  # the kernels' own timings
        from specdec.models.footprint import step_bytes

        draft_bytes, target_bytes = step_bytes(draft), step_bytes(target)
        ratio = draft_bytes / target_bytes if draft_bytes is not None and target_bytes else None
        self.costs.set_prices(ratio, projection_seconds(target), projection_seconds(draft))

    def choose(self, batch: Batch) -> int:
        """k for the next step; a step that needs a catch-up only where it is repaid."""
        resuming = self.phase is Phase.PLAIN_PROBE  # its catch-up was the probe's token
        phase, k = self._next(batch.rows)
        if k and batch.catch_up and not resuming:  # a probe is priced as a look
            allowed = self._cheap_look if phase is Phase.PROBE else self._start_allowed
            k = k if allowed(batch) else 0
        self.phase = (
            Phase.PLAIN if not k and phase.drafting and phase is not Phase.PLAIN_PROBE else phase
        )
        return k

    def _next(self, rows: int) -> tuple[Phase, int]:
        """Every transition of `auto`, from the last phase and what is measured."""
        c, costs = self.config, self.costs
        if costs.timed(rows, 1) < c.first_timings:
            return Phase.WARM_UP, 0
        if self.guard.off:
            self.guard.off -= 1
            return Phase.OFF, 0
        if costs.draft_time(rows) is None or not self.acceptance.reached:
            return Phase.LOOK, 1
        if costs.look_unsettled(rows):
            return Phase.PROBE, min(2, c.k_max)  # a second look: a timing was one-off setup
        reach = min(c.k_max, 2 * costs.widest_measured(rows) - 1)  # at most twice the widest timed
        k, speedup = costs.best_window(rows, self.acceptance.alpha, reach, self.acceptance.fill)
        drafting = self.phase.drafting
        k = k if speedup > (1.0 if drafting else 1 + c.margin) else 0
        looking = drafting and self.acceptance.reached[0] < c.evidence  # a look's few draws ...
        if not k and looking and self._look_may_pay(rows):
            return Phase.LOOK, 1  # ... leave room for a drafter that pays
        if k:
            self._probe_gap = c.probe_every
        self._since_probe += 1
        if self._since_probe < self._probe_gap:
            return (Phase.DRAFT, k) if k else (Phase.PLAIN, 0)
        self._since_probe = 0
        if k:
            self._wide_next = not self._wide_next
            return (
                (Phase.WIDE_PROBE, min(reach, k + 2)) if self._wide_next else (Phase.PLAIN_PROBE, 0)
            )
        self._probe_gap = min(2 * self._probe_gap, c.max_backoff)
        ceiling = costs.best_window(rows, [1.0], reach)[1]  # a drafter that is always right
        return (Phase.PROBE, 1) if ceiling > 1 + c.margin else (Phase.PLAIN, 0)

    def _look_may_pay(self, rows: int) -> bool:
        """Whether k = 1 pays by `margin` at the first position's optimistic bound."""
        speedup = predict_speedup(self.costs, rows, [self.acceptance.first_bound()], 1)
        return speedup is not None and speedup > 1 + self.config.margin

    def _cheap_look(self, batch: Batch) -> bool:
        """Whether a catch-up costs at most `explore_share` of the plain decoding ahead
        (plus, before the first look, the plain steps spent, up to as much), per row."""
        cost = pricing.catch_up_time(self.costs, batch.catch_up)
        plain = self.costs.verify_time(batch.rows, 1)
        if cost is None or plain is None:
            return False
        ahead = batch.remaining * plain
        return (
            cost <= self.config.explore_share * (ahead + min(self._unlooked_s, ahead)) / batch.rows
        )

    def _start_allowed(self, batch: Batch) -> bool:
        """`_may_start`, a refusal standing until an admission or a change of rows."""
        last = self._refused
        if (last is not None and last[:2] == (self._admissions, batch.rows)
                and batch.catch_up >= last[2] and batch.remaining <= last[3]):  # fmt: skip
            return False
        if self._may_start(batch):
            self._refused = None
            return True
        self._refused = (self._admissions, batch.rows, batch.catch_up, batch.remaining)
        return False

    def _may_start(self, batch: Batch) -> bool:
        """Measured acceptance: a start nets half `explore_share`. Before any: twice it at the
        prior, or a cheap look where an always-right drafter nets `explore_share`."""
        c = self.config

        def pays(alpha: list[float], gain: float) -> bool:
            return pricing.startup_pays(self.costs, batch, alpha, c.k_max, gain)

        if self.acceptance.reached:
            return pays(self.acceptance.alpha, c.explore_share / 2)
        if pays(self.acceptance.prior(), 2 * c.explore_share):
            return True
        return self._cheap_look(batch) and pays([1.0] * c.k_max, c.explore_share)

    def observe(self, record: StepRecord) -> None:
        """Feed back one step (its timings and counts) or one admission's prefill."""
        if record.prefilled:
            pricing.observe_prefill(self.costs, record.prefilled, record.prefill_s)
            self._admissions += 1
            if record.fresh and self.guard.next_backoff <= 2 * self.config.backoff:
                self.guard.off = 0  # a new batch forgets a first trip: that text is gone
            return
        rows, k = record.rows, record.k
        pricing.observe_catch_up(self.costs, record.catch_up_tokens, record.catch_up_s)
        self.costs.observe_verify(rows, record.width, record.verify_s)
        self.costs.observe_draft(rows, k, record.draft_s, record.first_s)
        reached, kept, _, progress = step_counts(record)
        self.acceptance.add(reached, kept)
        if k > 0:
            self.acceptance.add_width(k, record.width)
            plain = self.costs.verify_time(rows, 1) or 0.0
            self.guard.count(plain, record.verify_s + record.draft_s, progress)
            self._unlooked_s = 0.0
        elif not self.acceptance.reached:
            self._unlooked_s += record.verify_s

    def acceptance_state(self) -> dict:
        return self.acceptance.state()

    def start_from(self, state: dict) -> None:
        self.acceptance.start_from(state)
