"""`auto` as docs/design/auto.md states it: the cost curves, acceptance, the phases and their
transitions, the floor guard, the pricing of a draft model's start and catch-up, and the warm
start. Whole runs are simulated on hosts whose costs are known (costs in plain steps)."""

import itertools
import random

import pytest
from window_steps import counted, feed, feed_catch_up, feed_prefill, pick, price

from specdec.errors import InvalidParameterError
from specdec.types import Batch, StepRecord
from specdec.window import (
    AdaptiveWindow,
    CostModel,
    FixedWindow,
    Phase,
    WindowConfig,
    controller,
    pricing,
    startup_pays,
)
from specdec.window import costs as costs_module
from specdec.window.acceptance import step_counts
from specdec.window.costs import expected_tokens

FIRST_TIMINGS = WindowConfig().first_timings
BLIND = 2 * WindowConfig().explore_share  # the gain a start needs before any draft is seen
PLAIN = lambda: FixedWindow(0)  # noqa: E731


def one_step(rng, a, k, done, tokens):
    """One step of window k on rows that have generated `done` of `tokens` each (updated in
    place), each draft kept with probability a until the first rejection, no row drafting
    past its end: the per-position counts (reached, kept)."""
    reached, kept = [0] * k, [0] * k
    for r, n in enumerate(done):
        run, accepted = True, 0
        for i in range(min(k, max(0, tokens - n - 1))):
            if not run:
                break
            reached[i] += 1
            run = rng.random() < a
            kept[i] += run
            accepted += run
        done[r] = min(tokens, n + accepted + 1)
    return reached, kept


def steps(c, verify):
    """A host where a draft token costs c and a pass of T tokens a row verify(T, context)."""
    return lambda k, n, context: (verify(k + 1, context), c * k)


def decode(window, a, cost, rows=1, tokens=64, prompt=64, seeds=range(6), trace=None):
    """Tokens per second of `rows` requests of `tokens` each, every step counted, summed over
    `seeds`: step n of window k costs `cost(k, n, context)` = (verify s, draft s). With
    `trace`, each step's (phase, k) is appended to it."""
    total_tokens, total_s = 0, 0.0
    for seed in seeds:
        rng, w, done = random.Random(seed), window(), [0] * rows
        for n in itertools.count():
            if min(done) >= tokens:
                break
            k = pick(w, rows)
            if trace is not None:
                trace.append((getattr(w, "phase", None), k))
            reached, kept = one_step(rng, a, k, done, tokens)
            verify_s, draft_s = cost(k, n, prompt + sum(done) // rows)
            feed(w, rows, k, verify_s, draft_s, reached, kept)
            total_s += verify_s + draft_s
        total_tokens += rows * tokens
    return total_tokens / total_s


def best_fixed(a, cost, ks=range(9), **run):
    return max(decode(lambda k=k: FixedWindow(k), a, cost, **run) for k in ks)


def warmed(plain_s, rows=1, **config) -> AdaptiveWindow:
    """A window past its warm-up: `first_timings` plain steps of `plain_s` at `rows`."""
    w = AdaptiveWindow(**config)
    for _ in range(FIRST_TIMINGS):
        feed(w, rows, 0, plain_s, 0.0, [], [])
    return w


# ---- The model and its costs -------------------------------------------------------------


def cheap(t, ctx=0):  # a pass of t tokens a row: 2% a token dearer than a plain step
    return 1 + 0.02 * (t - 1)


def test_after_warm_up_and_a_look_the_window_maximises_the_modelled_speed():
    assert expected_tokens([0.5, 1.0], 2) == 1 + 0.5 + 0.5 and expected_tokens([], 3) == 1
    a, c = 0.8, 0.2
    best = max(range(9), key=lambda k: expected_tokens([a], k) / (k * c + cheap(k + 1)))
    trace = []
    rate = decode(AdaptiveWindow, a, steps(c, cheap), tokens=600, seeds=[0], trace=trace)
    phases, ks = [p for p, _ in trace], [k for _, k in trace[100:]]
    assert phases[:FIRST_TIMINGS] == [Phase.WARM_UP] * FIRST_TIMINGS
    assert trace[FIRST_TIMINGS] == (Phase.LOOK, 1)
    assert {Phase.WIDE_PROBE, Phase.PLAIN_PROBE} <= set(phases)  # probes while drafting
    assert phases[-1] in (Phase.DRAFT, Phase.WIDE_PROBE, Phase.PLAIN_PROBE)
    assert abs(max(set(ks), key=ks.count) - best) <= 1
    assert rate > 0.9 * expected_tokens([a], best) / (best * c + cheap(best + 1))


def test_a_verify_curve_rises_and_predicts_nothing_from_zero_seconds():
    """A narrower pass never costs more than a wider one (noisy wall times: v(2) below
    v(1)); a pass timed at 0 s (a coarse clock) predicts nothing."""
    costs = CostModel.measured(1, {0: 0.010, 1: 0.012, 2: 0.006}, 0.0)
    assert [costs.verify_time(1, t) for t in (1, 2, 3, 9)] == [0.006] * 4
    assert costs.predict(1, [1.0], 4) == pytest.approx(5 / 0.006)
    rising = CostModel.measured(1, {0: 0.010, 1: 0.012, 2: 0.015}, 0.0)
    assert [rising.verify_time(1, t) for t in (1, 2, 3)] == [0.010, 0.012, 0.015]
    zero = CostModel.measured(1, {0: 0.010, 1: 0.0}, 0.0)
    assert zero.predict(1, [1.0], 1) is None and zero.best_window(1, [1.0], 8) == (0, 1.0)
    stale = CostModel()  # a plain step timed slow at the start, wider passes for a while
    for seconds in (0.048, 0.035):
        stale.observe_verify(1, 1, seconds)
    for _ in range(20):
        stale.observe_verify(1, 2, 0.027)
    assert stale.verify_time(1, 1) == pytest.approx(stale.verify_time(1, 2))
    assert stale.verify_time(1, 1) <= 0.0275


# The int4 Qwen 1.5B's projection seconds per pass width (`projection_seconds`, Xeon AMX)
# over its one-row pass: flat to 4 rows, compute-bound past them, and noisy.
INT4_PLANS = {1: 1.0, 2: 0.949, 4: 0.975, 8: 1.302, 16: 2.425, 32: 4.101, 64: 3.889, 256: 9.88}


def test_a_wider_pass_grows_at_least_as_the_projections_do():
    """4 rows x 1,024 int4 on a busy host: plain steps timed at 1.1 s and a 2-token pass at
    0.52 s flattened the curve and every window looked free. With the kernel plans a wider
    pass costs at least their growth (less the part of a pass they leave out); a curve that
    rises faster than the plans stands as timed."""
    costs = CostModel(target_plan_s=INT4_PLANS)
    for seconds in (1.117, 1.103):
        costs.observe_verify(4, 1, seconds)
    costs.observe_verify(4, 2, 0.522)
    least = 1 + WindowConfig().projection_share * (1.302 - 1)  # 8 rows over 4
    assert costs.verify_time(4, 2) == pytest.approx(0.522)
    assert costs.verify_time(4, 2) / costs.verify_time(4, 1) == pytest.approx(least)
    assert costs.verify_time(4, 4) / costs.verify_time(4, 1) > least
    flat = CostModel()  # without plans: the rising envelope alone
    for seconds in (1.117, 1.103, 0.522):
        flat.observe_verify(4, 1 if seconds > 1 else 2, seconds)
    assert flat.verify_time(4, 1) == flat.verify_time(4, 2) == pytest.approx(0.522)
    steep = CostModel.measured(1, {0: 0.040, 1: 0.043, 3: 0.050, 7: 0.064}, 0.0)
    steep.target_plan_s = INT4_PLANS
    assert [steep.verify_time(1, t) for t in (1, 2, 4, 8)] == pytest.approx(
        [0.040, 0.043, 0.050, 0.064]
    )


def test_first_timings_keep_the_fastest_then_a_running_average_at_the_hosts_pace():
    """One-off setup or a neighbour only adds time: of a shape's first timings the fastest
    is kept (verify passes and draft steps alike), then a running average; later timings of
    an established width move the host's pace, which every width is priced at."""
    w = AdaptiveWindow()
    assert pick(w, 2) == 0
    for seconds in (3.0, 1.25, 1.0):
        feed(w, 2, 0, seconds, 0.0, [], [])
        assert w.costs.verify_time(2, 1) == min(3.0, seconds) and w.costs.pace == 1.0
    assert pick(w, 2) == 1  # warm-up over: a look
    feed(w, 2, 0, 2.0, 0.0, [], [])
    pace = 2.0 ** WindowConfig().ema
    assert w.costs.pace == pytest.approx(pace)
    assert w.costs.verify_time(2, 1) == pytest.approx(pace * (0.8 * 1.0 + 0.2 * 2.0 / pace))
    costs = CostModel()
    for seconds in (0.033, 0.026, 0.030):
        costs.observe_draft(4, 1, seconds)
    assert costs.draft_time(4) == pytest.approx(0.026)
    costs.observe_draft(4, 1, 0.036)
    assert costs.draft_time(4) == pytest.approx(0.8 * 0.026 + 0.2 * 0.036)


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
        WindowConfig(evidence=0)
    with pytest.raises(ValueError):
        AdaptiveWindow().start_from({"reached": [1.0], "kept": [2.0]})


# ---- Phases and transitions --------------------------------------------------------------


def test_off_it_probes_and_drafts_again_once_acceptance_recovers():
    w = AdaptiveWindow(probe_every=4)
    trace = []
    decode(lambda: w, 0.05, steps(0.3, cheap), tokens=60, seeds=[0], trace=trace)
    ks = [k for _, k in trace]
    assert ks[-20:].count(0) >= 15 and 1 in ks[20:]  # plain, with k = 1 probes
    trace.clear()
    decode(lambda: w, 0.95, steps(0.1, cheap), tokens=600, seeds=[1], trace=trace)
    assert max(k for _, k in trace[-50:]) >= 3


def _looking_window() -> AdaptiveWindow:
    """The int4 pair (draft ratio 0.27, 47 ms plain steps) about to take its first look."""
    w = warmed(0.047)
    price(w, ratio=0.27)
    assert pick(w, 1) == 1
    return w


def test_a_first_look_timed_far_over_its_price_is_taken_again():
    """A first call pays setup (the 0.5B draft's first step 63 ms, then 22-27; the target's
    first 2-token pass 100 ms, then 52): over twice the plans' price, a second look, two
    wide, whose timings replace the first where faster. Near its price: taken as it is."""
    for verify_s, draft_s in ((0.070, 0.063), (0.100, 0.024)):
        w = _looking_window()
        feed(w, 1, 1, verify_s, draft_s, [1], [1], draft_first_s=draft_s)
        assert pick(w, 1) == 2 and w.phase is Phase.PROBE
        feed(w, 1, 2, 0.056, 0.048, [1, 1], [1, 1], draft_first_s=0.024)
        assert w.costs.draft_seconds(1, 1) == pytest.approx(0.024)
        assert w.costs.verify_time(1, 2) <= 0.056 and not w.costs.look_unsettled(1)
        assert pick(w, 1) >= 1
    w = _looking_window()
    feed(w, 1, 1, 0.052, 0.020, [1], [0], draft_first_s=0.020)
    assert not w.costs.look_unsettled(1)


def _after_a_look_rejected_in_a_slow_moment(seed, a=0.8) -> tuple[float, int]:
    """bf16 256 x 4 as the bench runs it (one draw a step): plain 0.145 s, a 2-token pass
    1.09x, a draft token 0.025 s; the look's one step timed slow and its draw rejected. The
    rest of a 64-token run: (speedup over plain, steps that drafted)."""
    rng, plain = random.Random(seed), 0.145
    window = warmed(plain, rows=4)
    window.phase = Phase.DRAFT  # the look, started by `choose`
    feed(window, 4, 1, 0.185, 0.033, [1], [0], progress=1)
    done, behind, spent, drafted = 2, 0, 0.0, 0
    while done < 64:
        k = pick(window, 4, catch_up=4 * behind, remaining=64 - done)
        if k == 0:
            feed(window, 4, 0, plain, 0.0, [], [])
            spent, done, behind = spent + plain, done + 1, behind + 1
            continue
        if behind:  # the catch-up: 0.9 s for 1,024 tokens
            feed_catch_up(window, 4 * behind, 0.9 * 4 * behind / 1024)
            spent, behind = spent + 0.9 * 4 * behind / 1024, 0
        kept = 0
        while kept < k and rng.random() < a:
            kept += 1
        reached = [1] * min(k, kept + 1) + [0] * (k - min(k, kept + 1))
        verify, draft = plain * (1 + 0.09 * k), 0.025 * k
        feed(window, 4, k, verify, draft, reached, [1] * kept + [0] * (k - kept), progress=1 + kept)
        spent, done, drafted = spent + verify + draft, done + 1 + kept, drafted + 1
    return (done - 2) * plain / spent, drafted


def test_a_look_goes_on_past_one_rejection_while_its_upper_bound_pays(monkeypatch):
    """Stopped at its first draw, `auto` gave up a drafter that paid (bench 0.93-0.96x plain,
    going on 1.03x): while the first position's optimistic rate pays, the look goes on."""
    runs = [_after_a_look_rejected_in_a_slow_moment(seed) for seed in range(6)]
    assert all(speedup > 1.3 and drafted > 15 for speedup, drafted in runs), runs
    monkeypatch.setattr(AdaptiveWindow, "_look_may_pay", lambda *_: False)
    cut = [_after_a_look_rejected_in_a_slow_moment(seed) for seed in range(6)]
    assert all(drafted == 0 for _, drafted in cut), cut


def test_one_early_rejection_does_not_end_drafting():
    """`margin` is a bar for starting, not for going on (one rejection at batch 1 ended a
    chat request's drafting where k = 3 ran 1.07-1.26x plain)."""

    def drafted_then_rejected():
        window = warmed(0.022)
        feed(window, 1, 1, 0.0255, 0.0105, [1], [1], draft_first_s=0.0105)
        feed(window, 1, 3, 0.0327, 0.0297, [1, 0, 0], [0, 0, 0], draft_first_s=0.0105)
        return window

    window = drafted_then_rejected()
    _, speedup = window.costs.best_window(1, window.acceptance.alpha, 8)
    assert 1.0 < speedup < 1 + window.config.margin
    window.phase = Phase.DRAFT
    assert pick(window, 1, remaining=56) >= 1
    assert pick(drafted_then_rejected(), 1, remaining=56) == 0  # not drafting: the bar holds


# ---- The floor guard ---------------------------------------------------------------------


GUARDED = dict(k_max=4, evidence=4, backoff=5)  # plain steps of 0.6 s a token


def _check(w, accepted, steps=None, k=2):
    """`steps` (`evidence`) steps of window k of 1 s each, the drafts all kept or all
    rejected; the model's acceptance perfect, so only the guard says no."""
    for _ in range(w.config.evidence if steps is None else steps):
        feed(w, 1, k, 0.8, 0.2, [1] * k, [accepted] * k)
    w.acceptance.reached, w.acceptance.kept = [100.0] * k, [100.0] * k


def _off_for(w):
    n = 0
    while pick(w, 1) == 0:
        assert w.phase is Phase.OFF
        n += 1
    return n


def test_the_guard_backs_off_doubling_and_resets_once_a_check_passes():
    w = warmed(0.6, **GUARDED)
    _check(w, 1)  # 3 tokens in 1 s: 1.8 plain steps' time a second
    assert _off_for(w) == 0
    _check(w, 0)  # 1 token in 1 s: 0.6
    assert _off_for(w) == 5
    _check(w, 0)
    assert _off_for(w) == 10  # again: twice as long
    _check(w, 1)  # passes: the next back-off is short again
    _check(w, 0)
    assert _off_for(w) == 5


def test_the_guard_judges_a_memory_of_recent_steps_not_the_last_few_alone():
    """A drafter whose matches come in bursts (suffix decoding on edits) loses for a few
    steps where the text changes and gains many times that where it copies; turned off
    for `backoff` steps by one short losing stretch, it missed the copying after it."""
    w = warmed(0.6, **GUARDED)
    _check(w, 1, steps=8, k=4)  # 5 tokens in 1 s: 3 plain steps' time a second
    _check(w, 0)  # one check's steps losing after a stretch that paid: drafting goes on
    assert _off_for(w) == 0
    _check(w, 0)  # losing on: off
    assert _off_for(w) == 5


def test_the_guard_credits_how_far_a_batch_job_went():
    """Judged by its longest rows' mean kept drafts the floor point read 1.5 tokens a step
    (1.02x) where the batch went 1.41 (0.96x)."""

    def guarded(whole_batch):
        w = warmed(1.0, rows=2, **GUARDED)
        for _ in range(w.config.evidence):  # 2 tied rows, one keeps its draft
            w.observe(StepRecord(2, 1, 2, drafted=(1, 1), accepted=(1, 0), left=(9, 9),
                                 left_after=(7, 8), whole_batch=whole_batch, draft_s=0.05,
                                 verify_s=1.42))  # fmt: skip
        return w.guard.off

    assert guarded(whole_batch=False) == 0 and guarded(whole_batch=True) == 5


def test_a_new_batch_forgets_a_first_trip_but_not_a_repeated_one():
    """A trip is about the text at hand (it left the fourth of four chat requests plain where
    k = 3 paid); a repeated one stands, and rows joining a live batch forget nothing."""
    w = warmed(0.6, **GUARDED)
    _check(w, 0)
    feed_prefill(w, 1, 10, 10, 0.1)  # joins live rows
    assert pick(w, 1) == 0
    feed_prefill(w, 1, 10, 10, 0.1, True)  # a new batch
    assert pick(w, 1) > 0
    _check(w, 0)
    feed_prefill(w, 1, 10, 10, 0.1, True)
    assert pick(w, 1) == 0


# ---- The floor and the gain, on simulated hosts --------------------------------------------


def masked_jump(t, ctx):  # a masked (multi-token) pass on the math kernel: 1.38 at least
    return 1.0 if t == 1 else 1.38 + 0.04 * (t - 2)


def context_grows(t, ctx):  # attention over a growing context: each token a row dearer
    return 1 + ctx / 4096 + (t - 1) * ctx / 2048


def stale_plain(k, n, ctx):  # plain steps timed at 1.4 at the start, 1.0 after
    return (1.4 if n < FIRST_TIMINGS else 1.0) if k == 0 else 1 + 0.05 * k, 0.35 * k


def plain_drifts(k, n, ctx):  # the plain step 1.4 for 40 steps, then 1.0; wider unchanged
    return (1.4 if n < 40 else 1.0) if k == 0 else 1 + 0.15 * k, 0.6 * k


FLOOR = {  # (the least share of plain `auto` keeps, the host)
    # Batch 16: a pass of T tokens a row ~1 + 0.55 (T - 1) plain steps.
    "batch16": (0.97, dict(a=0.6, cost=steps(0.3, lambda t, ctx: 1 + 0.55 * (t - 1)), rows=16)),
    "masked-jump": (0.97, dict(a=0.45, cost=steps(0.18, masked_jump))),
    "context": (0.97, dict(a=0.5, cost=steps(0.2, context_grows), rows=4, prompt=1024)),
    # SmolLM2 drafting for itself: a steep verify curve, c ~0.45.
    "small-model": (0.97, dict(a=0.6, cost=steps(0.45, lambda t, ctx: 1 + 0.25 * (t - 1)))),
    "poor-drafter": (0.97, dict(a=0.3, cost=steps(0.5, cheap))),
    # Compute-bound: a pass of T tokens a row costs T plain steps.
    "compute-bound": (0.97, dict(a=0.8, cost=steps(0.2, lambda t, ctx: t), rows=16)),
    # The best window gains 13%: `auto` may stay cautious, never slower.
    "marginal": (0.97, dict(a=0.6, cost=steps(0.4, cheap))),
    # Acceptance 0.3 (no window pays): priced against the stale plain step, and judged by a
    # guard using it, `auto` kept drafting (0.965x); a narrower pass costs at most a wider.
    "stale-plain": (0.985, dict(a=0.3, cost=stale_plain, tokens=512)),
    # No window pays at the true costs: without plain probes while drafting 0.97-0.98x.
    "plain-drifts": (0.985, dict(a=0.7, cost=plain_drifts, tokens=512)),
}


@pytest.mark.parametrize("host", sorted(FLOOR))
def test_never_slower_than_plain_where_no_window_pays_much(host):
    least, system = FLOOR[host]
    assert decode(AdaptiveWindow, **system) >= least * decode(PLAIN, **system)


def test_the_floor_check_fails_without_a_rising_curve(monkeypatch):
    """The check that the stale-plain case can fail: the curve as timed."""
    monkeypatch.setattr(costs_module, "_rising", lambda table, least: table)
    _, system = FLOOR["stale-plain"]
    assert decode(AdaptiveWindow, **system) < 0.97 * decode(PLAIN, **system)


PAYING = {
    "batch1-short": dict(a=0.7, cost=steps(0.17, lambda t, ctx: 1 + 0.01 * (t - 1))),
    "batch1-middling": dict(a=0.55, cost=steps(0.2, cheap)),
    "batch4": dict(a=0.7, cost=steps(0.2, lambda t, ctx: 1 + 0.06 * (t - 1)), rows=4),
}


@pytest.mark.parametrize("host", sorted(PAYING))
def test_keeps_most_of_the_gain_where_drafting_pays(host):
    """Where a fixed window pays >= 20%, a 64-token run gets >= 90% of the best one."""
    system = PAYING[host]
    best = best_fixed(**system)
    assert best >= 1.2 * decode(PLAIN, **system)
    assert decode(AdaptiveWindow, **system) >= 0.9 * best


def matching(window, tokens=2000, seed=0, long_share=0.25):
    """Tokens per second of a drafter that sizes its own drafts, as suffix decoding and
    prompt lookup do: a quarter of steps find a long match (the whole window, each token
    kept at 0.95), the rest a weak one (one token, kept at 0.5); a pass of T tokens costs
    1 + 0.08 (T - 1), drafting nothing. The pass is as wide as the draft."""
    rng, w, done, spent = random.Random(seed), window(), 0, 0.0
    while done < tokens:
        k = pick(w, 1)
        length = k if rng.random() < long_share else min(k, 1)
        rate = 0.95 if length > 1 else 0.5
        kept = 0
        while kept < length and rng.random() < rate:
            kept += 1
        width = 1 + length
        seconds = 1 + 0.08 * (width - 1)
        reached = [1] * min(kept + 1, k)
        w.observe(counted(1, k, seconds, 0.0, reached, [1] * kept + [0] * (len(reached) - kept),
                          width=width))  # fmt: skip
        done, spent = done + kept + 1, spent + seconds
    return done / spent


def test_a_drafter_sizing_its_drafts_is_priced_at_the_passes_it_verifies():
    """A window asks for k drafts; a drafter that matches text proposes fewer where its
    match is weak, and the pass is only as wide as the draft. Priced as if every pass were
    k + 1 wide, `auto` kept k at 6-11 and 0.80x the best fixed window (2.18 tokens a plain
    step's time); priced at the widths it verifies, it takes the long matches whole."""
    wide = lambda: AdaptiveWindow(k_max=16)  # noqa: E731
    best = max(matching(lambda k=k: FixedWindow(k)) for k in (4, 8, 12, 16))
    assert best > 1.4 * matching(lambda: FixedWindow(4))
    assert matching(wide) >= 0.9 * best


# The bf16 1.5B's verify passes on the Zen 3 (ms, by width; benchmarks "Suffix decoding").
ZEN3_BF16 = [155, 156, 165, 184, 191, 229, 300, 321, 359, 352, 374, 420, 468, 515, 560, 608, 655]


def edits(window, seeds=range(48)):
    """Tokens per second (in plain steps) of a suffix drafter on edits: no match for a few
    tokens, then copying (drafts as long as the copy, kept 0.97) and editing (the old text
    drafted, its first token kept 0.1) in turns; a draft costs 0.1% of a plain step."""
    done = spent = 0.0
    for seed in seeds:
        rng, w = random.Random(seed), window()
        kinds = ["none"] * rng.randint(5, 25)
        while len(kinds) < 260:
            kinds += ["copy"] * rng.randint(15, 80) + ["edit"] * rng.randint(2, 12)
        pos = 0
        while pos < len(kinds):
            k = pick(w, 1, remaining=len(kinds) - pos)
            copy = 0
            while kinds[pos + copy : pos + copy + 1] == ["copy"]:
                copy += 1
            long = {"none": 0, "copy": copy + 3, "edit": rng.randint(1, 9)}[kinds[pos]]
            length, kept = min(k, long), 0
            while kept < length and rng.random() < (
                0.97 if kinds[pos + kept :][:1] == ["copy"] else 0.1
            ):
                kept += 1
            seconds, draft_s = ZEN3_BF16[length] / ZEN3_BF16[0], 0.001 * bool(length)
            reached = [1] * min(kept + 1, length)
            kept_at = [1] * kept + [0] * (len(reached) - kept)
            w.observe(counted(1, k, seconds, draft_s, reached, kept_at, width=length + 1))
            pos, done, spent = pos + kept + 1, done + kept + 1, spent + seconds + draft_s
    return done / spent


def test_a_drafter_matching_in_bursts_keeps_drafting_through_a_short_loss(monkeypatch):
    """A short losing stretch where the text changes turned drafting off for the copying
    after it: judged on each `evidence` steps alone, `auto` ran 0.93x the best fixed window
    here; with the guard's fading memory 0.965x."""
    best = max(edits(lambda k=k: FixedWindow(k)) for k in (2, 3, 4, 6, 8))
    assert edits(AdaptiveWindow) >= 0.95 * best

    def each_window_alone(guard, plain_s, seconds, tokens_per_row):  # no memory past a check
        # the fading undone: plain sums over the check's steps
        guard.saved, guard.spent = guard.saved / guard.fade, guard.spent / guard.fade
        remembered(guard, plain_s, seconds, tokens_per_row)
        if guard.checked == 0:
            guard.saved = guard.spent = 0.0

    remembered = controller.Guard.count
    monkeypatch.setattr(controller.Guard, "count", each_window_alone)
    assert edits(AdaptiveWindow) < 0.945 * best


def drifting(slow):
    """The int4 pair on a Zen 4 (c = 0.35, a pass of T tokens 1 + 0.08 (T - 1)), every pass
    of step n `slow(n)` times slower."""
    return lambda k, n, ctx: (slow(n) * (1 + 0.08 * k), slow(n) * 0.35 * k)


PERIODIC = lambda n: 1.0 + 0.35 * ((n // 30) % 2)  # noqa: E731  slower every other 30 steps


@pytest.mark.parametrize("a,slow", [(0.9, PERIODIC), (0.8, lambda n: 1.4 if n < 40 else 1.0)])
def test_the_window_prices_at_the_hosts_pace(a, slow):
    """Priced against a plain step timed at another speed, `auto` gave up 7-9% against the
    best fixed window; moving every width with the pace keeps it within 5%."""
    system = dict(a=a, cost=drifting(slow), tokens=512)
    assert decode(AdaptiveWindow, **system) >= 0.95 * best_fixed(ks=range(1, 6), **system)


def test_without_the_pace_a_host_that_drifts_back_and_forth_costs_auto(monkeypatch):
    """The check that the pace matters: over 6% lost without it on the host slowing down and
    speeding up again (one lasting change, the guard's memory catches)."""
    system = dict(a=0.9, cost=drifting(PERIODIC), tokens=512)
    best = best_fixed(ks=range(1, 6), **system)
    monkeypatch.setattr(CostModel, "pace", property(lambda _: 1.0, lambda *_: None))
    assert decode(AdaptiveWindow, **system) < 0.94 * best


def test_no_probes_where_a_perfect_drafter_could_not_pay():
    """Batch 16 (v(1) = 1.46, c = 0.54): one k = 1 step shows it; no probe follows."""
    trace = []
    system = dict(a=0.6, cost=steps(0.54, lambda t, ctx: 1 + 0.46 * (t - 1)), rows=16, tokens=256)
    auto = decode(AdaptiveWindow, seeds=[0], trace=trace, **system)
    assert auto > 0.98 * decode(PLAIN, seeds=[0], **system)
    assert sum(k > 0 for _, k in trace) == 1


@pytest.mark.parametrize("plans", [True, False])
def test_a_busy_host_does_not_make_a_losing_window_look_free(plans):
    """4 rows, a free drafter kept at 0.2-0.4, a pass of T tokens 1 + 0.5 (T - 1), 3 passes
    in 10 timed 1.6x slow, a fresh `auto` per 64-token request: with the plans' floor under
    the curve 0.97x plain or better; without (the check that this can fail) 0.95-0.96x."""

    def total_seconds(window, a):
        true_s = 0.0
        for seed in range(30):
            rng, w, done = random.Random(seed), window(), 0.0
            if plans:
                price(w, INT4_PLANS, {})
            while done < 64:
                k = pick(w, 4)
                cost = 1 + 0.5 * k
                timed = cost * (1.6 if rng.random() < 0.3 else rng.uniform(0.95, 1.05))
                reached, kept, emitted = [0] * k, [0] * k, 0
                for _ in range(4):
                    for i in range(k):
                        reached[i] += 1
                        if rng.random() >= a:
                            break
                        kept[i] += 1
                        emitted += 1
                feed(w, 4, k, timed, 0.0, reached, kept)
                done += 1 + emitted / 4
                true_s += cost
        return true_s

    ratios = [total_seconds(PLAIN, a) / total_seconds(AdaptiveWindow, a) for a in (0.2, 0.3, 0.4)]
    assert min(ratios) >= 0.965 if plans else max(ratios[:2]) < 0.96, ratios


# ---- A draft model's start: its catch-up priced ------------------------------------------


def serve(window, a, c, verify, prompt, prefill, ratio, rows=1, requests=1, tokens=64,
          seeds=range(3)):  # fmt: skip
    """(tokens per second end to end, history tokens caught up) of `requests` admissions of
    `rows` prompts in turn: a prefill of `prefill` plain steps a prompt token, then a lazy
    draft's catch-up on the rows' history (`ratio * prefill` a token) when the window starts."""
    total_tokens, total_s, caught = 0, 0.0, 0
    for seed in seeds:
        rng, w = random.Random(seed), window()
        price(w, ratio=ratio)
        for _ in range(requests):
            feed_prefill(w, rows, prompt, rows * prompt, prefill * rows * prompt)
            total_s += prefill * rows * prompt
            done, behind = [1] * rows, True  # the prefill made each row's first token
            while min(done) < tokens:
                catch_up = rows * (prompt + done[0] - 1) if behind else 0
                k = pick(w, rows, catch_up=catch_up, remaining=tokens - min(done))
                if k and behind:
                    feed_catch_up(w, catch_up, ratio * prefill * catch_up)
                    total_s, caught = total_s + ratio * prefill * catch_up, caught + catch_up
                    behind = False
                reached, kept = one_step(rng, a, k, done, tokens)
                verify_s, draft_s = verify(k + 1, prompt + min(done)), c * k
                feed(w, rows, k, verify_s, draft_s, reached, kept)
                total_s += verify_s + draft_s
            total_tokens += rows * tokens
    return total_tokens / total_s, caught


LAZY = {  # a catch-up of the rows' prompts costs more than 64 tokens can repay
    "batch16-prompt64": dict(a=0.6, c=0.3, verify=lambda t, ctx: 1 + 0.55 * (t - 1), rows=16,
                             prompt=64, prefill=0.028, ratio=0.3),
    "batch4-prompt1024": dict(a=0.7, c=0.2, verify=lambda t, ctx: 1 + 0.06 * (t - 1), rows=4,
                              prompt=1024, prefill=0.025, ratio=0.3),
}  # fmt: skip


@pytest.mark.parametrize("regime", sorted(LAZY))
def test_a_catch_up_a_generation_cannot_repay_is_not_paid(regime):
    plain, _ = serve(PLAIN, **LAZY[regime])
    auto, caught = serve(AdaptiveWindow, **LAZY[regime])
    assert caught == 0 and auto >= 0.99 * plain


def test_a_catch_up_is_paid_where_the_generation_repays_it():
    """4 x 1,024 with 1,024 tokens to generate; one row of a 64-token prompt with 64."""
    system = LAZY["batch4-prompt1024"]
    auto, caught = serve(AdaptiveWindow, tokens=1024, **system)
    assert caught > 0 and auto >= 1.2 * serve(PLAIN, tokens=1024, **system)[0]
    short = dict(a=0.7, c=0.17, verify=lambda t, ctx: 1 + 0.01 * (t - 1), prompt=64,
                 prefill=0.025, ratio=0.3)  # fmt: skip
    best = max(serve(lambda k=k: FixedWindow(k), **short)[0] for k in range(1, 9))
    auto, caught = serve(AdaptiveWindow, **short)
    assert caught > 0 and auto >= 0.85 * best and auto >= 1.2 * serve(PLAIN, **short)[0]


def test_a_catch_up_is_priced_from_the_prefill_until_one_is_timed():
    w = warmed(0.04)
    w.observe(StepRecord(1, prefilled=(1000,), prefill_s=2.0, fresh=True))  # 2 ms a token
    w.costs.draft_ratio = 0.25
    assert pricing.catch_up_time(w.costs, 1000) == pytest.approx(0.5)  # 1,000 x 2 ms x 0.25
    assert w.choose(Batch(1, remaining=8, catch_up=1000)) == 0  # 8 steps cannot repay 0.5 s
    assert w.choose(Batch(1, remaining=4000, catch_up=40)) == 1
    # (a timed catch-up, priced by its width: test_startup_pricing.py)


# The int4 1.5B with its 0.5B draft on a Zen 3: c = 0.39, a verified row 0.26 of a step, a
# 46-token prompt's prefill 0.33 steps a token, the draft's catch-up 0.32 of it.
INT4_PAIR = dict(c=0.39, verify=lambda t, ctx: 1 + 0.26 * (t - 1), prompt=46, prefill=0.33,
                 ratio=0.32)  # fmt: skip


@pytest.mark.parametrize("a", [0.93, 0.67, 0.5])
def test_a_cheap_look_measures_a_drafter_the_prior_would_never_start(a):
    """No window clears the blind bar at the prior's acceptance (auto 1.00x where fixed
    k = 2-3 ran 1.10-1.13x): a look from the first request gains where the drafter is good
    and costs little where it is not."""
    for requests in (1, 4):
        auto, _ = serve(AdaptiveWindow, a=a, requests=requests, **INT4_PAIR)
        plain, _ = serve(PLAIN, a=a, requests=requests, **INT4_PAIR)
        if a > 0.9:
            assert auto >= (1.015 if requests == 1 else 1.03) * plain
        else:
            assert auto >= (0.9 if requests == 1 else 0.975) * plain
    window = AdaptiveWindow()  # the blind bar alone: four requests never draft
    window._may_start = lambda batch: startup_pays(
        window.costs, batch, window.acceptance.prior(), 8, BLIND
    )
    one = dict(a=a, requests=4, seeds=[0], **INT4_PAIR)
    assert serve(lambda: window, **one)[0] == pytest.approx(serve(PLAIN, **one)[0])


SHORT_REQUESTS = dict(c=0.3, verify=lambda t, ctx: 1 + 0.05 * (t - 1), prompt=20, prefill=0.25,
                      ratio=0.3, tokens=32, requests=4)  # fmt: skip


def _planned_window():
    window = AdaptiveWindow()
    price(window,
          {1: 1.0, 2: 1.02, 4: 1.06, 8: 1.15, 16: 1.3, 32: 1.6},
          {1: 0.4, 2: 0.41, 4: 0.43, 8: 0.5, 16: 0.9, 32: 1.5})  # fmt: skip
    return window


@pytest.mark.parametrize("a", [0.9, 0.5])
def test_a_looks_budget_counts_the_plain_steps_spent_before_it(a, monkeypatch):
    """SmolLM2's look cost a little over a tenth of each 32-token request and was refused
    every time (k = 4 ran 1.5x): the plain steps decoded before the first look count."""
    plain, _ = serve(PLAIN, a=a, **SHORT_REQUESTS)
    auto, _ = serve(_planned_window, a=a, **SHORT_REQUESTS)
    assert auto >= (1.15 if a > 0.8 else 0.985) * plain
    never = property(lambda _: 0.0, lambda *_: None)
    monkeypatch.setattr(AdaptiveWindow, "_unlooked_s", never, raising=False)
    assert serve(_planned_window, a=a, **SHORT_REQUESTS)[0] == pytest.approx(plain)


@pytest.mark.parametrize("a", [0.6, 0.3])
def test_a_look_is_never_dearer_than_two_requests_could_repay(a):
    """1,024-token prompts (int4 pair, Xeon AMX): a look taken at the fourth request once the
    plain steps before it made its budget cost the run 7%; they count up to the request's
    own decoding ahead."""
    long = dict(c=0.37, verify=lambda t, ctx: 1 + 0.18 * (t - 1), prompt=1024, prefill=0.055,
                ratio=0.35, requests=4)  # fmt: skip
    assert serve(AdaptiveWindow, a=a, **long)[0] >= 0.99 * serve(PLAIN, a=a, **long)[0]


def _startup_costs(rows, plain_s, prompt, prefill_s, ratio=0.273):
    """What a window knows before its first start: plain steps, the prefill, the ratio."""
    costs = CostModel()
    for _ in range(FIRST_TIMINGS):
        costs.observe_verify(rows, 1, plain_s)
    pricing.observe_prefill(costs, (prompt,) * rows, prefill_s)
    costs.draft_ratio = ratio
    return costs


# (rows, plain step s, prompt tokens, prefill s, tokens left): the default pair in the sweep.
STARTUPS = {
    "4x256": (4, 0.7356, 256, 25.86, 61),
    "8x64": (8, 0.55, 64, 8.0, 61),
    "1x1024": (1, 0.45, 1024, 16.0, 63),
    "2x256": (2, 0.40, 256, 8.0, 61),
    "1x64": (1, 0.45, 64, 1.0, 63),
}


@pytest.mark.parametrize(
    "name,starts",
    [("4x256", False), ("8x64", False), ("1x1024", False), ("2x256", True), ("1x64", True)],
)
def test_a_blind_start_takes_no_marginal_bet(name, starts):
    """Starts predicted at 9-15% ran 0.89-1.21x plain: before any draft is seen the net gain
    must be twice `explore_share` of the decoding ahead, priced at the best window."""
    rows, plain_s, prompt, prefill_s, left = STARTUPS[name]
    costs = _startup_costs(rows, plain_s, prompt, prefill_s)
    alpha = AdaptiveWindow().acceptance.prior()
    start = Batch(rows, left, rows * prompt)
    assert startup_pays(costs, start, alpha, 8, BLIND) is starts
    assert startup_pays(costs, start, alpha, 8, min_gain=0.0)
    if name in ("1x1024", "2x256"):  # priced at k = 1 it would not start; at 8 it may
        longer = 127 if name == "1x1024" else left
        longer = Batch(rows, longer, rows * prompt)
        assert not startup_pays(costs, longer, alpha, 1, BLIND)
        assert startup_pays(costs, longer, alpha, 8, BLIND)


def test_a_start_keeps_its_curve_when_the_batch_shrinks():
    """8 rows prefilled, plain steps timed at 7: priced from the 8-row prefill by total
    tokens about as from a 7-row one, not a flat curve (which started at 0.89x plain)."""
    rows, plain_s, prompt, prefill_s, _ = STARTUPS["8x64"]
    costs = _startup_costs(rows, plain_s, prompt, prefill_s)
    own = _startup_costs(rows - 1, plain_s * 0.95, prompt, prefill_s * (rows - 1) / rows)
    for _ in range(FIRST_TIMINGS):
        costs.observe_verify(rows - 1, 1, plain_s * 0.95)
    for k in (1, 2, 4, 8):
        borrowed = pricing.startup_verify_time(costs, rows - 1, k + 1)
        assert borrowed == pytest.approx(pricing.startup_verify_time(own, rows - 1, k + 1), rel=0.1)
        assert borrowed > (1 + 0.1 * k) * plain_s * 0.95


def test_a_look_is_priced_per_row_and_later_starts_on_what_was_measured():
    rows, plain_s, prompt, prefill_s, left = STARTUPS["8x64"]
    window = AdaptiveWindow()
    window.costs = _startup_costs(rows, plain_s, prompt, prefill_s)
    feed_prefill(window, rows, prompt, rows * prompt, prefill_s)
    assert not window._may_start(Batch(rows, left, rows * prompt))  # 8 rows: too dear
    one = AdaptiveWindow()
    one.costs = _startup_costs(1, 0.033, 46, 0.5, ratio=0.32)
    assert not startup_pays(one.costs, Batch(1, 63, 46), one.acceptance.prior(), 8, BLIND)
    assert one._may_start(Batch(1, 63, 46))  # one row: a look
    for good, (reached, kept) in {True: ([1, 1], [1, 1]), False: ([1, 0], [0, 0])}.items():
        informed = AdaptiveWindow()
        informed.costs = _startup_costs(1, 0.033, 46, 0.5, ratio=0.32)
        for _ in range(6):
            feed(informed, 1, 2, 0.050, 0.026, reached, kept)
        assert informed._may_start(Batch(1, 63, 46)) is good


def test_a_refused_start_stands_until_the_next_admission(monkeypatch):
    """Steps that only add to the catch-up and take from the tokens ahead are refused
    without pricing (0.3 ms a step); more ahead, other rows or an admission re-price."""
    window = AdaptiveWindow()
    priced, answer = [], [False]
    monkeypatch.setattr(window, "_next", lambda rows: (Phase.DRAFT, 1))
    monkeypatch.setattr(window, "_may_start", lambda *args: priced.append(args) or answer[0])
    for n in range(3):
        assert pick(window, 1, catch_up=50 + n, remaining=30 - n) == 0
    assert len(priced) == 1
    assert pick(window, 1, catch_up=53, remaining=40) == 0 and len(priced) == 2
    assert pick(window, 2, catch_up=54, remaining=27) == 0 and len(priced) == 3
    feed_prefill(window, 1, 10, 10, 0.1)
    answer[0] = True
    assert pick(window, 2, catch_up=55, remaining=26) == 1 and len(priced) == 4
    assert pick(window, 2, catch_up=56, remaining=25) == 1 and len(priced) == 5


def test_a_probe_restarts_a_lazy_draft_where_its_catch_up_is_cheap():
    """Off, a lazy draft falls a token behind a step; its probe is priced as a look (at most
    `explore_share` of the decoding ahead), not refused as a start on the poor estimate."""

    def probe(remaining, catch_up_s=0.100):
        window = warmed(0.022, probe_every=4)
        for _ in range(3):  # every first draft rejected
            feed(window, 1, 1, 0.026, 0.011, [1], [0], draft_first_s=0.011)
        feed_catch_up(window, 46, catch_up_s)
        chosen = []
        for step in range(8):
            chosen.append(pick(window, 1, catch_up=step + 1, remaining=remaining - step))
            feed(window, 1, chosen[-1], 0.022, 0.0, [], [])
            if chosen[-1]:
                break
        return chosen

    assert probe(400)[-1] == 1 and probe(400, catch_up_s=2.0)[-1] == 1
    assert not any(probe(40, catch_up_s=2.0))


# ---- The warm start ----------------------------------------------------------------------


def test_a_warm_start_drafts_from_the_stored_costs_and_acceptance():
    cold = AdaptiveWindow()
    decode(lambda: cold, 0.9, steps(0.1, cheap), tokens=100, seeds=[0])
    warm = AdaptiveWindow()
    warm.costs = CostModel.from_json(cold.costs.to_json())
    warm.start_from(cold.acceptance_state())
    assert sum(warm.acceptance.reached[:1]) <= WindowConfig().evidence
    trace = []
    decode(lambda: warm, 0.9, steps(0.1, cheap), tokens=3, seeds=[0], trace=trace)
    assert trace[0][1] >= 2  # no warm-up, no look: the window the stored measurements say


@pytest.mark.parametrize("draft_s, looks_afresh", [(0.030, True), (0.016, False)])
def test_a_stored_draft_timing_far_over_its_price_is_measured_afresh(draft_s, looks_afresh):
    """A process whose draft ran slow (a profiler, a busy host: 0.64 of a plain step where
    the bytes price 0.27) stored costs that say drafting never pays; a later process would
    never draft to learn otherwise. Over twice its price a stored draft timing is dropped
    and the drafter looked at anew, priced as a start; near its price it stands."""
    earlier = _looking_window()
    feed_catch_up(earlier, 200, 1.0)  # a tenth of the plain decoding ahead: no cheap look
    for _ in range(8):
        feed(earlier, 1, 1, 0.052, draft_s, [1], [1], draft_first_s=draft_s)
    later = AdaptiveWindow()
    later.costs = CostModel.from_json(earlier.costs.to_json())
    later.start_from(earlier.acceptance_state())
    price(later, ratio=0.27)  # the engine prices the models at its start
    k = pick(later, 1, catch_up=200, remaining=200)
    if looks_afresh:
        assert (later.phase, k) == (Phase.LOOK, 1)
    else:
        assert later.phase is Phase.DRAFT and k >= 2  # the stored costs, no look


@pytest.mark.parametrize("a", [0.93, 0.5])
def test_a_process_starts_from_the_last_ones_acceptance(a):
    """No look needed: a poor drafter decodes as plain (the look cost 8%), a good one drafts
    from the start; the stored counts weigh a few steps against the run's own."""
    earlier = AdaptiveWindow()
    serve(lambda: earlier, a=a, requests=4, seeds=[0], **INT4_PAIR)
    state = earlier.acceptance_state()
    assert 0 < state["reached"][0] <= WindowConfig().evidence

    def warm():
        window = AdaptiveWindow()
        window.start_from(state)
        return window

    plain, cold, informed = (serve(w, a=a, **INT4_PAIR)[0] for w in (PLAIN, AdaptiveWindow, warm))
    if a > 0.9:
        assert informed > cold > plain
    else:
        assert informed == pytest.approx(plain) and cold < plain
