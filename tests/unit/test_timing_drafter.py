"""The acceptance-controlled drafter (benchmarks only): on a tiny fp32 target its drafts
are kept at each position with the chosen conditional probability (a chi-square test that
a wrong profile fails), the greedy output is the plain output, rows joining and leaving
keep their records, and the cost drafter it runs sees every call."""

import pytest
import torch

from specdec.bench.timing_drafter import (
    PROFILES,
    AcceptanceControlledDrafter,
    check_profile,
    profile_chi_square,
    realised_acceptance,
    records_from,
)
from specdec.drafters import EagleDrafter
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.heads.eagle import build_eagle
from specdec.params import SamplingParams
from specdec.window import FixedWindow, conditional_acceptance

from tiny import hf_tiny, native_from_hf, staggered

N = 48  # new tokens per request
K = 4
PROFILE = (0.9, 0.6, 0.75, 0.5)
# Pearson's chi-square, 4 degrees of freedom: P(X > 18.47) = 0.001.
CHI2_4_P001 = 18.47


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("qwen2"))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (3, 7, 5, 11, 4, 9)]
    params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    plain = Engine(target, tokenizer, frozenset(), max_batch=6).generate(prompts, params)
    return target, prompts, params, records_from(prompts, [c.token_ids for c in plain])


def run(setup, tokenizer, profile, seed=0, max_batch=6, head=None, arrive_one_by_one=False):
    target, prompts, params, records = setup
    drafters = []

    def factory(rows, length):
        cost = None if head is None else EagleDrafter(head, rows, length)
        drafters.append(
            AcceptanceControlledDrafter(records, profile, 97, cost=cost, n_predict=K, seed=seed)
        )
        return drafters[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        window=FixedWindow(K),
    )
    if arrive_one_by_one:
        seqs = staggered(engine, prompts, [params] * len(prompts))
    else:
        seqs = [engine.add_request(p, params) for p in prompts]
        while engine.has_work:
            engine.step()
    return [s.output_ids for s in seqs], [s.trace for s in seqs], drafters


def test_realised_acceptance_follows_the_profile_and_output_stays_plain(setup, tokenizer):
    records = setup[3]
    reached, kept = [0] * K, [0] * K
    for seed in range(3):  # ~280 drafts reach the first position
        outputs, traces, drafters = run(setup, tokenizer, PROFILE, seed=seed)
        assert outputs == list(records.values())  # lossless, as any drafter
        assert drafters[0].off_record == 0  # fp32: verify passes round as plain ones
        r, k = realised_acceptance(traces)
        reached = [a + b for a, b in zip(reached, r, strict=True)]
        kept = [a + b for a, b in zip(kept, k, strict=True)]
    assert reached[0] > 250 and reached[-1] > 80
    statistic, dof = profile_chi_square(reached, kept, PROFILE)
    assert dof == K and statistic < CHI2_4_P001, (kept, reached)
    # a wrong profile fails the same counts: one position off by 0.15, or all a bit low
    for wrong in ((0.9, 0.75, 0.75, 0.5), (0.8, 0.5, 0.65, 0.4)):
        assert profile_chi_square(reached, kept, wrong)[0] > CHI2_4_P001, wrong


def test_a_drafter_with_another_profile_fails_the_check(setup, tokenizer):
    """The check judges the drafter, not only the numbers: drafts made with the
    profile shifted fail against the profile claimed."""
    shifted = tuple(a - 0.15 for a in PROFILE)
    _, traces, _ = run(setup, tokenizer, shifted)
    reached, kept = realised_acceptance(traces)
    assert profile_chi_square(reached, kept, PROFILE)[0] > CHI2_4_P001
    assert profile_chi_square(reached, kept, shifted)[0] < CHI2_4_P001


def test_extremes_keep_all_or_nothing(setup, tokenizer):
    for alpha, want in ((1.0, 1.0), (0.0, 0.0)):
        outputs, traces, _ = run(setup, tokenizer, (alpha,))
        assert outputs == list(setup[3].values())
        reached, kept = realised_acceptance(traces)
        assert kept[0] == want * reached[0]
        assert profile_chi_square(reached, kept, (alpha,))[0] == 0.0


def test_rows_joining_and_leaving_keep_their_records_with_a_head_paying_the_cost(setup, tokenizer):
    """Requests arrive one per step into 3 rows; finished rows leave and are refilled.
    The eagle head runs every step (its proposals discarded) on the same rows."""
    target = setup[0]
    head = build_eagle(target, intermediate_size=48, n_predict=K).eval()
    calls = []
    propose = EagleDrafter.propose

    def counted(self, k, params, generators):
        draft = propose(self, k, params, generators)
        calls.append((self.rows, draft.k))
        return draft

    EagleDrafter.propose = counted
    try:
        outputs, traces, drafters = run(
            setup, tokenizer, (0.7,), max_batch=3, head=head, arrive_one_by_one=True
        )
    finally:
        EagleDrafter.propose = propose
    assert outputs == list(setup[3].values())
    assert drafters[0].off_record == 0 and drafters[0].rows == 0
    # every step ran the head, K tokens (none where no row could use a draft: its last)
    assert {k for _, k in calls} == {0, K} and {r for r, _ in calls} == {1, 2, 3}
    reached, kept = realised_acceptance(traces)
    statistic, dof = profile_chi_square(reached, kept, (0.7,))
    assert dof == K and statistic < CHI2_4_P001


def test_a_run_that_leaves_its_record_is_counted(setup, tokenizer):
    target, prompts, params, records = setup
    bent = {p: [(t + 1) % 97 for t in c] for p, c in records.items()}  # a wrong record
    drafter = AcceptanceControlledDrafter(bent, (1.0,), 97, n_predict=K)
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=6,
        drafter_factory=lambda rows, length: drafter,
        window=FixedWindow(K),
    )
    outputs = [c.token_ids for c in engine.generate(prompts, params)]
    assert outputs == list(records.values())
    assert drafter.off_record == len(prompts)


def test_bad_profiles_and_unknown_prompts_are_refused():
    with pytest.raises(InvalidParameterError):
        check_profile([])
    with pytest.raises(InvalidParameterError):
        check_profile([0.5, 1.2])
    drafter = AcceptanceControlledDrafter({(1, 2): [3, 4]}, (0.5,), 97)
    with pytest.raises(InvalidParameterError, match="no recorded continuation"):
        drafter.admit([[9, 9, 3]])


def test_the_named_profiles_are_conditional_acceptance():
    """The eagle profiles are the ratios of their sources' figures (see PROFILES)."""
    per_pass = [1.6261, 1.9955, 2.2315, 2.3876, 2.495]
    unconditional = [b - a for a, b in zip([1.0, *per_pass], per_pass, strict=False)]
    assert PROFILES["eagle-chat"] == pytest.approx(conditional_acceptance(unconditional), abs=1e-4)
    engine = conditional_acceptance([0.471, 0.2353, 0.0977])
    assert PROFILES["eagle-chat-engine"] == pytest.approx(engine, abs=1e-4)
