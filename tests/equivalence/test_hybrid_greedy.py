"""Greedy speculative decoding with suffix decoding combined with a draft model
(`--draft suffix+model:...`) == plain greedy decoding, token for token, in fp32: rows
switch between the two drafters (the draft model then catches up on the suffix's tokens),
alone, batched and with requests joining mid-run."""

import pytest

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter
from specdec.drafters.hybrid import hybrid
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
    draft = native_from_hf(hf_tiny("qwen2", seed=1))
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    plain = Engine(target, tokenizer, frozenset(), max_batch=1)
    refs = [plain.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    return target, draft, params, refs


def hybrid_engine(target, draft, tokenizer, store, window, max_batch=8, acceptor=None):
    made = []

    def factory(rows, length):
        made.append(hybrid(SuffixDrafter(store), DraftModelDrafter(draft, 97, 97, rows, length)))
        return made[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        acceptor=acceptor or GreedyAcceptor(),
        window=window,
        max_len=96,
    )
    return engine, made


def drafted_by(made) -> tuple[int, int]:
    return sum(h.suffix_rows for h in made), sum(h.other_rows for h in made)


@pytest.mark.parametrize("window", [FixedWindow(3), FixedWindow(8), AdaptiveWindow(k_max=8)])
def test_hybrid_greedy_equals_plain(setup, tokenizer, window):
    target, draft, params, refs = setup
    store = SuffixStore()
    engine, made = hybrid_engine(
        target, draft, tokenizer, store, window, acceptor=RejectionSampler()
    )
    assert [c.token_ids for c in engine.generate(PROMPTS, params)] == refs
    # Now every request is in the store: the suffix drafts the repeats, the model the rest.
    assert [c.token_ids for c in engine.generate(PROMPTS, params)] == refs
    for prompt, p, ref in zip(PROMPTS, params, refs, strict=True):  # one at a time
        assert engine.generate([prompt], p)[0].token_ids == ref
    suffix_rows, model_rows = drafted_by(made)
    if isinstance(window, FixedWindow):
        assert suffix_rows > 10 and model_rows > 10, (suffix_rows, model_rows)


@pytest.mark.parametrize("max_batch", [2, 8])
def test_requests_joining_mid_run_match_plain_alone(setup, tokenizer, max_batch):
    target, draft, params, refs = setup
    store = SuffixStore()
    for _ in range(2):  # an empty store, then one holding every request's output
        engine, made = hybrid_engine(target, draft, tokenizer, store, FixedWindow(5), max_batch)
        seqs = staggered(engine, PROMPTS, params)
        assert [s.output_ids for s in seqs] == refs
        assert not engine.live and not engine.waiting
    suffix_rows, model_rows = drafted_by(made)
    assert suffix_rows > 0 and model_rows > 0
