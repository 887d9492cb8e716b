"""The prefix cache (`specdec.models.prefix_cache`): a request that starts like an earlier
one copies those positions' keys and values and prefills only the rest, for the target
and for a draft model. Greedy output is exactly what the engine computes without it
(fp32), the copied keys and values are the ones a full prefill computes, and the
prefills really are shorter."""

import pytest
import torch

from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine
from specdec.models.prefix_cache import PrefixCache
from specdec.params import SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # a shared opening, like a system turn
PROMPTS = [
    SYSTEM + [40, 41, 42],
    SYSTEM + [50, 51],
    SYSTEM + [40, 41, 60, 61, 62],  # shares more with the first
    [5, 6, 7, 8],  # shares nothing
    SYSTEM + [40, 41, 42],  # the first again: all but its last token stored
    SYSTEM[:6],
]
LENGTHS = [9, 14, 6, 11, 8, 12]


@pytest.fixture(scope="module")
def models():
    return native_from_hf(hf_tiny("qwen2", seed=1)), native_from_hf(hf_tiny("qwen2", seed=2))


def fed_tokens(model):
    """Counts the tokens each forward of `model` computes (padding excluded)."""
    counts = []

    def hook(module, args, kwargs):
        tokens = args[0]
        num_new = kwargs.get("num_new")
        counts.append(int(num_new.sum()) if num_new is not None else tokens.numel())

    return counts, model.register_forward_pre_hook(hook, with_kwargs=True)


def params():
    return [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]


def run_one_by_one(engine):
    return [engine.generate([p], q)[0].token_ids for p, q in zip(PROMPTS, params(), strict=True)]


def test_store_reuses_the_longest_prefix_one_short_of_the_prompt(models):
    target, _ = models
    cache = target.new_cache(2, 64)
    first = SYSTEM + [40, 41, 42]
    target(torch.tensor([first]), cache, first_row=0)
    store = PrefixCache(100)
    store.save(cache, 0, first)
    assert store.match(SYSTEM + [40, 99]) == len(SYSTEM) + 1
    assert store.match(first) == len(first) - 1  # the last token must still run
    assert store.match(first + [7]) == len(first)
    assert store.match([1, 2, 3]) == 0
    n = store.load(cache, 1, SYSTEM + [40, 99])
    assert n == len(SYSTEM) + 1 and int(cache.lengths[1]) == n
    for k, v in zip(cache.k, cache.v, strict=True):
        assert torch.equal(k[1, :, :n], k[0, :, :n]) and torch.equal(v[1, :, :n], v[0, :, :n])
    with pytest.raises(ValueError, match="not empty"):
        store.load(cache, 1, first)
    with pytest.raises(ValueError, match="holds"):
        store.save(cache, 1, first)  # row 1 holds fewer positions than that


def test_store_keeps_one_copy_of_a_start_and_evicts_the_least_recently_used(models):
    target, _ = models
    cache = target.new_cache(1, 64)
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3], [9, 9, 9, 9], [7, 7, 7, 7, 7]]
    target(torch.tensor([seqs[0]]), cache, first_row=0)
    store = PrefixCache(12)
    store.save(cache, 0, seqs[0][:3])
    store.save(cache, 0, seqs[0])  # the longer one replaces its start
    assert store.stored_tokens == 6
    store.save(cache, 0, seqs[1])  # already held as a start: nothing new
    assert store.stored_tokens == 6
    cache.truncate(torch.tensor([0]))
    target(torch.tensor([seqs[2]]), cache, first_row=0)
    store.save(cache, 0, seqs[2])  # 10 positions
    assert store.match([1, 2, 3, 4, 5, 6, 0]) == 6
    cache.truncate(torch.tensor([0]))
    target(torch.tensor([seqs[3]]), cache, first_row=0)
    store.save(cache, 0, seqs[3])  # 15 > 12: the least recently used goes
    assert store.stored_tokens == 9
    assert store.match([1, 2, 3, 4, 5, 6, 0]) == 0 and store.match(seqs[2] + [0]) == 4
    small = PrefixCache(3)
    small.save(cache, 0, seqs[3])  # longer than the whole budget: not kept
    assert small.stored_tokens == 0 and small.match(seqs[3] + [0]) == 0


def test_reused_keys_and_values_are_those_a_full_prefill_computes(models):
    target, _ = models
    prompt = SYSTEM + [40, 41, 42, 43]
    full = target.new_cache(1, 64)
    target(torch.tensor([prompt]), full, first_row=0)
    store = PrefixCache(100)
    store.save(full, 0, SYSTEM + [40])
    part = target.new_cache(1, 64)
    n = store.load(part, 0, prompt)
    target(torch.tensor([prompt[n:]]), part, first_row=0)
    assert int(part.lengths[0]) == len(prompt)
    for a, b in zip(full.k + full.v, part.k + part.v, strict=True):
        torch.testing.assert_close(a[0, :, : len(prompt)], b[0, :, : len(prompt)])


@pytest.mark.parametrize("speculate", [0, 3])
def test_greedy_output_is_unchanged_and_prefills_shrink(models, tokenizer, speculate):
    target, draft = models

    def engine(cached: int) -> Engine:
        factory = None
        if speculate:
            factory = lambda b, n: DraftModelDrafter(draft, 97, 97, b, n)  # noqa: E731
        return Engine(
            target, tokenizer, frozenset(), 2, factory,
            window=FixedWindow(speculate), prefix_cache_tokens=cached,
        )  # fmt: skip

    runs = {}
    for cached in (0, 256):
        target_fed, t_hook = fed_tokens(target)
        draft_fed, d_hook = fed_tokens(draft)
        try:
            built = engine(cached)
            runs[cached] = (run_one_by_one(built), sum(target_fed), sum(draft_fed), built)
        finally:
            t_hook.remove()
            d_hook.remove()
    (refs, target_plain, draft_plain, _), (outs, target_fed, draft_fed, cached) = runs.values()
    assert outs == refs
    # Every prompt after the first shares its opening with an earlier one (but the 4th),
    # and each position reused is one the model did not compute: the steps are the same.
    store = cached.prefix_cache
    assert store.hits >= 4 * len(SYSTEM) - 4
    assert store.hits + store.misses == sum(map(len, PROMPTS))
    assert target_plain - target_fed == store.hits
    if speculate:
        assert cached.draft_prefix_cache.hits >= 3 * len(SYSTEM)
        assert draft_plain - draft_fed == cached.draft_prefix_cache.hits
    else:
        assert draft_fed == draft_plain == 0


def test_a_conversation_reuses_the_previous_turn(models, tokenizer):
    target, _ = models
    first = SYSTEM + [40, 41]
    engine = Engine(target, tokenizer, frozenset(), 1, prefix_cache_tokens=256)
    out = engine.generate([first], SamplingParams(temperature=0, max_tokens=10))[0].token_ids
    second = first + out + [70, 71]
    before = engine.prefix_cache.hits
    got = engine.generate([second], SamplingParams(temperature=0, max_tokens=6))[0].token_ids
    # All of the first turn but its newest token (never fed) is stored when it finishes.
    assert engine.prefix_cache.hits - before == len(first) + len(out) - 1
    plain = Engine(target, tokenizer, frozenset(), 1)
    assert got == plain.generate([second], SamplingParams(temperature=0, max_tokens=6))[0].token_ids


def test_batched_arrivals_match_plain(models, tokenizer):
    """Rows joining a running batch with stored prefixes, speculating, leaving: unchanged."""
    target, draft = models
    factory = lambda b, n: DraftModelDrafter(draft, 97, 97, b, n)  # noqa: E731
    plain = Engine(target, tokenizer, frozenset(), 1)
    refs = run_one_by_one(plain)
    engine = Engine(
        target, tokenizer, frozenset(), 3, factory, window=FixedWindow(2),
        prefix_cache_tokens=64,
    )  # fmt: skip
    seqs = staggered(engine, PROMPTS, params())
    assert [s.output_ids for s in seqs] == refs
    assert engine.prefix_cache.hits > 0 and engine.prefix_cache.stored_tokens <= 64
