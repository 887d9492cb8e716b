"""The adaptive window, driven by a simulated system whose best window is known."""

import random

import pytest

from specdec.cost_model import AdaptiveWindow, CostModel, expected_tokens


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
