"""End to end through `Engine`: speculative sampling emits the same sequence distribution as
plain sampling of the target.

Tiny random fp32 models whose lm_head is scaled up so that next-token distributions are
concentrated; the draft is the target with noise on every weight, so p and q overlap
(acceptance ~0.45-0.5) without being equal, and both the accept and the residual paths are
taken. Many seeded requests of a fixed prompt sample short continuations, once plainly and
once speculatively (k = 3), and a chi-square homogeneity test compares the two empirical
joint distributions. The two arms use disjoint seeds: with equal seeds both arms would
draw the same first token (the prefill is plain sampling in both), and the samples would not
be independent. A biased acceptor in the same engine fails the same test.
"""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from specdec.acceptors import RejectionSampler, Verdict
from specdec.config import SamplingParams
from specdec.cost_model import FixedWindow
from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine

from tiny import hf_tiny, native_from_hf

PROMPT = [5, 17, 42, 8]
N = 6144  # requests per arm
MAX_BATCH = 64
PASS, FAIL = 1e-3, 1e-6
SHARPEN = 15.0  # lm_head scale: logits with std ~2.4 instead of ~0.16
NOISE = 0.15  # draft weights = target weights + NOISE * std(weight) * N(0, 1)

# The engine drafts at most max_tokens - 1 - (tokens so far) per row, so a 3-token request
# speculates one draft token (plus the bonus) after the prefill's first token.
CASES = {
    "top-k 4, 3 tokens": dict(top_k=4, max_tokens=3),
    "t 0.7, top-p 0.9, 3 tokens": dict(temperature=0.7, top_p=0.9, max_tokens=3),
    # Four tokens: some requests take a second speculative step after a rejection, which
    # exercises the draft model's rollback and pending tokens.
    "top-k 3, 4 tokens": dict(top_k=3, max_tokens=4),
}


def sharp_tiny():
    hf = hf_tiny("llama", seed=0)
    with torch.no_grad():
        hf.lm_head.weight.mul_(SHARPEN)
    return hf


@pytest.fixture(scope="module")
def models():
    # A second copy for the draft: `native_from_hf` shares storage with the HF weights.
    target, draft = sharp_tiny(), sharp_tiny()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NOISE * p.std())
    return native_from_hf(target), native_from_hf(draft)


def sequences(engine: Engine, sampling: dict, first_seed: int) -> Counter:
    params = [SamplingParams(seed=first_seed + i, ignore_eos=True, **sampling) for i in range(N)]
    out = engine.generate([PROMPT] * N, params)
    assert all(len(c.token_ids) == sampling["max_tokens"] for c in out)
    counts = Counter(tuple(c.token_ids) for c in out)
    drafted = sum(c.stats.drafted for c in out)
    counts["acceptance"] = sum(c.stats.accepted for c in out) / max(drafted, 1)
    return counts


def plain_engine(target, tokenizer) -> Engine:
    return Engine(target, tokenizer, frozenset(), max_batch=MAX_BATCH)


def spec_engine(target, draft, tokenizer, acceptor) -> Engine:
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=MAX_BATCH,
        drafter_factory=lambda b, n: DraftModelDrafter(draft, 97, 97, b, n),
        acceptor=acceptor,
        window=FixedWindow(3),
    )


def homogeneity(a: Counter, b: Counter, min_count: int = 10) -> float:
    """p-value of chi-square homogeneity; outcomes rarer than `min_count` in both arms
    together are pooled into one cell."""
    outcomes = sorted((set(a) | set(b)) - {"acceptance"})
    common = [o for o in outcomes if a[o] + b[o] >= min_count]
    rare = [o for o in outcomes if a[o] + b[o] < min_count]
    table = [[a[o] for o in common], [b[o] for o in common]]
    if rare:
        table[0].append(sum(a[o] for o in rare))
        table[1].append(sum(b[o] for o in rare))
    return float(chi2_contingency(np.array(table)).pvalue)


@pytest.fixture(scope="module")
def plain_counts(models, tokenizer):
    """The plain arm of each case, computed once (seeds 0 .. N-1)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = sequences(plain_engine(models[0], tokenizer), CASES[name], 0)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_speculative_sampling_matches_plain_sampling(models, tokenizer, plain_counts, name):
    target, draft = models
    plain = plain_counts(name)
    spec = sequences(spec_engine(target, draft, tokenizer, RejectionSampler()), CASES[name], N)
    value = homogeneity(plain, spec)
    print(name, f"p = {value:.3g}", f"outcomes {len(plain) - 1}", f"acc {spec['acceptance']}")
    assert value > PASS
    assert 0.2 < spec["acceptance"] < 0.8  # both the accept and the residual paths are taken
    if name.startswith("top-k 4"):
        assert len(set(plain) | set(spec)) - 1 <= 4**3


# ---- a biased acceptor in the same engine fails the same test --------------------------


class ResampleFromPLossy:
    """Decides acceptance like rejection sampling, but at a rejection draws from p instead of
    the residual max(0, p - q)."""

    lossless = False

    def __call__(self, draft, target_probs, generators) -> Verdict:
        verdict = RejectionSampler()(draft, target_probs, generators)
        n = verdict.num_accepted
        rows = torch.arange(len(n))
        p_next = target_probs[rows, n]  # [B, V]
        resampled = torch.cat(
            [torch.multinomial(p_next[b], 1, generator=g) for b, g in enumerate(generators)]
        )
        tokens = verdict.tokens.clone()
        rejected = n < draft.lengths
        tokens[rows, n] = torch.where(rejected, resampled, tokens[rows, n])
        return Verdict(tokens, n)


class AlwaysAcceptLossy:
    """Keeps every draft token; samples the bonus token from p (so its prefill is right)."""

    lossless = False

    def __call__(self, draft, target_probs, generators) -> Verdict:
        k = draft.k
        bonus = torch.cat(
            [
                torch.multinomial(target_probs[b, k], 1, generator=g)
                for b, g in enumerate(generators)
            ]
        )
        return Verdict(torch.cat([draft.tokens, bonus[:, None]], 1), draft.lengths.clone())


@pytest.mark.parametrize(
    "acceptor,name",
    [
        (ResampleFromPLossy, "top-k 4, 3 tokens"),
        (ResampleFromPLossy, "t 0.7, top-p 0.9, 3 tokens"),
        (AlwaysAcceptLossy, "top-k 4, 3 tokens"),
    ],
)
def test_biased_acceptor_fails(models, tokenizer, plain_counts, acceptor, name):
    target, draft = models
    spec = sequences(spec_engine(target, draft, tokenizer, acceptor()), CASES[name], N)
    value = homogeneity(plain_counts(name), spec)
    print(acceptor.__name__, name, f"p = {value:.3g}")
    assert value < FAIL
