"""Chunked prefill (`Engine(prefill_chunk=N)`): a long admission runs in passes of at most
N positions, its B rows N // B each, over the growing cache. The cache it leaves and each
row's first logits are the one-pass prefill's (fp32, to rounding); greedy output is
exactly the one-pass engine's, plain and speculative, with ragged prompts, rows joining a
running batch and stored prefixes. `generate_steps` yields between passes, and the time a
caller spends between them counts neither in the prefill's time nor in the requests'
clocks. A user's setting ("auto", 0, N) resolves per device."""

import time
from types import SimpleNamespace

import pytest
import torch

from specdec import engine as engine_module
from specdec import sequence as sequence_module
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import Engine
from specdec.errors import InvalidParameterError
from specdec.params import SamplingParams
from specdec.prefill import PREFILL_CHUNK_CPU, resolve_prefill_chunk
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

PROMPTS = [
    [5, 17, 42, 8, 9, 10, 11, 12, 13, 14, 15],
    [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44, 3, 3, 3, 9, 12, 80],
    [33],
    [7, 7, 8, 7, 7, 8, 7],
]
LENGTHS = [12, 7, 15, 10]
# 4 rows of 1, 3, 5 and 16 positions a pass: one at a time, ragged ends, and one pass for
# all but the longest prompt
CHUNKS = [4, 12, 20, 64]


@pytest.fixture(scope="module")
def models():
    return native_from_hf(hf_tiny("qwen2", seed=1)), native_from_hf(
        hf_tiny("qwen2", seed=2, num_hidden_layers=1)
    )


def params():
    return [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]


def engine(target, tokenizer, chunk, drafter=None, k=0, **kwargs):
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=len(PROMPTS),
        drafter_factory=drafter,
        window=FixedWindow(k),
        prefill_chunk=chunk,
        **kwargs,
    )


def passes(model):
    """Logs the tokens per row each forward of `model` is given."""
    widths = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(args[0].shape[1]), with_kwargs=True
    )
    return widths, handle


def pass_widths(longest: int, chunk: int) -> list[int]:
    """The passes `longest` positions take at `chunk` a pass shared by PROMPTS' rows."""
    width = chunk // len(PROMPTS)
    return [width] * (longest // width) + [longest % width] * bool(longest % width)


def assert_same_cache(expected, cache) -> None:
    """Same lengths, and each row's keys and values equal over its length (fp32)."""
    assert torch.equal(expected.lengths, cache.lengths)
    for k0, k1, v0, v1 in zip(expected.k, cache.k, expected.v, cache.v, strict=True):
        for row, n in enumerate(expected.lengths.tolist()):
            torch.testing.assert_close(k1[row, :, :n], k0[row, :, :n])
            torch.testing.assert_close(v1[row, :, :n], v0[row, :, :n])


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_cache_and_first_logits_equal_one_pass(models, tokenizer, chunk):
    target, _ = models
    whole, chunked = engine(target, tokenizer, None), engine(target, tokenizer, chunk)
    results = []
    for e in (whole, chunked):
        for p, q in zip(PROMPTS, params(), strict=True):
            e.add_request(p, q)
        e._ensure_cache()
        gen = e._prefill_passes([e.waiting.popleft() for _ in PROMPTS], 0)
        widths, handle = passes(target)
        try:
            while True:
                next(gen)
        except StopIteration as done:
            tokens, states = done.value
        finally:
            handle.remove()
        results.append((e._cache, tokens, states, widths))
    (cache0, tokens0, states0, _), (cache1, tokens1, states1, widths) = results
    assert widths == pass_widths(max(map(len, PROMPTS)), chunk)
    assert_same_cache(cache0, cache1)
    assert torch.equal(tokens0, tokens1)
    assert states1.hidden.shape == states0.hidden.shape
    for row, n in enumerate(states0.lengths.tolist()):
        torch.testing.assert_close(states1.hidden[row, :n], states0.hidden[row, :n])


@pytest.mark.parametrize("chunk", CHUNKS)
def test_greedy_output_equals_one_pass(models, tokenizer, chunk):
    target, draft = models
    refs = [c.token_ids for c in engine(target, tokenizer, None).generate(PROMPTS, params())]
    plain = engine(target, tokenizer, chunk).generate(PROMPTS, params())
    assert [c.token_ids for c in plain] == refs
    for factory in (
        lambda b, length: NgramDrafter(),
        lambda b, length: DraftModelDrafter(draft, 97, 97, b, length, prefill_chunk=chunk),
    ):
        spec = engine(target, tokenizer, chunk, factory, k=3).generate(PROMPTS, params())
        assert [c.token_ids for c in spec] == refs


def test_rows_joining_a_running_batch_and_stored_prefixes(models, tokenizer):
    """Each admission is chunked on its own rows while others are live, and a prompt
    whose opening is stored prefills only the rest, in passes."""
    target, draft = models
    factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
    prompts = PROMPTS + [PROMPTS[1] + [4, 5, 6, 7, 8, 9]]  # the second again, longer
    sampling = params() + [SamplingParams(temperature=0, max_tokens=9)]
    runs = []
    for chunk in (None, 2):
        e = engine(target, tokenizer, chunk, factory, k=2, prefix_cache_tokens=256)
        runs.append([s.output_ids for s in staggered(e, prompts, sampling)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_drafts_catch_up_runs_in_passes_and_leaves_the_same_cache(models, chunk):
    _, draft = models
    caches, proposals = [], []
    for c in (None, chunk):
        drafter = DraftModelDrafter(draft, 97, 97, len(PROMPTS), 64, prefill_chunk=c)
        drafter.admit(PROMPTS)
        widths, handle = passes(draft)
        try:
            proposal = drafter.propose(3, params(), [None] * len(PROMPTS))
        finally:
            handle.remove()
        caches.append(drafter.cache)
        proposals.append(proposal.tokens)
    catch_up = widths[: len(widths) - 3]  # then the step's 3 draft forwards
    # the catch-up feeds all but the last token of each row
    assert catch_up == pass_widths(max(map(len, PROMPTS)) - 1, chunk)
    assert torch.equal(proposals[0], proposals[1])
    assert_same_cache(caches[0], caches[1])


def test_generate_steps_turns_between_passes_and_does_not_count_them(models, tokenizer):
    target, _ = models
    prompt, sampling = PROMPTS[1], SamplingParams(temperature=0, max_tokens=3)
    counted = {}
    # The caller's turn between nexts: an hour on the engine's clock each time.
    away = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + away[0])
    for chunk in (None, 4):
        e = engine(target, tokenizer, chunk)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine_module, "time", clock)
            mp.setattr(sequence_module, "time", clock)  # the requests' own clocks
            steps, nexts = e.generate_steps([prompt], [sampling]), 0
            try:
                while True:
                    next(steps)
                    nexts += 1
                    away[0] += 3600.0  # the caller's turn: not the engine's time
            except StopIteration as done:
                (out,) = done.value
        counted[chunk] = (nexts, e.prefill_s, out.ttft_s, out.token_ids)
    (n_whole, _, _, ids_whole), (n_chunked, prefill_s, ttft_s, ids) = counted.values()
    assert ids == ids_whole
    assert n_chunked - n_whole == -(-len(prompt) // 4) - 1  # a turn between each two passes
    assert away[0] >= 3600 * n_chunked  # the caller's hours between passes count nowhere:
    assert 0 < prefill_s < 3600 and 0 < ttft_s < 3600


def test_abandoned_between_passes_frees_its_rows(models, tokenizer):
    target, _ = models
    e = engine(target, tokenizer, 4)
    steps = e.generate_steps(PROMPTS[:2], params()[:2])
    next(steps)  # the first pass of the admission: 2 rows of 2 positions
    assert e._cache.lengths[:2].tolist() == [2, 2]
    steps.close()
    assert e._cache.lengths.tolist() == [0, 0]
    assert not e.live


def test_a_chunk_below_one_is_refused(models, tokenizer):
    with pytest.raises(InvalidParameterError, match="prefill_chunk must be >= 1"):
        engine(models[0], tokenizer, 0)


def test_a_users_setting_resolves_per_device():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_prefill_chunk("auto", cpu) == PREFILL_CHUNK_CPU
    assert resolve_prefill_chunk("auto", gpu) is None  # a GPU takes a prompt in one pass
    assert resolve_prefill_chunk("0", cpu) is None and resolve_prefill_chunk(0, cpu) is None
    assert resolve_prefill_chunk("96", gpu) == 96 and resolve_prefill_chunk(None, cpu) is None
    for bad in ("many", "-3", -3, "1.5"):
        with pytest.raises(InvalidParameterError, match="prefill chunk must be"):
            resolve_prefill_chunk(bad, cpu)


def test_llm_refuses_a_bad_chunk_before_loading_anything(tmp_path):
    from specdec.llm import LLM

    with pytest.raises(InvalidParameterError, match="prefill chunk must be"):
        LLM(str(tmp_path / "no-such-model"), prefill_chunk="lots")
