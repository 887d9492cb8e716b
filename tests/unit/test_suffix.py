"""The suffix drafter's index: longest matches, continuation counts and the adaptive
length, recall across requests, eviction within the store's budget, bad input."""

import random

import pytest
import torch

from specdec.drafters.suffix import (
    ANCHORS,
    MAX_DEPTH,
    MAX_STORE_TOKENS,
    SuffixDrafter,
    SuffixStore,
    continuation,
)
from specdec.errors import InvalidParameterError


def brute_match(segments: list[list[int]], context: list[int]) -> tuple[int, set]:
    """The longest suffix of `context` (<= MAX_DEPTH, >= the shortest anchor) followed by a
    token somewhere in `segments`, and every (segment, position after it) of that length:
    the scan `SuffixStore.match` must agree with while no context has more occurrences than
    the index keeps."""
    best, found = 0, set()
    for s, seq in enumerate(segments):
        for p in range(1, len(seq)):  # a match ending before position p, which has a token
            m = 0
            while m < min(MAX_DEPTH, p, len(context)) and seq[p - 1 - m] == context[-1 - m]:
                m += 1
            if m < ANCHORS[-1]:
                continue
            if m > best:
                best, found = m, {(s, p)}
            elif m == best:
                found.add((s, p))
    return best, found


@pytest.mark.parametrize("seed", range(6))
def test_match_is_the_longest_suffix_and_all_its_occurrences(seed):
    rng = random.Random(seed)
    store = SuffixStore()
    segments = [[rng.randrange(4) for _ in range(rng.randrange(5, 40))] for _ in range(3)]
    ids = [store.open(seq) for seq in segments[:-1]]
    for seg in ids:
        store.close(seg)
    store.open(segments[-1])  # a live one: its own past counts too
    compared = 0
    for _ in range(20):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        length, found = store.match(context)
        best, expected = brute_match(segments, context)
        if best == 0:
            assert (length, found) == (0, [])
            continue
        by_list = {id(seq): s for s, seq in enumerate(store.segments.values())}
        got = {(by_list[id(seq)], p) for seq, p in found}
        # The index keeps the latest MAX_CANDIDATES positions per context: compare where the
        # brute force found no more than that.
        if len(expected) <= 16:
            assert length == best and got == expected, (context, length, best)
            compared += 1
    assert compared >= 10


def test_a_long_match_wins_over_recent_short_ones():
    store = SuffixStore()
    old = store.open([1, 2, 3, 4, 5, 6, 7, 8, 9])
    store.close(old)
    live = store.open([0, 4, 5, 50, 4, 5, 51, 4, 5, 52])  # recent "4 5" with other endings
    length, found = store.match([2, 3, 4, 5])
    assert length == 4 and [(seq, p) for seq, p in found] == [(store.segments[old], 5)]
    assert continuation(found, 4, 0.1) == [6, 7, 8, 9]
    assert store.match([9, 4, 5])[0] == 2 and len(store.match([9, 4, 5])[1]) == 4
    assert live in store.segments


def test_continuation_follows_the_majority_while_it_is_likely():
    store = SuffixStore()
    for tail in ([7, 8, 9], [7, 8, 9], [7, 8, 9], [7, 6, 5]):
        store.close(store.open([1, 2, 3, *tail]))
    length, found = store.match([1, 2, 3])
    assert length == 3 and len(found) == 4
    assert continuation(found, 3, 0.1) == [7, 8, 9]  # 4/4, then 3/4
    assert continuation(found, 3, 0.8) == [7]  # 3/4 < 0.8: stops before 8
    assert continuation(found, 1, 0.1) == [7]


def test_draft_length_grows_with_the_match_and_stops_at_min_match():
    store = SuffixStore()
    store.close(store.open(list(range(100, 140))))
    drafter = SuffixDrafter(store, alpha=1.0, min_match=2, calibrated=False)
    drafter.admit([[100, 101], [7, 100, 101, 102, 103, 104, 105], [9, 105]])
    assert drafter.lookup(0, 16) == [102, 103]  # a 2-token match: 2 tokens
    assert drafter.lookup(1, 16) == list(range(106, 112))  # 6 tokens matched: 6 drafted
    assert drafter.lookup(1, 3) == [106, 107, 108]  # the window caps it
    assert drafter.lookup(2, 16) == []  # 1 token matched < min_match
    wide = SuffixDrafter(store, alpha=2.0, calibrated=False)
    wide.admit([[100, 101]])
    assert wide.lookup(0, 16) == [102, 103, 104, 105]


def test_calibration_lengthens_drafts_the_target_keeps_and_cuts_the_others():
    """A match seen once reads as certain by its counts: the learnt rate decides. Before
    any verdict it is 0.5 (3 tokens at min_prob 0.1); kept drafts raise it, rejected
    ones lower it until nothing of that kind is drafted."""
    store = SuffixStore()
    store.close(store.open(list(range(100, 164))))
    drafter = SuffixDrafter(store)
    drafter.admit([list(range(100, 116))])  # a 16-token match, one occurrence
    assert drafter.lookup(0, 16) == [116, 117, 118]
    kind = (3, False)  # 16..31 tokens, once
    drafter.propose(16, None, None)
    drafter.commit(torch.tensor([2]), torch.tensor([999]))  # 2 of 3 kept, the third tested
    assert (store.calibration.kept[kind], store.calibration.tested[kind]) == (2, 3)
    store = SuffixStore()  # the same single match, in a store that learnt more
    store.close(store.open(list(range(100, 164))))
    for _ in range(30):  # drafts of that kind kept whole
        store.calibration.record(kind, 16, 16)
    assert store.calibration.rate(kind) > 0.9
    again = SuffixDrafter(store)
    again.admit([list(range(100, 116))])
    assert again.lookup(0, 16) == list(range(116, 132))
    for _ in range(300):  # now every drafted token is rejected: the old counts fade
        store.calibration.record(kind, 16, 0)
    assert store.calibration.rate(kind) < 0.1 and again.lookup(0, 16) == []
    other = (1, False)  # another kind of match is not affected
    assert store.calibration.rate(other) == 0.5


def test_a_request_recalls_an_earlier_requests_output_across_drafters():
    store = SuffixStore()
    first = SuffixDrafter(store)
    prompt, answer = [1, 2, 3], [40, 41, 42, 43, 44, 45, 46, 47]
    first.admit([prompt])
    for token in answer:  # the target emits the answer, nothing drafted
        first.propose(0, None, None)
        first.commit(torch.tensor([0]), torch.tensor([token]))
    first.reset_row(0)  # finished: joins the past requests
    assert store.past_tokens == len(prompt + answer)
    second = SuffixDrafter(store, calibrated=False)  # a new engine's drafter, same process
    second.admit([[9, 9, 1, 2, 3, 40]])
    draft = second.propose(8, None, None)
    assert draft.lengths.tolist() == [4] and draft.tokens[0, :4].tolist() == [41, 42, 43, 44]
    assert draft.probs is None  # point masses
    second.commit(torch.tensor([4]), torch.tensor([45]))
    assert second.tokens(0)[-6:] == [40, 41, 42, 43, 44, 45]
    assert second.lookup(0, 8) == [46, 47]


def test_rows_move_and_finish_like_the_engine_repacks_them():
    store = SuffixStore()
    drafter = SuffixDrafter(store)
    drafter.admit([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    drafter.move_row(2, 0)  # row 0 finished; the last row takes its place
    assert drafter.rows[0] is not None and len(drafter.rows) == 2
    assert drafter.tokens(0) == [7, 8, 9] and store.past_tokens == 3
    drafter.reset_row(1)
    assert drafter.tokens(0) == [7, 8, 9] and store.past_tokens == 6
    del drafter  # the live row of a dropped drafter (an engine's reset) is kept as past
    assert store.past_tokens == 9 and not set(store.segments) - set(store.past)


def test_eviction_keeps_the_past_within_the_budget_oldest_first():
    rng = random.Random(0)
    store = SuffixStore(max_tokens=300)
    requests = [[rng.randrange(50_000) for _ in range(100)] for _ in range(8)]
    for tokens in requests:
        store.close(store.open(tokens))
        assert store.past_tokens <= 300
    assert len(store.past) == 3
    kept = [store.segments[s] for s in store.past]
    assert kept == requests[-3:]
    assert store.match(requests[0][10:20]) == (0, [])  # evicted: no recall, no index entries
    length, found = store.match(requests[-1][10:20])
    assert length == 10 and found[0][0] is kept[-1]
    fresh = SuffixStore(max_tokens=300)
    for tokens in requests[-3:]:
        fresh.close(fresh.open(tokens))
    assert store.num_entries() == fresh.num_entries()  # nothing of the evicted is left


def test_no_budget_keeps_no_past_request():
    store = SuffixStore(max_tokens=0)
    drafter = SuffixDrafter(store)
    drafter.admit([[1, 2, 3, 4]])
    drafter.reset_row(0)
    assert store.past_tokens == 0 and not store.segments and store.num_entries() == 0


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: SuffixStore(MAX_STORE_TOKENS + 1), "budget must be 0..4194304 tokens"),
        (lambda: SuffixStore(-1), "budget must be 0..4194304 tokens, got -1"),
        (lambda: SuffixStore(1.5), "whole number of tokens, got 1.5"),
        (lambda: SuffixDrafter(alpha=0), "alpha must be > 0"),
        (lambda: SuffixDrafter(min_prob=1.5), r"min_prob must be in \[0, 1\]"),
        (lambda: SuffixDrafter(min_match=0), "min_match must be 1..64"),
        (lambda: SuffixDrafter().propose(-1, None, None), "k must be >= 0"),
    ],
)
def test_bad_input_is_refused_precisely(make, message):
    with pytest.raises(InvalidParameterError, match=message):
        make()


def test_llm_refuses_an_oversized_store_before_loading():
    from specdec.llm import LLM

    with pytest.raises(InvalidParameterError, match="budget must be 0..4194304"):
        LLM("no-such-model", draft="suffix", suffix_tokens=MAX_STORE_TOKENS * 2)
