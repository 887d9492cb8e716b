"""Acceptors on hand-built target distributions and drafts (V = 6); the cost model and
SpecStats on hand-set numbers."""

import math

import pytest
import torch

from specdec.acceptors import (
    ACCEPTORS,
    Draft,
    GreedyAcceptor,
    LossyTypicalAcceptor,
    RejectionSampler,
    TokenAcceptor,
    Verdict,
)
from specdec.stats import SpecStats
from specdec.window import CostModel, WindowConfig, expected_tokens

V = 6
ALL = [GreedyAcceptor(), RejectionSampler(), LossyTypicalAcceptor()]
ids = [type(a).__name__ for a in ALL]


def one_hot(token: int) -> torch.Tensor:
    return torch.zeros(V).index_fill_(0, torch.tensor([token]), 1.0)


def dist(**mass: float) -> torch.Tensor:
    """`dist(t2=0.5, t4=0.5)` -> a [V] distribution with that mass on tokens 2 and 4."""
    d = torch.zeros(V)
    for name, m in mass.items():
        d[int(name[1:])] = m
    return d / d.sum()


def gens(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def draft(tokens, probs=None, lengths=None) -> Draft:
    tokens = torch.tensor(tokens, dtype=torch.long).reshape(len(tokens), -1)
    B, k = tokens.shape
    lengths = torch.full((B,), k) if lengths is None else torch.tensor(lengths)
    return Draft(tokens, probs, lengths)


def rows(*positions: torch.Tensor) -> torch.Tensor:
    """One row's target_probs `[1, len(positions), V]`."""
    return torch.stack(positions)[None]


def check_verdict_shape(verdict: Verdict, d: Draft) -> None:
    """Contract: accepted prefix = draft, then one token, then -1; at least one token."""
    B, k = d.tokens.shape
    assert verdict.tokens.shape == (B, k + 1)
    assert verdict.num_accepted.shape == (B,)
    for b in range(B):
        n = int(verdict.num_accepted[b])
        assert 0 <= n <= int(d.lengths[b])
        row = verdict.tokens[b]
        assert row[:n].tolist() == d.tokens[b, :n].tolist()
        assert 0 <= int(row[n]) < V  # every row emits at least one token
        assert (row[n + 1 :] == -1).all()


# A target whose argmax is 2, 4, 1 at the draft positions and 5 at the bonus position.
# Each position is one-hot, so every acceptor's choice is deterministic.
SURE = rows(one_hot(2), one_hot(4), one_hot(1), one_hot(5))


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
@pytest.mark.parametrize("as_q", ["one-hot", "dense"])
def test_full_match_accepts_all_and_adds_the_bonus(acceptor, as_q):
    q = None if as_q == "one-hot" else SURE[:, :3].clone()
    d = draft([[2, 4, 1]], q)
    verdict = acceptor(d, SURE, gens(1))
    check_verdict_shape(verdict, d)
    assert verdict.num_accepted.tolist() == [3]
    assert verdict.tokens.tolist() == [[2, 4, 1, 5]]


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
@pytest.mark.parametrize(
    "tokens,expected",
    [([3, 4, 1], [2, -1, -1, -1]), ([2, 0, 1], [2, 4, -1, -1]), ([2, 4, 0], [2, 4, 1, -1])],
    ids=["at 0", "in the middle", "at the last"],
)
def test_mismatch_emits_the_targets_token_then_padding(acceptor, tokens, expected):
    d = draft([tokens])
    verdict = acceptor(d, SURE, gens(1))
    check_verdict_shape(verdict, d)
    assert verdict.num_accepted.tolist() == [sum(t != -1 for t in expected) - 1]
    assert verdict.tokens.tolist() == [expected]


def test_greedy_mismatch_emits_the_argmax_of_a_non_one_hot_target():
    p = rows(dist(t0=1, t3=5, t5=2), dist(t1=3, t2=1))
    verdict = GreedyAcceptor()(draft([[0]]), p, gens(1))
    assert verdict.tokens.tolist() == [[3, -1]] and verdict.num_accepted.tolist() == [0]
    verdict = GreedyAcceptor()(draft([[3]]), p, gens(1))
    assert verdict.tokens.tolist() == [[3, 1]] and verdict.num_accepted.tolist() == [1]


def test_rejection_emits_the_residuals_only_support():
    """p(d) = 0 forces a rejection; max(0, p - q) is non-zero only on token 2."""
    p = rows(dist(t1=1, t2=1), dist(t3=1))
    q = rows(dist(t0=1, t1=1))
    for seed in range(20):
        verdict = RejectionSampler()(draft([[0]], q), p, gens(1, seed))
        assert verdict.tokens.tolist() == [[2, -1]]
        assert verdict.num_accepted.tolist() == [0]


def test_rejection_in_the_middle_uses_that_positions_residual():
    p = rows(dist(t2=1), dist(t1=1, t4=1), dist(t5=1))
    q = rows(dist(t2=1), dist(t0=1, t4=1))  # d0 = 2 is sure; d1 = 0 has p = 0
    verdict = RejectionSampler()(draft([[2, 0]], q), p, gens(1))
    assert verdict.tokens.tolist() == [[2, 1, -1]]  # residual at 1 is only token 1


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
def test_k_zero_emits_one_token_from_p0(acceptor):
    p = torch.stack([one_hot(3)[None], one_hot(0)[None], one_hot(5)[None]])  # [3, 1, V]
    d = Draft(torch.zeros(3, 0, dtype=torch.long), None, torch.zeros(3, dtype=torch.long))
    verdict = acceptor(d, p, gens(3))
    check_verdict_shape(verdict, d)
    assert verdict.tokens.tolist() == [[3], [0], [5]]
    assert verdict.num_accepted.tolist() == [0, 0, 0]


def test_rejection_k_zero_samples_p0():
    p0 = dist(t1=1, t4=3)
    p = p0.expand(400, 1, V).contiguous()
    d = Draft(torch.zeros(400, 0, dtype=torch.long), None, torch.zeros(400, dtype=torch.long))
    tokens = RejectionSampler()(d, p, gens(400)).tokens[:, 0]
    assert set(tokens.tolist()) == {1, 4}
    assert 0.65 < (tokens == 4).float().mean().item() < 0.85


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
def test_ragged_batch_rows_accept_different_counts(acceptor):
    p = SURE.expand(4, -1, -1)
    d = draft([[2, 4, 1], [0, 4, 1], [2, 4, 3], [2, 0, 0]])
    verdict = acceptor(d, p, gens(4))
    check_verdict_shape(verdict, d)
    assert verdict.num_accepted.tolist() == [3, 0, 2, 1]
    assert verdict.tokens.tolist() == [
        [2, 4, 1, 5],
        [2, -1, -1, -1],
        [2, 4, 1, -1],
        [2, 4, -1, -1],
    ]


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
def test_positions_past_a_rows_length_are_never_accepted(acceptor):
    """Rows drafted 2, 0 and 1 of k = 3 tokens; the padded ones would all match."""
    p = SURE.expand(3, -1, -1)
    d = draft([[2, 4, 1], [2, 4, 1], [2, 4, 1]], SURE[:, :3].expand(3, -1, -1), [2, 0, 1])
    verdict = acceptor(d, p, gens(3))
    check_verdict_shape(verdict, d)
    assert verdict.num_accepted.tolist() == [2, 0, 1]
    # The next token comes from p at the row's length (the bonus position for that row).
    assert verdict.tokens.tolist() == [[2, 4, 1, -1], [2, -1, -1, -1], [2, 4, -1, -1]]


def test_rejection_past_length_draws_from_p_not_from_the_residual():
    """At a row's length, the token is a bonus from p: here p puts 0.9 on token 0 where the
    (padding) q is one-hot, so the residual would always give token 3."""
    p = rows(dist(t2=1), dist(t0=9, t3=1), dist(t5=1))
    q = rows(dist(t2=1), dist(t0=1))
    n = 200
    d = draft([[2, 0]] * n, q.expand(n, -1, -1), [1] * n)
    verdict = RejectionSampler()(d, p.expand(n, -1, -1), gens(n))
    assert (verdict.num_accepted == 1).all()
    second = verdict.tokens[:, 1]
    assert (second == 0).sum() > 150 and (second == 3).sum() > 0


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
def test_padding_after_the_emitted_token(acceptor):
    p = torch.softmax(torch.randn(5, 5, V, generator=torch.Generator().manual_seed(1)), -1)
    d = draft(torch.randint(0, V, (5, 4), generator=torch.Generator().manual_seed(2)).tolist())
    d.lengths = torch.tensor([4, 3, 0, 2, 1])
    verdict = acceptor(d, p, gens(5))
    check_verdict_shape(verdict, d)
    emitted = (verdict.tokens != -1).sum(1)
    assert emitted.tolist() == (verdict.num_accepted + 1).tolist()


def test_deterministic_draft_is_one_hot_q():
    """p(d) = 0.5: a one-hot q accepts half the time, a dense q with q(d) <= p(d) always."""
    n = 400
    p = rows(dist(t1=1, t3=1), dist(t0=1)).expand(n, -1, -1)
    tokens = [[1]] * n
    dense = RejectionSampler()(draft(tokens, rows(dist(t1=1, t2=3)).expand(n, -1, -1)), p, gens(n))
    assert (dense.num_accepted == 1).all()
    hard = RejectionSampler()(draft(tokens), p, gens(n))
    accepted = hard.num_accepted == 1
    assert 0.4 < accepted.float().mean().item() < 0.6
    # Rejected: the residual of a one-hot q at token 1 is p without token 1, i.e. token 3.
    assert (hard.tokens[~accepted, 0] == 3).all()
    assert (hard.tokens[accepted] == torch.tensor([1, 0])).all()


@pytest.mark.parametrize("dense_q", [True, False])
def test_token_with_zero_target_probability_is_never_accepted_nor_recovered(dense_q):
    g = torch.Generator().manual_seed(5)
    n, k = 300, 3
    p = torch.softmax(torch.randn(n, k + 1, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(n, k, V, generator=g) * 2, -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(n, k)
    p[:, :k].scatter_(2, tokens[..., None], 0.0)  # p(d_i) = 0 at every draft position
    p = p / p.sum(-1, keepdim=True)
    d = Draft(tokens, q if dense_q else None, torch.full((n,), k))
    verdict = RejectionSampler()(d, p, gens(n))
    assert (verdict.num_accepted == 0).all()
    assert (verdict.tokens[:, 0] != tokens[:, 0]).all()
    assert (p[torch.arange(n), 0, verdict.tokens[:, 0]] > 0).all()


def test_p_equal_q_accepts_everything():
    g = torch.Generator().manual_seed(6)
    n, k = 500, 4
    p = torch.softmax(torch.randn(n, k + 1, V, generator=g) * 3, -1)
    q = p[:, :k].clone()
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(n, k)
    verdict = RejectionSampler()(Draft(tokens, q, torch.full((n,), k)), p, gens(n))
    assert (verdict.num_accepted == k).all()
    assert (verdict.tokens[:, :k] == tokens).all()


@pytest.mark.parametrize("acceptor", ALL, ids=ids)
@pytest.mark.parametrize("dense_q", [True, False])
def test_acceptors_do_not_modify_their_inputs(acceptor, dense_q):
    g = torch.Generator().manual_seed(7)
    n, k = 8, 3
    p = torch.softmax(torch.randn(n, k + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1) if dense_q else None
    tokens = torch.randint(0, V, (n, k), generator=g)
    lengths = torch.tensor([3, 2, 1, 0, 3, 3, 1, 2])
    before = [t.clone() for t in (p, tokens, lengths) + ((q,) if dense_q else ())]
    d = Draft(tokens, q, lengths)
    verdict = acceptor(d, p, gens(n))
    check_verdict_shape(verdict, d)
    after = [p, tokens, lengths] + ([q] if dense_q else [])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert d.probs is q and d.tokens is tokens and d.lengths is lengths


def test_rejection_rows_depend_on_their_own_generator_only():
    g = torch.Generator().manual_seed(8)
    n, k = 6, 3
    p = torch.softmax(torch.randn(n, k + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1)
    tokens = torch.randint(0, V, (n, k), generator=g)
    batched = RejectionSampler()(Draft(tokens, q, torch.full((n,), k)), p, gens(n, 100))
    for b in range(n):
        alone = RejectionSampler()(
            Draft(tokens[b : b + 1], q[b : b + 1], torch.tensor([k])),
            p[b : b + 1],
            [torch.Generator().manual_seed(100 + b)],
        )
        assert alone.tokens[0].tolist() == batched.tokens[b].tolist()


def test_typical_acceptance_threshold():
    """Kept when p(d) > min(epsilon, delta * exp(-H(p)))."""
    uniform = torch.full((V,), 1 / V)  # H = ln 6: threshold = 0.09 / 6 = 0.015
    peaked = dist(t0=6, t1=3, t2=1)  # H ~ 0.90: threshold = 0.09 * 0.41 ~ 0.037
    h = -(peaked * peaked.log().nan_to_num(neginf=0)).sum().item()
    assert 0.015 < min(0.3, 0.09 * math.exp(-h)) < 0.1
    p = rows(uniform, peaked, one_hot(4))
    acceptor = LossyTypicalAcceptor()
    verdict = acceptor(draft([[5, 2]]), p, gens(1))  # both above the threshold
    assert verdict.tokens.tolist() == [[5, 2, 4]]
    verdict = acceptor(draft([[5, 3]]), p, gens(1))  # p(3) = 0 at position 1
    assert verdict.num_accepted.tolist() == [1] and verdict.tokens[0, 1].item() in (0, 1, 2)
    strict = LossyTypicalAcceptor(epsilon=0.12, delta=1.0)  # thresholds 0.12 and 0.12
    verdict = strict(draft([[5, 2]]), p, gens(1))
    assert verdict.num_accepted.tolist() == [1] and verdict.tokens[0, 2].item() == -1
    # Rejection sampling with a q that over-proposes token 1 rejects it 70% of the time;
    # typical acceptance keeps it whatever q says: it is lossy.
    n = 64
    d = draft([[5, 1]] * n, rows(uniform, dist(t1=1)).expand(n, -1, -1))
    typical = acceptor(d, p.expand(n, -1, -1), gens(n))
    exact = RejectionSampler()(d, p.expand(n, -1, -1), gens(n))
    assert (typical.num_accepted == 2).all() and (exact.num_accepted < 2).sum() > n // 3


def test_lossless_flags_and_names():
    assert GreedyAcceptor.lossless and RejectionSampler.lossless
    assert LossyTypicalAcceptor.lossless is False
    for cls in ACCEPTORS.values():
        assert isinstance(cls(), TokenAcceptor)
        assert cls.lossless == ("Lossy" not in cls.__name__)
    assert ACCEPTORS["typical"] is LossyTypicalAcceptor


# ---- cost model -----------------------------------------------------------------------


def test_expected_tokens():
    assert expected_tokens([0.9], 0) == 1.0
    assert expected_tokens([], 5) == 1.0
    assert expected_tokens([0.0] * 4, 4) == 1.0
    assert expected_tokens([1.0] * 4, 4) == 5.0
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1.875)
    a, k = 0.7, 6  # the equal-alpha closed form (1 - a^(k+1)) / (1 - a)
    assert expected_tokens([a] * k, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    # Conditional alphas multiply; positions past the list reuse the last alpha.
    assert expected_tokens([1.0, 0.5], 4) == pytest.approx(1 + 1 + 0.5 + 0.25 + 0.125)


def _costs(draft_s: float, verify_per_token: float = 0.01, rows: int = 1) -> CostModel:
    costs = CostModel()
    for t in range(1, 10):  # verify of t tokens: 1 + 0.01 (t - 1) seconds
        costs.observe_verify(rows, t, 1.0 + verify_per_token * (t - 1))
    costs.observe_draft(rows, 4, 4 * draft_s)
    return costs


def test_best_window():
    assert _costs(0.01).best_window(1, [0.0] * 8, 8) == (0, 1.0)
    k, speedup = _costs(0.01).best_window(1, [0.95] * 8, 8)
    assert k == 8
    assert speedup == pytest.approx(expected_tokens([0.95] * 8, 8) / (8 * 0.01 + 1.08))
    # An expensive drafter never pays.
    assert _costs(2.0).best_window(1, [0.95] * 8, 8)[0] == 0
    # Middling acceptance, costly draft: a short window wins.
    k, speedup = _costs(0.3).best_window(1, [0.6] * 8, 8)
    rates = [expected_tokens([0.6] * 8, j) / (j * 0.3 + 1 + 0.01 * j) for j in range(9)]
    assert k == max(range(9), key=rates.__getitem__) and 0 < k < 8
    assert speedup == pytest.approx(rates[k] / rates[0])
    # Nothing measured at all: plain decoding.
    assert CostModel().best_window(2, [0.95] * 8, 8) == (0, 1.0)
    # Verify costs are keyed by total new tokens, so batch 1's measurements serve batch 3.
    costs = _costs(0.01)
    assert costs.verify_time(3, 3) == costs.verify_time(1, 9)
    assert costs.draft_time(3) == pytest.approx(0.01)  # one measured batch size: reused


def test_cost_model_interpolates_and_averages():
    costs = CostModel()
    assert costs.verify_time(1, 3) is None
    costs.observe_verify(1, 1, 1.0)
    assert costs.verify_time(1, 9) == 1.0
    costs.observe_verify(1, 5, 2.0)
    assert costs.verify_time(1, 3) == pytest.approx(1.5)
    assert costs.verify_time(1, 9) == pytest.approx(3.0)  # extrapolated
    costs.observe_verify(1, 1, 2.0)  # a shape's first timings: the fastest kept
    assert costs.verify_time(1, 1) == 1.0
    costs.observe_verify(1, 1, 1.0)
    costs.observe_verify(1, 1, 2.0)  # then a running average (new weight 0.2) ...
    pace = 2.0 ** WindowConfig().ema  # ... at the host's pace, which this timing moved
    assert costs.pace == pytest.approx(pace)
    plain = 0.8 * 1.0 + 0.2 * 2.0 / pace  # seconds at pace 1
    assert costs.verify_time(1, 1) == pytest.approx(pace * plain)
    assert costs.predict(1, [0.5], 2) is None  # no draft cost yet
    costs.observe_draft(1, 2, 0.2 * pace)  # 0.1 s per draft token at pace 1
    three = (plain + 2.0) / 2  # between the plain step and 2.0 at 5, at pace 1
    assert costs.verify_time(1, 3) == pytest.approx(pace * three)
    assert costs.predict(1, [0.5], 2) == pytest.approx(1.75 / (pace * (2 * 0.1 + three)))


# ---- SpecStats ------------------------------------------------------------------------


def test_spec_stats():
    s = SpecStats(requests=1)
    assert s.mean_accepted_length == 1.0 and s.acceptance_rate == 0.0
    s.record_step(3, 2)
    s.record_step(3, 3)
    s.record_step(0, 0)
    s.record_step(2, 0)
    assert (s.steps, s.drafts, s.drafted, s.accepted) == (4, 3, 8, 5)
    assert s.acceptance_rate == pytest.approx(5 / 8)
    assert s.mean_accepted_length == pytest.approx(1 + 5 / 4)
    assert s.drafted_at == [3, 3, 2] and s.accepted_at == [2, 2, 1]
    assert s.acceptance_per_position == pytest.approx([2 / 3, 2 / 3, 1 / 2])

    other = SpecStats(requests=1)
    other.record_step(5, 5)
    total = s + other
    assert (total.steps, total.drafted, total.accepted, total.requests) == (5, 13, 10, 2)
    assert total.drafted_at == [4, 4, 3, 1, 1] and total.accepted_at == [3, 3, 2, 1, 1]
    assert total.mean_accepted_length == pytest.approx(1 + 10 / 5)
    assert total.acceptance_rate == pytest.approx(10 / 13)
    assert (other + s).drafted_at == total.drafted_at
    assert s.drafted_at == [3, 3, 2]  # + does not modify its operands

    plain = SpecStats()
    for _ in range(3):
        plain.record_step(0, 0)
    assert plain.mean_accepted_length == 1.0 and plain.acceptance_per_position == []
