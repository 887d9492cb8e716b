"""Greedy speculative decoding with the suffix drafter == plain greedy decoding, token for
token, in fp32: alone, batched, with requests joining mid-run, and drafting from a store
that already holds earlier requests (so long drafts are proposed and accepted)."""

import pytest

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters.suffix import SuffixDrafter, SuffixStore
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7], [9]]
LENGTHS = [30, 7, 21, 12, 25]


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("qwen2"))
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    plain = Engine(target, tokenizer, frozenset(), max_batch=1)
    refs = [plain.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    return target, params, refs


def suffix_engine(target, tokenizer, store, window, max_batch=8, acceptor=None):
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda rows, length: SuffixDrafter(store),
        acceptor=acceptor or GreedyAcceptor(),
        window=window,
        max_len=96,
    )


@pytest.mark.parametrize("window", [FixedWindow(3), FixedWindow(8), AdaptiveWindow(k_max=8)])
def test_suffix_drafter_greedy_equals_plain(setup, tokenizer, window):
    target, params, refs = setup
    store = SuffixStore()
    engine = suffix_engine(target, tokenizer, store, window, acceptor=RejectionSampler())
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    # The second time every request is in the store: drafts are long and accepted.
    again = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in again] == refs
    if isinstance(window, FixedWindow):
        assert sum(c.stats.accepted for c in again) > sum(c.stats.accepted for c in out)
        assert sum(c.stats.steps for c in again) < sum(LENGTHS) / 2


@pytest.mark.parametrize("max_batch", [2, 8])
def test_requests_joining_mid_run_match_plain_alone(setup, tokenizer, max_batch):
    target, params, refs = setup
    store = SuffixStore()
    accepted = []
    for _ in range(2):  # an empty store, then one holding every request's output
        engine = suffix_engine(target, tokenizer, store, FixedWindow(6), max_batch)
        seqs = staggered(engine, PROMPTS, params)
        assert [s.output_ids for s in seqs] == refs
        assert not engine.live and not engine.waiting
        accepted.append(sum(s.stats.accepted for s in seqs))
    assert accepted[1] > accepted[0]
    # Every finished request joined the store: its prompt and all its output.
    assert store.past_tokens == 2 * sum(len(p) + n for p, n in zip(PROMPTS, LENGTHS, strict=True))
