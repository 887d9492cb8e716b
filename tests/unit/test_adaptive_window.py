"""The adaptive window, driven by a simulated system whose best window is known."""

import random

import pytest

from specdec.cost_model import AdaptiveWindow, CostModel, FixedWindow, expected_tokens


def simulate(a: float, c: float, verify, steps: int = 400, rows: int = 1, seed: int = 0):
    """Steps of a system with i.i.d. acceptance a, draft cost c, verify cost verify(T);
    returns the windows chosen after warm-up and the realised tokens per second."""
    rng = random.Random(seed)
    window = AdaptiveWindow(k_max=8)
    chosen, tokens, seconds = [], 0.0, 0.0
    for step in range(steps):
        k = window.choose(rows)
        reached, kept, run = [0] * k, [0] * k, True
        accepted = 0
        for i in range(k):
            if run:
                reached[i] = rows
                run = rng.random() < a
                kept[i] = rows if run else 0
                accepted += run
        verify_s, draft_s = verify(k + 1), c * k
        window.observe(rows, k, verify_s, draft_s, reached, kept)
        if step >= 50:
            chosen.append(k)
            tokens += accepted + 1
            seconds += verify_s + draft_s
    return chosen, tokens / seconds


def best_k(a, c, verify):
    return max(range(9), key=lambda k: expected_tokens([a], k) / (k * c + verify(k + 1)))


@pytest.mark.parametrize("a,c", [(0.9, 0.2), (0.7, 0.2), (0.8, 0.4), (0.95, 0.1)])
def test_settles_near_the_best_window(a, c):
    """Where speculation clearly pays (>= 25% here), auto gets within 10% of the best k."""

    def verify(t):
        return 1 + 0.02 * (t - 1)

    chosen, rate = simulate(a, c, verify)
    target = best_k(a, c, verify)
    typical = max(set(chosen), key=chosen.count)
    assert abs(typical - target) <= 1, (typical, target)
    best_rate = expected_tokens([a], target) / (target * c + verify(target + 1))
    assert rate > 0.9 * best_rate


@pytest.mark.parametrize("seed", range(4))
def test_marginal_gains_never_make_it_slower(seed):
    """Best window gains 13%: auto may stay conservative, but is never slower than plain."""
    chosen, rate = simulate(0.6, 0.4, lambda t: 1 + 0.02 * (t - 1), seed=seed)
    assert rate > 0.97


def test_turns_speculation_off_when_it_cannot_pay():
    chosen, rate = simulate(0.3, 0.5, lambda t: 1 + 0.02 * (t - 1))
    assert chosen.count(0) > 0.9 * len(chosen)
    assert rate > 0.95  # plain decoding makes 1 token per second here


def test_turns_speculation_off_when_verify_is_compute_bound():
    """At a large batch a pass over k+1 tokens per row costs ~k+1 times one token."""
    chosen, rate = simulate(0.8, 0.2, lambda t: 1.0 * t, rows=16)
    assert chosen.count(0) > 0.9 * len(chosen)
    assert rate > 0.95


def test_a_falling_curve_extrapolated_to_zero_predicts_nothing():
    # Noisy wall times: v(2) below v(1), whose extension reaches zero by k = 4. With a free
    # drafter (n-gram) such a window would cost nothing: no prediction, not a division by 0.
    costs = CostModel.measured(1, {0: 0.010, 1: 0.012, 2: 0.006}, 0.0)
    assert costs.predict(1, [1.0], 4) is None
    assert costs.best_window(1, [1.0], 8)[0] in (1, 2)


# ---- Short generations, every step counted --------------------------------------------
#
# `simulate` above leaves out the first 50 steps; a request of 64 tokens lasts 20-64 steps,
# so there the controller's exploration is most of the run. `generate` runs whole
# generations and counts every step, against plain decoding and every fixed window on
# the same simulated system. Costs are in units of one plain step at the start.


def generate(window, a, c, verify, rows=1, tokens=64, prompt=64, seeds=range(6)):
    """Tokens per second of `rows` requests of `tokens` each, summed over `seeds`: each
    step draws i.i.d. acceptance `a` per position and row, costs `c` per draft token and
    `verify(T, context)` for T tokens per row after `context` committed tokens. Drafts are
    cut, as the engine cuts them, to what a row can still use."""
    total_tokens, total_s = 0, 0.0
    for seed in seeds:
        rng = random.Random(seed)
        w = window()
        done = [0] * rows
        while min(done) < tokens:
            k = w.choose(rows)
            lengths = [min(k, max(0, tokens - n - 1)) for n in done]
            reached, kept = [0] * k, [0] * k
            for r in range(rows):
                run = True
                accepted = 0
                for i in range(lengths[r]):
                    if not run:
                        break
                    reached[i] += 1
                    run = rng.random() < a
                    kept[i] += run
                    accepted += run
                done[r] = min(tokens, done[r] + accepted + 1)
            context = prompt + sum(done) // rows
            verify_s, draft_s = verify(k + 1, context), c * k
            w.observe(rows, k, verify_s, draft_s, reached, kept)
            total_s += verify_s + draft_s
        total_tokens += rows * tokens
    return total_tokens / total_s


def fixed(k):
    return lambda: FixedWindow(k)


REGIMES = {
    # Batch 16 on this CPU: a pass of T tokens per row costs ~1 + 0.55 (T - 1) plain steps
    # (16 x 96 context: v(1) 1.42, v(4) 3.23, v(8) 5.35), draft c ~0.3: it cannot pay.
    "batch16-compute-bound": dict(a=0.6, c=0.3, verify=lambda t, ctx: 1 + 0.55 * (t - 1), rows=16),
    # 1056-token context before the GQA fold: a masked (multi-token) pass fell back to the
    # math kernel, v(1) = 1.38 however few tokens; a = 0.45 there.
    "masked-verify-jump": dict(
        a=0.45, c=0.18, verify=lambda t, ctx: 1.0 if t == 1 else 1.38 + 0.04 * (t - 2)
    ),
    # Context-dependent verify: attention over the cache grows with it (a long prompt,
    # several rows), every extra token per row costing more as the context grows.
    "context-dependent": dict(
        a=0.5,
        c=0.2,
        verify=lambda t, ctx: 1 + ctx / 4096 + (t - 1) * ctx / 2048,
        rows=4,
        prompt=1024,
    ),
    # A small model (SmolLM2-135M drafting for itself): per-position work over the
    # vocabulary makes v steep, and the self-draft costs c ~0.45.
    "small-model-steep-verify": dict(a=0.6, c=0.45, verify=lambda t, ctx: 1 + 0.25 * (t - 1)),
}


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_auto_never_loses_to_plain_in_a_short_generation(regime):
    """Where no window pays (or barely), auto's whole 64-token run, exploration included,
    is at least 0.97x plain decoding."""
    system = REGIMES[regime]
    plain = generate(fixed(0), **system)
    auto = generate(AdaptiveWindow, **system)
    best = max(generate(fixed(k), **system) for k in range(9))
    assert auto >= 0.97 * plain, (auto / plain, best / plain)


PAYING = {
    "batch1-short-prompt": dict(a=0.7, c=0.17, verify=lambda t, ctx: 1 + 0.01 * (t - 1)),
    "batch1-middling": dict(a=0.55, c=0.2, verify=lambda t, ctx: 1 + 0.02 * (t - 1)),
    "batch4": dict(a=0.7, c=0.2, verify=lambda t, ctx: 1 + 0.06 * (t - 1), rows=4),
}


@pytest.mark.parametrize("regime", sorted(PAYING))
def test_auto_keeps_most_of_the_gain_where_speculation_pays(regime):
    """Where a fixed window pays >= 20%, auto's 64-token run gets >= 90% of the best one."""
    system = PAYING[regime]
    plain = generate(fixed(0), **system)
    best = max(generate(fixed(k), **system) for k in range(9))
    assert best >= 1.2 * plain
    auto = generate(AdaptiveWindow, **system)
    assert auto >= 0.9 * best, (auto / plain, best / plain)


def test_guard_backs_off_when_speculation_realises_less_than_plain():
    """Whatever the model predicts, `guard_steps` speculative steps that emit fewer
    tokens per second than the measured plain step switch speculation off for `backoff`
    steps (no probes), twice as long when it trips again, reset once a check passes."""
    w = AdaptiveWindow(k_max=4, guard_steps=4, backoff=5)
    for _ in range(2):  # plain: 1 s per token
        w.observe(1, 0, 1.0, 0.0, [], [])

    def check(seconds, accepted):  # guard_steps steps of k = 2
        for _ in range(w.guard_steps):
            w.observe(1, 2, seconds - 0.2, 0.2, [1, 1], [accepted, accepted])
        # Acceptance as the model sees it: perfect, so only the guard can say no.
        w._reached, w._kept = [100.0, 100.0], [100.0, 100.0]

    def off_for():
        n = 0
        while w.choose(1) == 0:
            n += 1
        return n

    check(seconds=1.0, accepted=1)  # 3 tokens in 1 s: passes
    assert off_for() == 0
    check(seconds=2.0, accepted=0)  # 1 token in 2 s: trips
    assert off_for() == 5
    check(seconds=2.0, accepted=0)
    assert off_for() == 10  # tripped again: twice as long
    check(seconds=1.0, accepted=1)  # passes: the next back-off is short again
    check(seconds=2.0, accepted=0)
    assert off_for() == 5


def test_plain_reference_is_the_faster_of_two_steps():
    """One slow first plain step (a kernel's first call, a neighbour) must not make every
    window look better than it is: two plain steps per batch size, the faster kept."""
    w = AdaptiveWindow()
    assert w.choose(2) == 0
    w.observe(2, 0, 3.0, 0.0, [], [])
    assert w.choose(2) == 0
    w.observe(2, 0, 1.0, 0.0, [], [])
    assert w.costs.verify_time(2, 1) == 1.0
    assert w.choose(2) == 1  # then the cheapest window that times the drafter
    w.observe(2, 0, 2.0, 0.0, [], [])  # later passes: a running average
    assert w.costs.verify_time(2, 1) == pytest.approx(1.2)


def test_no_probes_where_a_perfect_drafter_could_not_pay():
    """Batch 16 as measured here (v(1) = 1.46, c = 0.54): two tokens for 2.0 plain steps
    even if every draft is kept. One k = 1 step shows it; no probe follows."""
    chosen = []

    class Recording(AdaptiveWindow):
        def choose(self, rows):
            chosen.append(super().choose(rows))
            return chosen[-1]

    system = dict(a=0.6, c=0.54, verify=lambda t, ctx: 1 + 0.46 * (t - 1), rows=16)
    assert generate(Recording, tokens=256, seeds=[0], **system) > 0.98 * generate(
        fixed(0), tokens=256, seeds=[0], **system
    )
    assert sum(k > 0 for k in chosen) == 1
