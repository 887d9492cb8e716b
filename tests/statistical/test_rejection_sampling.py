"""Rejection sampling is lossless: the tokens it emits are distributed as the target's p.

Small vocabulary (V = 6), k = 2, fixed seeds. For each case the target and draft logits go
through the same `probs_from_logits` transform (the request's temperature / top-k / top-p),
draft tokens are sampled from q, and a chi-square goodness-of-fit test checks that

- the first emitted token is distributed as p[0];
- given that the first draft token was accepted, the second emitted token is as p[1];
- given that both were accepted, the bonus token is as p[2].

The same check run on deliberately biased acceptors fails by many orders of magnitude, so
the test has the power to see a wrong implementation.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.acceptors import (
    Draft,
    LossyTypicalAcceptor,
    RejectionSampler,
    Verdict,
    _assemble,
    _draft_token_probs,
    _first_rejection,
    _q_at,
    _uniforms,
)
from specdec.params import SamplingParams
from specdec.sampling import param_tensors, probs_from_logits, sample

V, K = 6, 2
N = 60_000  # rows per case: the acceptor loops over rows in Python (~25 us a row)
PASS = 1e-3  # the correct sampler's p-values must stay above this (fixed seeds)
FAIL = 1e-12  # a biased acceptor's p-value must fall below this

TARGET = torch.tensor(  # logits [k+1, V]
    [
        [1.0, 0.3, -0.5, 2.0, 0.0, -1.0],
        [-0.5, 1.5, 0.5, 0.0, -2.0, 1.0],
        [0.2, -1.0, 1.2, 0.4, 0.9, -0.3],
    ]
)
NEAR = torch.tensor(  # a draft that roughly agrees with the target
    [
        [0.5, 1.0, 0.7, 1.5, -0.5, 0.0],
        [0.6, 0.8, 1.5, -0.5, -1.0, 0.5],
    ]
)
FAR = torch.tensor(  # a draft that puts its mass where the target puts little
    [
        [-1.0, 1.5, 2.5, -3.0, 0.5, 3.0],
        [3.0, -2.0, -1.0, 2.0, 2.5, -3.0],
    ]
)


def transform(logits: torch.Tensor, **sampling) -> torch.Tensor:
    """The engine's transform, one row per position: `[T, V]` -> `[T, V]`."""
    params = [SamplingParams(**sampling)] * logits.shape[0]
    return probs_from_logits(logits, *param_tensors(params))


def run(acceptor, p, q, seed, deterministic=False, n=N) -> tuple[Verdict, torch.Tensor]:
    """`n` rows of one step: draft tokens sampled from q, verified against p."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(q, n, replacement=True, generator=g).T.contiguous()  # [n, k]
    probs = None if deterministic else q.expand(n, -1, -1)
    draft = Draft(tokens, probs, torch.full((n,), q.shape[0]))
    return acceptor(draft, p.expand(n, -1, -1), [g] * n), tokens


def pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square goodness of fit of `tokens` to `p` (tokens outside p's support: p = 0)."""
    counts = np.bincount(tokens.numpy(), minlength=V)
    support = (p > 0).numpy()
    if counts[~support].any():
        return 0.0
    expected = p.double().numpy()[support]
    return float(chisquare(counts[support], expected / expected.sum() * counts.sum()).pvalue)


def pvalues(verdict: Verdict, p: torch.Tensor) -> list[float]:
    """First token vs p[0]; second given d0 accepted vs p[1]; bonus given all accepted."""
    n = verdict.num_accepted
    out = [pvalue(verdict.tokens[:, 0], p[0])]
    for i in range(1, K + 1):
        reached = n >= i
        assert reached.sum() > 2_000, "too few rows reach this position to test it"
        out.append(pvalue(verdict.tokens[reached, i], p[i]))
    return out


CASES = {
    "temperature 1.0": (dict(temperature=1.0), NEAR, False),
    "temperature 0.7": (dict(temperature=0.7), NEAR, False),
    "top-p 0.8": (dict(top_p=0.8), NEAR, False),
    "top-k 3": (dict(top_k=3), NEAR, False),
    "t 0.7, top-k 4, top-p 0.9": (dict(temperature=0.7, top_k=4, top_p=0.9), NEAR, False),
    "p == q": (dict(temperature=1.0), TARGET[:K], False),
    "q far from p": (dict(temperature=1.0), FAR, False),
    "deterministic draft": (dict(temperature=1.0), NEAR, True),
    # q is one-hot at NEAR's argmax: every row proposes the same tokens (3, then 2).
    "deterministic draft, fixed tokens": (dict(temperature=1.0), NEAR * 1000, True),
}


def case(name):
    sampling, draft_logits, deterministic = CASES[name]
    return transform(TARGET, **sampling), transform(draft_logits, **sampling), deterministic


@pytest.mark.parametrize("name", list(CASES))
def test_emitted_tokens_follow_the_target(name):
    p, q, deterministic = case(name)
    seed = list(CASES).index(name)
    verdict, _ = run(RejectionSampler(), p, q, seed, deterministic)
    n = verdict.num_accepted
    values = pvalues(verdict, p)
    print(name, [f"{v:.3g}" for v in values])
    assert min(values) > PASS, values
    if name == "p == q":
        assert (n == K).all()
    if name == "q far from p":  # the residual path carries most of the mass
        assert (n == 0).float().mean() > 0.5
        assert (n < K).float().mean() > 0.8
    if "top" in name:  # the draft proposes tokens that the target's filter removed
        assert ((q > 0) & (p[:K] == 0)).any()


# ---- the same check has power: biased acceptors fail it --------------------------------


class _Biased(RejectionSampler):
    """RejectionSampler with one step done wrong; `accept_prob` and `recover` are the hooks."""

    def accept_prob(self, p_draft, q_draft):  # [B, k] -> [B, k]
        return (p_draft / q_draft).clamp(max=1)

    def recover(self, p_next, q_next):  # [B, V] -> [B, V] (unnormalised)
        return (p_next - q_next).clamp_min(0)

    def __call__(self, draft, target_probs, generators):
        B, k = draft.tokens.shape
        p_draft = target_probs[:, :k].gather(2, draft.tokens[..., None])[..., 0]
        q_draft = _draft_token_probs(draft.probs, draft.tokens)
        u = _uniforms(k, generators, target_probs.device)
        n = _first_rejection(u < self.accept_prob(p_draft, q_draft), draft.lengths)
        p_next = target_probs[torch.arange(B), n]
        rejected = n < draft.lengths
        recovered = self.recover(p_next, _q_at(draft, n.clamp(max=k - 1), V))
        mass = recovered.sum(-1, keepdim=True)
        recovered = torch.where(mass > 0, recovered / mass.clamp_min(1e-30), p_next)
        p_next = torch.where(rejected[:, None], recovered, p_next)
        return _assemble(draft, n, sample(p_next, generators))


class FaithfulCopy(_Biased):
    """Control: the hooks as the algorithm has them (the copy itself must pass)."""


class ResampleFromP(_Biased):
    """At a rejection, draws from p instead of the residual max(0, p - q)."""

    def recover(self, p_next, q_next):
        return p_next


class SwappedResidual(_Biased):
    """Uses max(0, q - p): the letters of gpt-fast / Chen et al. read the wrong way round."""

    def recover(self, p_next, q_next):
        return (q_next - p_next).clamp_min(0)


class AcceptWithP(_Biased):
    """Accepts with probability p(d) instead of min(1, p(d) / q(d))."""

    def accept_prob(self, p_draft, q_draft):
        return p_draft


class AlwaysAccept(_Biased):
    """Keeps every draft token."""

    def accept_prob(self, p_draft, q_draft):
        return torch.ones_like(p_draft)


def test_faithful_copy_of_the_algorithm_passes():
    p, q, _ = case("temperature 1.0")
    verdict, _ = run(FaithfulCopy(), p, q, seed=100, n=N // 2)
    assert min(pvalues(verdict, p)) > PASS


@pytest.mark.parametrize("biased", [ResampleFromP, SwappedResidual, AcceptWithP, AlwaysAccept])
def test_biased_acceptors_fail(biased):
    """Half the rows of the passing case, and still a p-value below FAIL."""
    p, q, _ = case("temperature 1.0")
    verdict, _ = run(biased(), p, q, seed=0, n=N // 2)
    first = pvalue(verdict.tokens[:, 0], p[0])
    print(biased.__name__, f"{first:.3g}")
    assert first < FAIL
    if biased is ResampleFromP:  # given d0 accepted, position 1 is biased the same way
        second = pvalues(verdict, p)[1]
        print(biased.__name__, "second token", f"{second:.3g}")
        assert second < FAIL


def test_typical_acceptance_is_indeed_lossy():
    p, q, _ = case("temperature 1.0")
    verdict, _ = run(LossyTypicalAcceptor(), p, q, seed=0, n=N // 4)
    value = pvalue(verdict.tokens[:, 0], p[0])
    print("LossyTypicalAcceptor", f"{value:.3g}")
    assert value < FAIL
