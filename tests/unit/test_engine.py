"""Plain decoding behaviour: stopping rules, seeds, batching, context checks."""

import time
from types import SimpleNamespace

import pytest

from specdec import engine as engine_module
from specdec.engine import Engine
from specdec.errors import ContextLengthError, InvalidParameterError
from specdec.params import SamplingParams

PROMPT = [5, 17, 42, 8, 9]


@pytest.fixture
def engine(hf_and_native, tokenizer):
    return Engine(hf_and_native[1], tokenizer, eos_ids=frozenset({1}))


def _greedy(engine, n=16, **kw):
    return engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=n, **kw))[0]


def test_stops_at_eos_and_keeps_it_in_token_ids(engine):
    free = _greedy(engine, ignore_eos=True)
    eos = free.token_ids[3]
    engine.eos_ids = frozenset({eos})
    stopped = _greedy(engine)
    first = free.token_ids.index(eos)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    assert _greedy(engine, ignore_eos=True).token_ids == free.token_ids


def test_stop_string_cuts_the_text(engine, tokenizer):
    free = _greedy(engine, n=20, ignore_eos=True)
    stop = tokenizer.decode(free.token_ids[6:8])
    out = _greedy(engine, n=20, ignore_eos=True, stop=(stop,))
    assert out.finish_reason == "stop"
    assert out.text == free.text[: free.text.find(stop)]
    assert stop not in out.text
    assert len(out.token_ids) <= 8


def test_max_tokens_gives_length(engine):
    out = _greedy(engine, n=5, ignore_eos=True)
    assert out.num_generated == 5 and out.finish_reason == "length"
    assert out.elapsed_s >= out.ttft_s > 0 and out.tokens_per_s > 0


def test_seeded_sampling_reproduces_and_ignores_batch_neighbours(engine):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=123, max_tokens=12, ignore_eos=True)
    alone = engine.generate([PROMPT], params)[0].token_ids
    again = engine.generate([PROMPT], params)[0].token_ids
    other = SamplingParams(temperature=1.0, seed=7, max_tokens=30, ignore_eos=True)
    in_batch = engine.generate([[3, 3, 3], PROMPT], [other, params])[1].token_ids
    assert alone == again == in_batch
    different = SamplingParams(temperature=1.0, seed=124, max_tokens=12, ignore_eos=True)
    assert engine.generate([PROMPT], different)[0].token_ids != alone


def test_more_prompts_than_max_batch(hf_and_native, tokenizer):
    engine = Engine(hf_and_native[1], tokenizer, eos_ids=frozenset(), max_batch=2)
    prompts = [PROMPT, [4, 4], [9, 8, 7, 6], [50]]
    params = SamplingParams(temperature=0, max_tokens=6)
    batched = [c.token_ids for c in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert batched == alone


def test_context_errors(engine):
    ctx = engine.context_length
    with pytest.raises(ContextLengthError, match=f"prompt has {ctx} tokens but the model's"):
        engine.generate([[5] * ctx], SamplingParams(max_tokens=1))
    with pytest.raises(ContextLengthError, match=f"exceeds the model's context of {ctx}"):
        engine.generate([[5] * 10], SamplingParams(max_tokens=ctx))
    with pytest.raises(InvalidParameterError, match="prompt is empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(InvalidParameterError, match="one per prompt"):
        engine.generate([PROMPT, PROMPT], [SamplingParams()])


def test_generate_steps_runs_one_step_per_next_and_returns_generate_s_completions(
    hf_and_native, tokenizer
):
    """`generate_steps` is `generate` a step at a time (the bench takes turns between
    engines so): the same tokens, one `step` per `next`, requests checked when it is
    called; and two engines stepped in turn do not disturb each other."""
    prompts = [PROMPT, [4, 4], [9, 8, 7, 6]]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    whole = Engine(hf_and_native[1], tokenizer, eos_ids=frozenset(), max_batch=2)
    expected = [c.token_ids for c in whole.generate(prompts, params)]
    a, b = (Engine(hf_and_native[1], tokenizer, eos_ids=frozenset(), max_batch=2) for _ in "ab")
    counted = []
    decode = Engine.decode  # one a step, after its admissions

    def counting(self):
        counted.append(self)
        return decode(self)

    # The caller's time between nexts: an hour on the engine module's clock each time.
    away = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + away[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "decode", counting)
        mp.setattr(engine_module, "time", clock)
        runs = {a: a.generate_steps(prompts, params), b: b.generate_steps(prompts[::-1], params)}
        assert not counted and len(a.waiting) == 3  # queued at the call, no step run yet
        nexts, done = 0, {}
        while len(done) < 2:
            for engine, run in runs.items():
                if engine in done:
                    continue
                try:
                    next(run)
                    nexts += 1
                except StopIteration as end:
                    done[engine] = end.value
                away[0] += 3600.0
    assert len(counted) == nexts and counted[:4] == [a, b, a, b]  # a step per next, in turn
    assert nexts > 4 and away[0] > 3600 * nexts
    for completion in done[a] + done[b]:  # the requests' times are their engine's own
        assert 0 < completion.ttft_s <= completion.elapsed_s < 3600
    assert [c.token_ids for c in done[a]] == expected
    assert [c.token_ids for c in done[b]] == expected[::-1]
    assert not a._one_job and not b._one_job
    with pytest.raises(ContextLengthError):  # checked at the call, not at the first next
        a.generate_steps([[5] * a.context_length], SamplingParams(max_tokens=1))
