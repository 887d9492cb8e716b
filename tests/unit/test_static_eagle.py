"""The eagle head's fixed-shape drafting passes (`specdec.graphs.static_eagle`) draft what
the eager drafter drafts, token for token in fp32: in an engine whose rows join and
leave, whose windows vary (k = 0 steps pile up entries that the eager path then feeds),
with drafts kept at several lengths so the feeds span every entry bucket."""

import pytest
import torch

from specdec.bench.timing_drafter import AcceptanceControlledDrafter, records_from
from specdec.drafters.base import PassStates
from specdec.drafters.eagle import EagleDrafter
from specdec.engine import Engine
from specdec.graphs.static_eagle import StaticEagle
from specdec.heads.eagle import build_eagle
from specdec.params import SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

K = 4
WINDOWS = (3, 1, 0, 4, 2, 4, 0, 0, 4)  # k per step, in turn


class CycledWindow(FixedWindow):
    """k from WINDOWS in turn: every draft length, and plain steps between."""

    def __init__(self) -> None:
        super().__init__(K)
        self.turn = 0

    def choose(self, rows, catch_up=0, remaining=None) -> int:
        self.turn += 1
        return WINDOWS[self.turn % len(WINDOWS)]


@pytest.fixture(scope="module")
def setup(tokenizer):
    target = native_from_hf(hf_tiny("qwen2"))
    head = build_eagle(target, intermediate_size=48, n_predict=K)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # far from its identity start, so every block matters
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (3, 9, 5, 12, 4)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = Engine(target, tokenizer, frozenset(), max_batch=5).generate(prompts, params)
    return target, head.eval(), prompts, params, records_from(prompts, [c.token_ids for c in plain])


def drafts_in_engine(setup, tokenizer, static: bool, max_batch: int):
    """Every proposal of the head (rows, its tokens) over a staggered run whose
    acceptance is controlled (0.8 a position), and the static passes' buckets."""
    target, head, prompts, params, records = setup
    proposals, heads = [], []
    propose = EagleDrafter.propose

    def recorded(self, k, p, g):
        draft = propose(self, k, p, g)
        proposals.append(draft.tokens.tolist())
        return draft

    def factory(rows, length):
        heads.append(EagleDrafter(head, rows, length, static_passes=static))
        return AcceptanceControlledDrafter(records, (0.8,), 97, cost=heads[-1], seed=1)

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        window=CycledWindow(),
    )
    EagleDrafter.propose = recorded
    try:
        seqs = staggered(engine, prompts, [params] * len(prompts))
    finally:
        EagleDrafter.propose = propose
    assert [s.output_ids for s in seqs] == list(records.values())
    # (the engine sizes its cache, and so a drafter, to the requests waiting when idle)
    buckets = [set(h._static._passes) for h in heads if h._static is not None]
    return proposals, len(heads), set().union(*buckets) if buckets else None


@pytest.mark.parametrize("max_batch", [3, 5])  # 3: rows finish, move and get re-admitted
def test_static_drafting_equals_eager_in_an_engine(setup, tokenizer, max_batch):
    eager, _, none = drafts_in_engine(setup, tokenizer, False, max_batch)
    static, drafters, buckets = drafts_in_engine(setup, tokenizer, True, max_batch)
    assert none is None and len(static) == len(eager) > 20 and drafters > 1
    assert static == eager
    assert {kind for kind, *_ in buckets} == {"chain"}
    rows = {r for _, r, _, _, _ in buckets}
    entries = {t for _, _, t, _, _ in buckets}
    assert entries >= {2, 4, 5} and {n for *_, n, _ in buckets} >= {1, 2, 3, 4}
    assert rows == ({1, 2, 3} if max_batch == 3 else {1, 4})  # (the row buckets it met)


@torch.inference_mode()
def test_padding_rows_and_entries_change_nothing(setup):
    """Two rows of a bucket of four, with entries of 1 and 3 in a bucket of 4, then one
    each: the same
    drafts and the same head cache entries as the eager drafter, and nothing written to
    the padding rows' cache but their scratch slot."""
    target, head = setup[:2]
    E = target.config.hidden_size
    g = torch.Generator().manual_seed(5)
    drafters = [EagleDrafter(head, 4, 40, static_passes=static) for static in (False, True)]
    histories = [[3, 4, 5, 6, 7], [8, 9, 10]]
    prefill = PassStates(
        torch.tensor([[3, 4, 5, 6], [8, 9, 0, 0]]),
        torch.randn(2, 4, E, generator=g),
        torch.tensor([4, 2]),
    )
    verify = PassStates(
        torch.tensor([[7, 0, 0], [10, 11, 12]]),
        torch.randn(2, 3, E, generator=g),
        torch.tensor([1, 3]),
    )
    one = PassStates(
        torch.tensor([[20], [13]]),
        torch.randn(2, 1, E, generator=g),
        torch.ones(2, dtype=torch.long),
    )
    out = []
    for drafter in drafters:
        drafter.admit(histories)
        drafter.observe_pass(prefill)  # 4 and 2 entries: bucket (2, 4)
        first = drafter.propose(K, None, None).tokens
        drafter.commit(torch.tensor([0, 2]), torch.tensor([20, 13]))
        drafter.observe_pass(verify)  # 1 and 3 entries: bucket (2, 4) again
        second = drafter.propose(3, None, None).tokens
        drafter.commit(torch.tensor([0, 0]), torch.tensor([21, 22]))
        drafter.observe_pass(one)  # 1 entry a row: bucket (2, 1), q, k and v at once
        out.append((first, second, drafter.propose(2, None, None).tokens, drafter))
    *eager_drafts, eager = out[0]
    *static_drafts, static = out[1]
    for got, want in zip(static_drafts, eager_drafts, strict=True):
        assert torch.equal(got, want)
    want = {("chain", 2, 4, K, 40), ("chain", 2, 4, 3, 40), ("chain", 2, 1, 2, 40)}
    assert set(static._static._passes) == want
    assert torch.equal(static.lengths, eager.lengths)
    for row, n in enumerate(eager.lengths[:2].tolist()):  # the true entries
        torch.testing.assert_close(static.k[row, :, :n], eager.k[row, :, :n])
    assert not static.k[2:, :, :40].any() and not static.v[2:, :, :40].any()


def test_graphs_need_a_cuda_device(setup):
    head = setup[1]
    k = torch.zeros(2, 2, 9, 16)
    with pytest.raises(ValueError, match="CUDA"):
        StaticEagle(head, k, k.clone(), 3, graphs=True)


TREE = (2, 2, 1)


def trees_in_engine(setup, tokenizer, static: bool, max_batch: int):
    """Every candidate tree's (paths, scores) a tree drafter proposed in a staggered run
    verified by the engine, and the kinds of static passes it ran."""
    target, head, prompts, params, records = setup
    trees, drafters = [], []
    tree_draft = EagleDrafter._tree_draft

    def recorded(self, paths, scores, p):
        trees.append((paths.tolist(), scores))
        return tree_draft(self, paths, scores, p)

    def factory(rows, length):
        drafters.append(EagleDrafter(head, rows, length, TREE, 3, static_passes=static))
        return drafters[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        window=CycledWindow(),
        max_tree_nodes=EagleDrafter(head, 1, 8, TREE, 3).max_nodes,
    )
    EagleDrafter._tree_draft = recorded
    try:
        seqs = staggered(engine, prompts, [params] * len(prompts))
    finally:
        EagleDrafter._tree_draft = tree_draft
    assert [s.output_ids for s in seqs] == list(records.values())
    return trees, {key[0] for d in drafters if d._static for key in d._static._passes}


@pytest.mark.parametrize("max_batch", [2, 5])
def test_static_trees_equal_eager_trees_in_an_engine(setup, tokenizer, max_batch):
    """A tree drafter (top-2, 2, 1 with a beam of 3) verified by the engine: every
    candidate path and its score as the eager drafter's, output plain greedy."""
    eager, none = trees_in_engine(setup, tokenizer, False, max_batch)
    static, kinds = trees_in_engine(setup, tokenizer, True, max_batch)
    assert not none and kinds == {("tree", TREE[:n], 3) for n in (1, 2, 3)}
    assert len(static) == len(eager) > 20
    for (paths, scores), (want_paths, want_scores) in zip(static, eager, strict=True):
        assert paths == want_paths
        torch.testing.assert_close(scores, want_scores)
