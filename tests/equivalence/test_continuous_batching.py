"""Continuous batching: requests join and leave the running batch between steps, and each
one's greedy output is still exactly the plain output of its prompt alone (fp32)."""

import pytest

from specdec.acceptors import RejectionSampler
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import Engine
from specdec.errors import ContextLengthError
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7], [9]]
LENGTHS = [20, 5, 13, 9, 16]


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("qwen2"))
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    plain = Engine(target, tokenizer, frozenset(), max_batch=1)
    refs = [plain.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    return target, draft, params, refs


def _engines(target, draft, tokenizer, max_batch):
    def model_drafter(rows, length):
        return DraftModelDrafter(draft, 97, 97, rows, length)

    yield "plain", Engine(target, tokenizer, frozenset(), max_batch=max_batch)
    for name, factory, window in [
        ("draft k=3", model_drafter, FixedWindow(3)),
        ("draft auto", model_drafter, AdaptiveWindow(k_max=5)),
        ("ngram k=4", lambda rows, length: NgramDrafter(), FixedWindow(4)),
    ]:
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            max_batch=max_batch,
            drafter_factory=factory,
            acceptor=RejectionSampler(),
            window=window,
            max_len=64,
        )
        yield name, engine


@pytest.mark.parametrize("max_batch", [2, 8])
def test_requests_joining_mid_flight_match_plain_alone(setup, tokenizer, max_batch):
    target, draft, params, refs = setup
    for name, engine in _engines(target, draft, tokenizer, max_batch):
        seqs = staggered(engine, PROMPTS, params)
        assert [s.output_ids for s in seqs] == refs, name
        assert all(engine.completion(s).finish_reason == "length" for s in seqs)
        assert not engine.live and not engine.waiting


def test_batch_never_exceeds_max_batch_and_freed_rows_are_reused(setup, tokenizer):
    target, draft, params, refs = setup
    engine = Engine(target, tokenizer, frozenset(), max_batch=2, max_len=64)
    seqs = [engine.add_request(p, q) for p, q in zip(PROMPTS, params, strict=True)]
    sizes = []
    while engine.has_work:
        engine.step()
        sizes.append(len(engine.live))
    assert max(sizes) == 2 and [s.output_ids for s in seqs] == refs
    assert engine._cache.max_batch == 2


def test_abort_frees_the_row_and_leaves_the_others_alone(setup, tokenizer):
    target, draft, params, refs = setup
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=4,
        drafter_factory=lambda rows, length: DraftModelDrafter(draft, 97, 97, rows, length),
        window=FixedWindow(3),
        max_len=64,
    )
    seqs = [engine.add_request(p, q) for p, q in zip(PROMPTS[:3], params[:3], strict=True)]
    engine.step()
    engine.step()
    assert len(engine.live) == 3
    engine.abort(seqs[0])
    touched = engine.step()
    assert seqs[0] in touched and seqs[0] not in engine.live and len(engine.live) <= 2
    queued = engine.add_request(PROMPTS[3], params[3])
    engine.abort(queued)  # aborted while waiting: never admitted
    while engine.has_work:
        engine.step()
    assert engine.completion(seqs[0]).finish_reason == "abort"
    assert refs[0][: len(seqs[0].output_ids)] == seqs[0].output_ids
    assert [s.output_ids for s in seqs[1:]] == refs[1:3]
    assert queued.output_ids == [] and queued.finish_reason == "abort"


def test_fixed_max_len_refuses_what_cannot_fit(setup, tokenizer):
    target, *_ = setup
    engine = Engine(target, tokenizer, frozenset(), max_len=40)
    engine.add_request([5] * 20, SamplingParams(max_tokens=18))  # 20 + 18 + 2 of headroom
    with pytest.raises(ContextLengthError, match="exceeds this engine's limit of 38 tokens"):
        engine.add_request([5] * 20, SamplingParams(max_tokens=19))


def test_cache_grows_while_idle_for_longer_requests(setup, tokenizer):
    target, _, params, refs = setup
    engine = Engine(target, tokenizer, frozenset(), max_batch=4)
    short = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=3))
    assert short[0].token_ids == refs[0][:3]
    small = engine._cache.max_len
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs and engine._cache.max_len > small
