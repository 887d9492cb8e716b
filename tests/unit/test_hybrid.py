"""The suffix hybrid (`drafters.hybrid`): its spelling, the powers it forwards, which rows
take the suffix's draft and with which q, and a draft model catching up on tokens it did
not draft."""

import pytest
import torch

from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.drafters.base import DrafterPowers, UsesPrefixCache
from specdec.drafters.hybrid import hybrid
from specdec.drafters.kinds import DraftSpec, parse_draft
from specdec.drafters.suffix import SuffixDrafter, SuffixStore
from specdec.engine_args import EngineArgs
from specdec.errors import InvalidParameterError
from specdec.params import SamplingParams
from specdec.types import Draft

from tiny import hf_tiny, native_from_hf

GREEDY = SamplingParams(temperature=0, max_tokens=50)
HOT = SamplingParams(temperature=1.0, max_tokens=50)


@pytest.fixture(scope="module")
def draft_model():
    return native_from_hf(hf_tiny("qwen2", seed=1))


def test_spellings():
    assert parse_draft("suffix+model:qwen2.5-coder-0.5b-instruct") == DraftSpec(
        "model", "qwen2.5-coder-0.5b-instruct", with_suffix=True
    )
    assert str(parse_draft("suffix+model:m")) == "suffix+model:m"
    assert parse_draft("suffix+m") == DraftSpec("model", "m", with_suffix=True)
    for bad, text in [
        ("suffix+ngram", "suffix combines with"),
        ("suffix+suffix", "suffix combines with"),
        ("suffix+", "suffix combines with"),
        ("model:m+suffix", "as suffix.model:NAME"),
        ("ngram+suffix", "as suffix.model:NAME"),
    ]:
        with pytest.raises(InvalidParameterError, match=text):
            parse_draft(bad)
    with pytest.raises(InvalidParameterError, match="drafts chains"):
        EngineArgs(model="m", draft="suffix+heads:/nonexistent/h", tree="3,2")


def test_powers_are_the_other_drafters(draft_model):
    with_model = hybrid(SuffixDrafter(), DraftModelDrafter(draft_model, 97, 97, 2, 64))
    powers = DrafterPowers.of(with_model)
    assert powers.catches_up is with_model and powers.costs is with_model
    assert powers.processors is with_model and isinstance(with_model, UsesPrefixCache)
    assert powers.watches is None and powers.learns is None
    assert with_model.model is draft_model and with_model.catch_up_tokens() == 0
    bare = DrafterPowers.of(hybrid(SuffixDrafter(), NgramDrafter()))
    assert bare == DrafterPowers.of(None)


def repeating_store(tokens: list[int]) -> SuffixStore:
    store = SuffixStore()
    for _ in range(3):
        store.close(store.open(tokens))
    return store


def test_rows_with_a_long_likely_match_take_the_suffix_with_one_hot_q(draft_model):
    past = list(range(10, 40))
    store = repeating_store(past)
    drafter = hybrid(
        SuffixDrafter(store, calibrated=False), DraftModelDrafter(draft_model, 97, 97, 2, 64)
    )
    drafter.admit([past[:12], [90, 91, 92]])  # row 0 repeats the past, row 1 does not
    draft = drafter.propose(6, [HOT, HOT], [torch.Generator().manual_seed(i) for i in (0, 1)])
    assert draft.tokens[0].tolist() == past[12:18] and draft.lengths.tolist() == [6, 6]
    assert torch.equal(draft.probs[0], torch.nn.functional.one_hot(draft.tokens[0], 97).float())
    assert draft.probs[1].sum(-1).allclose(torch.ones(6))  # the model's own q
    assert drafter.suffix_rows == 1 and drafter.other_rows == 1


def test_when_every_row_takes_the_suffix_the_model_does_not_run(draft_model):
    past = list(range(10, 40))
    other = DraftModelDrafter(draft_model, 97, 97, 1, 64)
    drafter = hybrid(SuffixDrafter(repeating_store(past), calibrated=False), other)
    drafter.admit([past[:12]])
    draft = drafter.propose(4, [GREEDY], [torch.Generator()])
    assert draft.probs is None and draft.tokens[0].tolist() == past[12:16]
    assert other._cache is None  # never ran
    drafter.commit(torch.tensor([2]), torch.tensor([77]))
    assert other.pending[0] == past[:12] + past[12:14] + [77]  # caught up at its next draft


@pytest.mark.parametrize("k_first", [0, 4])
def test_a_draft_model_catches_up_on_foreign_tokens(draft_model, k_first):
    """After a step whose draft came from elsewhere, the draft model drafts exactly what a
    fresh one over the same history drafts (greedy: same tokens)."""
    history, foreign, nxt = [5, 17, 42, 8, 60, 3], [30, 31, 32, 33], 44
    caught = DraftModelDrafter(draft_model, 97, 97, 1, 64)
    caught.admit([history])
    caught.propose(k_first, [GREEDY], [torch.Generator()])
    caught.commit_foreign(torch.tensor([3]), torch.tensor([nxt]), {0: foreign})
    fresh = DraftModelDrafter(draft_model, 97, 97, 1, 64)
    fresh.admit([history + foreign[:3] + [nxt]])
    a = caught.propose(5, [HOT], [torch.Generator().manual_seed(3)])
    b = fresh.propose(5, [HOT], [torch.Generator().manual_seed(3)])
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.probs, b.probs, atol=1e-5)


def test_the_other_drafters_acceptance_sets_the_bar():
    drafter = hybrid(SuffixDrafter(min_match=64), NgramDrafter())  # the suffix never matches
    assert drafter.expected_other(3) == pytest.approx(0.5 + 0.25 + 0.125)
    drafter.admit([[1, 2, 3, 1, 2, 3, 1, 2]])
    drafter.propose(3, [GREEDY], [torch.Generator()])  # the n-gram drafts: no match in store
    drafter.commit(torch.tensor([3]), torch.tensor([1]))
    assert drafter.expected_other(3) > 0.875  # it kept all three
    assert isinstance(drafter.propose(0, [GREEDY], [torch.Generator()]), Draft)


def test_llm_builds_the_hybrid_from_its_spelling(tmp_path):
    from specdec.llm import LLM

    from tiny_server import save_tiny

    target, draft = save_tiny(tmp_path / "t", 0), save_tiny(tmp_path / "d", 1)
    prompts = ["def f(x):", "def f(x): return"]
    params = SamplingParams(temperature=0, max_tokens=24)
    plain = [c.text for c in LLM(str(target), dtype="fp32").generate(prompts, params)]
    llm = LLM(str(target), dtype="fp32", draft=f"suffix+model:{draft}", speculate=4)
    for _ in range(2):  # the second time from a store holding the first
        assert [c.text for c in llm.generate(prompts, params)] == plain
    assert llm.suffix_store is not None and llm.suffix_store.past_tokens > 0
    assert llm.engine._drafter.suffix_rows > 0
