"""A draft model's vocabulary head cut to some ids: the layers keep what they computed,
the drafter's q is a distribution over the kept ids, the ids are chosen as documented."""

import pytest
import torch

from specdec.drafters import DraftModelDrafter, draft_vocab
from specdec.drafters.draft_vocab import frequent_ids, prune_vocab_head
from specdec.kernels.linear import Linear
from specdec.kernels.quant import Int4Linear, Int8Linear
from specdec.params import SamplingParams
from specdec.sampling import make_generator

from tiny import hf_tiny, native_from_hf

IDS = torch.tensor([3, 0, 64, 17, 95, 40])  # any order: column j scores ids[j]


def _dense(dtype, bias=True, n=96, k=128):
    torch.manual_seed(0)
    layer = Linear(k, n, bias=bias, dtype=dtype)
    with torch.no_grad():
        layer.weight.normal_()
        if bias:
            layer.bias.normal_()
    return layer.requires_grad_(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_rows_compute_the_kept_outputs(dtype):
    layer = _dense(dtype)
    x = torch.randn(3, 128, dtype=dtype)
    rows = layer.output_rows(IDS)
    assert rows.weight.shape == (len(IDS), 128)
    torch.testing.assert_close(rows(x), layer(x)[:, IDS])  # up to the GEMM's blocking
    with torch.no_grad():  # a copy: the full layer (e.g. a tied embedding) is untouched
        rows.weight.zero_()
    assert layer.weight.abs().sum() > 0


def test_int4_rows_keep_their_blocks_and_outputs():
    layer = Int4Linear(_dense(torch.float32, bias=False, n=96, k=256))
    rows = layer.output_rows(IDS)
    assert isinstance(rows, Int4Linear)
    for full, kept in zip(layer.q4.tensors(), rows.q4.tensors(), strict=True):
        assert torch.equal(full[IDS], kept)
    x = torch.randn(2, 256)
    torch.testing.assert_close(rows(x), layer(x)[:, IDS])


def test_int8_rows_requantize_to_the_same_values():
    layer = Int8Linear(_dense(torch.float32, bias=False))
    rows = layer.output_rows(IDS)
    assert torch.equal(rows.qweight, layer.qweight[IDS])
    torch.testing.assert_close(rows.scales, layer.scales[IDS])


def test_frequent_ids_keep_the_end_ids_and_fill_by_rank(monkeypatch):
    monkeypatch.setattr(draft_vocab, "_ranked_ids", lambda tok: [50, 7, 99, 3, 20])
    ids = frequent_ids(None, 4, usable=90, keep=[1, 95])  # 95 is past usable: dropped
    assert ids.tolist() == [1, 3, 7, 50]  # kept id first, then by rank, 99 >= usable
    few = frequent_ids(None, 8, usable=90, keep=[1])  # fewer ranked than n: lowest unseen
    assert few.tolist() == [0, 1, 2, 3, 4, 7, 20, 50]
    assert frequent_ids(None, 200, usable=90).tolist() == list(range(90))


def test_lowest_ids_keep_the_end_ids_in_place_of_the_highest():
    assert draft_vocab.lowest_ids(5, usable=90, keep=[1, 80, 95]).tolist() == [0, 1, 2, 3, 80]
    assert draft_vocab.lowest_ids(200, usable=90).tolist() == list(range(90))


def _even_ids_drafter(widen: bool):
    """(a drafter over a one-layer tiny qwen2 with its head cut to the even ids, widened
    by the context or not; the same model whole; the kept ids)."""
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    full = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    ids = torch.arange(0, 97, 2)
    rows = draft_vocab.head_rows(draft.lm_head) if widen else None
    prune_vocab_head(draft, ids)
    return DraftModelDrafter(draft, 97, 97, 4, 64, vocab=ids, context_rows=rows), full, ids


@pytest.mark.parametrize("widen", [False, True], ids=["cut", "cut + context"])
def test_cut_drafter_q_is_the_softmax_over_the_scored_ids(widen):
    """q is the whole model's softmax over the ids the head scores: the kept (even) ids,
    and widened, also the odd ids of the rows' histories."""
    drafter, full, ids = _even_ids_drafter(widen)
    drafter.admit([[5, 17, 42, 8], [60, 3, 9]])
    params = [SamplingParams(temperature=0.9, seed=1), SamplingParams(temperature=0)]
    draft = drafter.propose(3, params, [make_generator(i) for i in range(2)])
    q = draft.probs  # [B, k, V]
    assert q.shape == (2, 3, 97)
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 3))
    context = torch.tensor([3, 5, 9, 17])  # the odd ids of both rows
    scored = torch.cat([ids, context]) if widen else ids
    outside = torch.ones(97, dtype=torch.bool)
    outside[scored] = False
    assert q[..., outside].abs().max() == 0
    assert all(int(t) in set(scored.tolist()) for t in draft.tokens.flatten())
    if widen:
        assert q[0, 0, context].min() > 0
    # The first position: the full model's logits at the scored ids, softmax at t = 0.9.
    logits = full(torch.tensor([[5, 17, 42, 8]]), full.new_cache(1, 64)).logits[0, -1]
    expected = torch.softmax(logits[scored] / 0.9, -1)
    torch.testing.assert_close(q[0, 0, scored], expected, rtol=1e-4, atol=1e-6)
    assert q[1].max(-1).values.eq(1).all()  # greedy: one-hot
    # ... at the full model's argmax over the scored ids.
    logits = full(torch.tensor([[60, 3, 9]]), full.new_cache(1, 64)).logits[0, -1]
    assert int(draft.tokens[1, 0]) == int(scored[logits[scored].argmax()])


def test_ids_past_the_usable_vocabulary_are_refused():
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    with pytest.raises(ValueError, match="below 90"):
        DraftModelDrafter(draft, 97, 90, 2, 32, vocab=torch.tensor([1, 95]))


def test_head_rows_of_an_int4_head_keep_only_its_blocks():
    layer = Int4Linear(_dense(torch.float32, bias=False, n=96, k=256))
    rows_of = draft_vocab.head_rows(layer)
    assert layer not in [c.cell_contents for c in rows_of.__closure__ or ()]  # not held
    rows = rows_of(IDS)
    for want, got in zip(layer.output_rows(IDS).q4.tensors(), rows.q4.tensors(), strict=True):
        assert torch.equal(want, got)
    x = torch.randn(2, 256)
    torch.testing.assert_close(rows(x), layer(x)[:, IDS])
    dense = _dense(torch.float32)
    assert draft_vocab.head_rows(dense) == dense.output_rows  # other heads: the layer's own


@pytest.fixture()
def widened_drafter():
    return _even_ids_drafter(widen=True)


def test_widened_ids_follow_the_rows(widened_drafter):
    drafter, _, ids = widened_drafter
    context = drafter.context
    drafter.admit([[5, 42], [60, 7], [11, 2]])
    greedy = [SamplingParams(temperature=0)] * 3
    drafter.propose(2, greedy, [make_generator(0)] * 3)
    assert context.extra.tolist() == [5, 7, 11]
    drafter.commit(torch.tensor([0, 0, 0]), torch.tensor([13, 8, 11]))  # 13 is new
    drafter.propose(1, greedy, [make_generator(0)] * 3)
    assert context.extra.tolist() == [5, 7, 11, 13]
    drafter.move_row(2, 1)  # row 1 (7) finished, row 2 (11) takes its place
    drafter.propose(1, greedy[:2], [make_generator(0)] * 2)
    assert context.extra.tolist() == [5, 11, 13]
    assert len(context.rows) == 2
    drafter.reset_row(1)
    drafter.reset_row(0)
    drafter.admit([[4, 6]])  # only kept ids: no small head
    drafter.propose(1, greedy[:1], [make_generator(0)])
    assert context.head is None and torch.equal(context.ids, ids)
