"""Prompt lookup's n-gram index against the plain right-to-left scan it replaced."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.drafters import NgramDrafter


def scan(history: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The reference: the tokens after the latest earlier match of the longest suffix."""
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                return history[start + n : start + n + k]
    return []


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 4), max_size=40),
    steps=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), max_size=12),
    k=st.integers(1, 5),
    sizes=st.sampled_from([(1, 1), (1, 3), (2, 3), (2, 4)]),
)
def test_the_index_finds_what_the_scan_finds_as_histories_grow(prompt, steps, k, sizes):
    """A small alphabet makes repeats, overlapping matches and ties common; the history
    grows between lookups as the engine's commits grow it."""
    min_ngram, max_ngram = sizes
    drafter = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    drafter.admit([prompt])
    history = list(prompt)
    for new in [[], *steps]:
        history += new
        drafter.histories[0].extend(new)
        assert drafter.lookup(0, k) == scan(history, k, max_ngram, min_ngram)


def test_moved_and_reset_rows_keep_their_own_index():
    drafter = NgramDrafter()
    drafter.admit([[1, 2, 3, 1, 2], [7, 8, 7]])
    assert drafter.lookup(0, 2) == [3, 1] and drafter.lookup(1, 2) == [8, 7]
    drafter.reset_row(0)
    assert drafter.lookup(0, 2) == []
    drafter.move_row(1, 0)
    assert drafter.histories == [[7, 8, 7]] and drafter.lookup(0, 2) == [8, 7]
    draft = drafter.propose(2, [None], [None])
    assert draft.tokens.tolist() == [[8, 7]] and draft.lengths.tolist() == [2]
    drafter.commit(torch.tensor([1]), torch.tensor([9]))
    assert drafter.histories == [[7, 8, 7, 8, 9]] and drafter.lookup(0, 1) == []
