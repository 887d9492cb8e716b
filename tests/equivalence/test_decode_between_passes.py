"""Decode between prefill passes (`Engine.step`, the server's loop): while a long prompt is
prefilled in passes, the live rows take a decode step between passes, so the prompt delays
them by one pass, not by its whole prefill. Rows that finish meanwhile free their slots and
the new rows are packed after the live ones. Greedy output (fp32) is each request's own,
plain and speculative."""

import pytest

from specdec.drafters import NgramDrafter
from specdec.engine import Engine
from specdec.params import SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf

LIVE = [[5, 17, 42, 8, 9], [60, 3, 3, 3, 9], [7, 7, 8, 7, 7, 8]]
LONG = [11, 12, 13, 14, 15, 16] * 8  # 48 positions: 12 passes of 4
LIVE_TOKENS = [3, 30, 30]  # the first live row finishes during the long prefill


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2", seed=3))


def engine(target, tokenizer, k: int) -> Engine:
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=4,
        drafter_factory=(lambda b, n: NgramDrafter()) if k else None,
        window=FixedWindow(k),
        max_len=128,  # a server's fixed cache: the long prompt joins the running batch
        prefill_chunk=4,
    )


def alone(target, tokenizer, prompt, max_tokens, k):
    e = engine(target, tokenizer, k)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return e.generate([prompt], params)[0].token_ids


@pytest.mark.parametrize("k", [0, 3])
def test_live_rows_decode_between_a_long_prompts_passes(target, tokenizer, k):
    e = engine(target, tokenizer, k)
    live = [
        e.add_request(p, SamplingParams(temperature=0, max_tokens=n))
        for p, n in zip(LIVE, LIVE_TOKENS, strict=True)
    ]
    e.step()  # the live rows are admitted and take a step
    long = e.add_request(LONG, SamplingParams(temperature=0, max_tokens=8))
    before = [len(s.output_ids) for s in live]
    e.step()  # the long prompt's 12 passes, with decode steps between them
    gained = [len(s.output_ids) - b for s, b in zip(live, before, strict=True)]
    assert live[0].finished  # finished mid-prefill: its row was freed, the new one packed
    assert min(gained[1:]) >= 11  # a step between each pair of passes, and one after
    assert len(long.output_ids) == 2  # its first token, then the step's decode
    while e.has_work:
        e.step()
    for seq, prompt, n in zip(live, LIVE, LIVE_TOKENS, strict=True):
        assert seq.output_ids == alone(target, tokenizer, prompt, n, k)
    assert long.output_ids == alone(target, tokenizer, LONG, 8, k)
