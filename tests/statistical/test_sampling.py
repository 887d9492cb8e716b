"""Temperature, top-k and top-p do what SamplingParams documents, and sampling follows the
resulting distribution (chi-square on a small vocabulary)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.errors import InvalidParameterError
from specdec.params import SamplingParams
from specdec.sampling import draw, make_generator, param_tensors, probs_from_logits, sample

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])


def _expected(temperature, top_k, top_p):
    """Reference: written independently of the implementation, in numpy."""
    z = LOGITS.numpy().astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    keep[order[: top_k or len(p)]] = True
    p = np.where(keep, p, 0)
    p /= p.sum()
    mass = 0.0
    nucleus = np.zeros_like(keep)
    for i in order:
        if mass >= top_p:
            break
        nucleus[i] = keep[i]
        mass += p[i]
    p = np.where(nucleus, p, 0)
    return p / p.sum()


CASES = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (0.7, 4, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_probs_match_reference(temperature, top_k, top_p):
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)]
    probs = probs_from_logits(LOGITS[None], *param_tensors(params))[0]
    np.testing.assert_allclose(probs.numpy(), _expected(temperature, top_k, top_p), atol=1e-6)


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    # p = [0.5, 0.3, 0.2]: top_p=0.6 needs the first two tokens.
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    probs = probs_from_logits(logits, *param_tensors([SamplingParams(top_p=0.6)]))[0]
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0]))


def test_greedy_rows_are_one_hot_and_rows_are_independent():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=2)]
    probs = probs_from_logits(logits, *param_tensors(params))
    assert probs[0].tolist() == [1.0, 0, 0, 0, 0, 0]
    assert (probs[1][:4] == 0).all() and probs[1][4:].sum().item() == pytest.approx(1.0)


def test_an_all_greedy_batch_takes_the_same_one_hot_rows():
    """The all-greedy shortcut (no softmax) gives what a mixed batch gives its greedy rows."""
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS.roll(2)])[:, :5]  # a vocab slice
    greedy = [SamplingParams(temperature=0, top_k=3, top_p=0.5)] * 3
    mixed = greedy[:2] + [SamplingParams(temperature=1.0)]
    alone = probs_from_logits(logits, *param_tensors(greedy))
    assert torch.equal(alone[:2], probs_from_logits(logits, *param_tensors(mixed))[:2])
    assert alone.sum(-1).tolist() == [1.0] * 3 and alone.argmax(-1).tolist() == [
        int(row.argmax()) for row in logits
    ]


def test_draw_follows_the_distribution_and_never_draws_a_zero():
    """The inverse-CDF draw: zero-probability tokens (leading, between, trailing) never
    come out, and the rest follow p (unnormalised input is fine)."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.0, 1.5, 0.25, 0.0, 1e-3, 0.0])
    g = make_generator(5)
    counts = np.bincount([int(draw(probs, g)) for _ in range(20_000)], minlength=len(probs))
    assert counts[(probs == 0).numpy()].sum() == 0
    shown = (probs > 0).numpy()
    expected = (probs / probs.sum()).numpy()[shown] * counts.sum()
    assert chisquare(counts[shown], expected).pvalue > 1e-3


def _empirical(probs, n, seed):
    gens = [make_generator(seed)] * n
    tokens = sample(probs[None].expand(n, -1), gens, [False] * n)
    return np.bincount(tokens.numpy(), minlength=probs.shape[0])


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_samples_follow_the_distribution(temperature, top_k, top_p):
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)]
    probs = probs_from_logits(LOGITS[None], *param_tensors(params))[0]
    counts = _empirical(probs, 20_000, seed=11)
    support = probs > 0
    assert counts[~support.numpy()].sum() == 0  # never outside top-k / nucleus
    expected = _expected(temperature, top_k, top_p)[support.numpy()] * counts.sum()
    assert chisquare(counts[support.numpy()], expected).pvalue > 1e-3


def test_the_chi_square_check_catches_a_wrong_temperature():
    """The same test, fed samples at temperature 0.7 against the 1.0 reference, fails."""
    wrong = probs_from_logits(LOGITS[None], *param_tensors([SamplingParams(temperature=0.7)]))[0]
    counts = _empirical(wrong, 20_000, seed=11)
    assert chisquare(counts, _expected(1.0, 0, 1.0) * counts.sum()).pvalue < 1e-6


def test_seeded_generators_reproduce():
    probs = torch.softmax(LOGITS, 0)[None].expand(50, -1)
    a = sample(probs, [make_generator(5)] * 50, [False] * 50)
    b = sample(probs, [make_generator(5)] * 50, [False] * 50)
    c = sample(probs, [make_generator(6)] * 50, [False] * 50)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"seed": -3}, "seed must be in"),
        ({"stop": ["ok", ""]}, "stop strings must be non-empty"),
    ],
)
def test_impossible_parameters_are_refused(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        SamplingParams(**kwargs)
