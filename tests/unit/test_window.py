"""`auto` as docs/design/auto.md states it, on a simulated host whose best window is known:
the phases it goes through, the window it drafts, the guard and probes, catch-up pricing
and the warm start. (`test_adaptive_window.py` holds the measured cases behind each.)"""

import random

import pytest

from specdec.errors import InvalidParameterError
from specdec.types import Batch, StepRecord
from specdec.window import AdaptiveWindow, CostModel, FixedWindow, Phase, WindowConfig, pricing
from specdec.window.acceptance import step_counts
from specdec.window.costs import expected_tokens


def run(window, a, c, v, steps=300, rows=1, seed=0):
    """`steps` steps on a host where a draft token costs c plain steps, a pass of T tokens
    a row v(T), and each draft position is kept with probability a until a rejection:
    (phases, windows) chosen and tokens per plain step realised."""
    rng = random.Random(seed)
    phases, ks, tokens, seconds = [], [], 0, 0.0
    for _ in range(steps):
        k = window.choose(Batch(rows, remaining=1000))
        accepted = tuple(next((i for i in range(k) if rng.random() >= a), k) for _ in range(rows))
        record = StepRecord(rows, k, k + 1, drafted=(k,) * rows, accepted=accepted,
                            left=(1000,) * rows, left_after=(999,) * rows,
                            draft_s=c * k, verify_s=v(k + 1))  # fmt: skip
        window.observe(record)
        phases.append(window.phase if isinstance(window, AdaptiveWindow) else None)
        ks.append(k)
        tokens += 1 + sum(accepted) / rows
        seconds += record.draft_s + record.verify_s
    return phases, ks, tokens / seconds


def cheap_verify(t):
    return 1 + 0.02 * (t - 1)


def test_the_phases_run_warm_up_look_then_drafting():
    phases, ks, _ = run(AdaptiveWindow(), a=0.9, c=0.1, v=cheap_verify, steps=40)
    first = WindowConfig().first_timings
    assert phases[:first] == [Phase.WARM_UP] * first and ks[:first] == [0] * first
    assert phases[first] is Phase.LOOK and ks[first] == 1
    assert phases[-1] in (Phase.DRAFT, Phase.WIDE_PROBE, Phase.PLAIN_PROBE)


def test_drafts_the_window_that_maximises_the_modelled_speed():
    a, c = 0.8, 0.2
    best = max(range(9), key=lambda k: expected_tokens([a], k) / (k * c + cheap_verify(k + 1)))
    _, ks, rate = run(AdaptiveWindow(), a, c, cheap_verify)
    settled = max(set(ks[100:]), key=ks[100:].count)
    assert abs(settled - best) <= 1
    assert rate > 0.9 * expected_tokens([a], best) / (best * c + cheap_verify(best + 1))


@pytest.mark.parametrize("a,c,v,rows", [(0.3, 0.5, cheap_verify, 1), (0.8, 0.2, lambda t: t, 16)])
def test_chooses_plain_when_drafting_cannot_pay(a, c, v, rows):
    """A poor drafter, or a compute-bound batch (a pass of T tokens costs T plain steps)."""
    _, ks, rate = run(AdaptiveWindow(), a, c, v, rows=rows)
    assert ks[50:].count(0) > 0.9 * len(ks[50:]) and rate > 0.95


def test_the_guard_turns_drafting_off_until_its_back_off_ends():
    w = AdaptiveWindow(guard_steps=4, backoff=5, probe_every=4)
    for _ in range(3):  # plain: 1 s a token
        w.observe(StepRecord(1, 0, 1, drafted=(0,), accepted=(0,), left=(99,), verify_s=1.0))

    def step(k, seconds, kept):
        w.observe(StepRecord(1, k, k + 1, drafted=(k,), accepted=(kept,), left=(99,),
                             left_after=(98,), draft_s=0.1 * k, verify_s=seconds))  # fmt: skip

    w.acceptance.reached, w.acceptance.kept = [100.0] * 2, [100.0] * 2  # the model: pays
    for _ in range(4):  # what is realised: one token in 2 s
        k = w.choose(Batch(1, 99))
        assert k > 0
        step(k, 1.8, 0)
        w.acceptance.reached, w.acceptance.kept = [100.0] * 2, [100.0] * 2
    assert w.choose(Batch(1, 99)) == 0 and w.phase is Phase.OFF
    while w.phase is Phase.OFF:
        w.choose(Batch(1, 99))
    assert w.phase.drafting  # back on once the back-off is over


def test_a_probe_while_off_looks_again():
    """Acceptance that recovers is noticed: plain for a while, then k = 1 probes."""
    w = AdaptiveWindow(probe_every=4)
    _, ks, _ = run(w, a=0.05, c=0.3, v=cheap_verify, steps=60)
    assert ks[-20:].count(0) >= 15 and 1 in ks[20:]  # off, with probes
    _, ks, _ = run(w, a=0.95, c=0.1, v=cheap_verify, steps=200, seed=1)
    assert max(ks[-50:]) >= 3  # a good drafter again: drafting


def test_a_catch_up_is_paid_only_where_the_tokens_left_repay_it():
    w = AdaptiveWindow()
    for _ in range(3):
        w.observe(StepRecord(1, 0, 1, drafted=(0,), accepted=(0,), left=(99,), verify_s=0.04))
    w.observe(StepRecord(1, prefilled=(1000,), prefill_s=2.0, fresh=True))  # 2 ms a token
    w.costs.draft_ratio = 0.25
    assert pricing.catch_up_time(w.costs, 1000) == pytest.approx(0.5)  # 1,000 x 2 ms x 0.25
    assert w.choose(Batch(1, remaining=8, catch_up=1000)) == 0  # 8 steps cannot repay 0.5 s
    w2 = AdaptiveWindow()
    w2.costs, w2.costs.draft_ratio = w.costs, 0.25
    assert w2.choose(Batch(1, remaining=4000, catch_up=40)) == 1  # a long generation repays it


def test_a_timed_catch_up_is_a_fixed_part_plus_a_part_per_token():
    costs = CostModel()
    for tokens, seconds in [(2, 0.025), (16, 0.069), (47, 0.131)]:
        pricing.observe_catch_up(costs, tokens, seconds)
    assert pricing.catch_up_time(costs, 46) == pytest.approx(0.131, rel=0.1)


def test_a_warm_start_drafts_from_the_stored_costs_and_acceptance():
    cold = AdaptiveWindow()
    run(cold, a=0.9, c=0.1, v=cheap_verify, steps=100)
    warm = AdaptiveWindow()
    warm.costs = CostModel.from_json(cold.costs.to_json())
    warm.start_from(cold.acceptance_state())
    assert sum(warm.acceptance.reached[:1]) <= WindowConfig().look_draws
    _, ks, _ = run(warm, a=0.9, c=0.1, v=cheap_verify, steps=3)
    assert ks[0] >= 2  # no warm-up, no look: the window the stored measurements say


def test_which_rows_count():
    """Every row on its own; a batch the caller waits for as far as its longest rows went."""
    step = StepRecord(2, 1, 2, drafted=(1, 1), accepted=(1, 0), left=(9, 9), left_after=(7, 8))
    assert step_counts(step) == ([2], [1], 2, 1.5)
    whole = StepRecord(2, 1, 2, drafted=(1, 1), accepted=(1, 0), left=(9, 9),
                       left_after=(7, 8), whole_batch=True)  # fmt: skip
    assert step_counts(whole) == ([1], [0], 1, 1)


def test_a_fixed_window_and_a_bad_config():
    assert FixedWindow(3).choose(Batch(4)) == 3
    with pytest.raises(InvalidParameterError):
        WindowConfig(guard_steps=0)
