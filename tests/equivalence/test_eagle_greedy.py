"""An eagle head drafting: speculative output == plain greedy output in fp32, with drafts
that are kept (a head trained on the target's own continuations) and drafts that are not
(an untrained one), rows finishing and re-admitted, under both lossless acceptors."""

import pytest
import torch
import torch.nn.functional as F

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import EagleDrafter
from specdec.engine import Engine
from specdec.heads.eagle import build_eagle
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import plain_greedy_references

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25


@pytest.fixture(scope="module")
def setup(tokenizer):
    return plain_greedy_references(tokenizer, PROMPTS, N)


def trained_head(target, refs):
    """A head fitted (teacher-forced, two draft steps) to the target's continuations."""
    torch.manual_seed(0)
    head = build_eagle(target, intermediate_size=64, n_predict=4)
    states = TargetStates(target)
    seqs = [torch.tensor([p + r]) for p, r in zip(PROMPTS, refs, strict=True)]
    data = [(s, states(s)) for s in seqs]
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(60):
        loss = 0
        for s, f in data:
            labels = target.lm_head(f).argmax(-1)[0]  # the target's choice after each
            T = s.shape[1] - 1
            preds = head.unrolled(s[:, 1:], f[:, :-1], torch.arange(T)[None], 2)
            for step, p in enumerate(preds):
                loss = loss + F.cross_entropy(head.logits(p[0, step:]), labels[step + 1 :])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize("max_batch", [8, 2])  # 2: rows finish, move and get re-admitted
@pytest.mark.parametrize("trained", [True, False], ids=["trained", "untrained"])
def test_eagle_drafts_leave_greedy_output_exact(setup, tokenizer, acceptor, max_batch, trained):
    target, refs, params = setup
    head = trained_head(target, refs) if trained else build_eagle(target, n_predict=4)
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, length: EagleDrafter(head, b, length),
        acceptor=acceptor,
        window=FixedWindow(6),  # more than the head's n_predict: it drafts 4
    )
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    passes = sum(c.stats.steps for c in out)
    if trained:  # over 3 tokens a pass (27 passes here; the untrained head's start, which
        # repeats the target's last choice, takes 41-42 on these looping continuations)
        assert passes < len(PROMPTS) * (N - 1) / 3


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize("max_batch", [8, 2])
@pytest.mark.parametrize("tree", [(3, 2, 1), (2, 2, 2, 2)], ids=["321", "2222-beam4"])
def test_eagle_trees_leave_greedy_output_exact(setup, tokenizer, acceptor, max_batch, tree):
    """Candidate trees verified in one pass (the tree walk), from a trained head: the
    output is plain greedy's, and the trees are kept deeper than the chain of top-1
    drafts is (fewer passes than the same head drafting chains)."""
    target, refs, params = setup
    head = trained_head(target, refs)
    n_candidates = 4 if len(tree) == 4 else None

    def run(shape):
        make = lambda b, length: EagleDrafter(head, b, length, shape, n_candidates)  # noqa: E731
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            max_batch=max_batch,
            drafter_factory=make,
            acceptor=acceptor,
            window=FixedWindow(len(shape)),
            max_tree_nodes=make(1, 8).max_nodes,
        )
        out = engine.generate(PROMPTS, params)
        return [c.token_ids for c in out], sum(c.stats.steps for c in out)

    tokens, passes = run(tree)
    assert tokens == refs
    _, chain_passes = run((1,) * len(tree))
    assert passes < chain_passes


def test_a_reused_prompt_prefix_drafts_as_a_computed_one(setup, tokenizer):
    """A prefill that copies a stored prompt prefix gives the drafter states only past it;
    the head's own entries for the prefix come from its store, so it proposes exactly
    what it proposes without any store, step by step (a head with random weights, whose
    drafts depend on every entry it attends to)."""
    target, refs, params = setup
    head = build_eagle(target, intermediate_size=64, n_predict=4)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    shared = [5, 17, 42, 8, 60, 3, 3, 3]
    prompts = [shared + [9, 12], shared + [80, 81, 2], shared[:6] + [44]]

    class Recorded(EagleDrafter):
        def propose(self, k, params, generators):
            draft = super().propose(k, params, generators)
            proposals.append(draft.tokens.tolist())
            return draft

    def run(store_tokens):
        proposals.clear()
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            max_batch=1,  # one at a time: each prefill can reuse the ones before it
            drafter_factory=lambda b, length: Recorded(head, b, length),
            acceptor=GreedyAcceptor(),
            window=FixedWindow(4),
            prefix_cache_tokens=store_tokens,
        )
        out = [engine.generate([p], params)[0].token_ids for p in prompts]
        return out, list(proposals), engine

    proposals: list = []
    tokens, drafts, engine = run(4096)
    assert engine.prefix_cache.hits > 0 and engine.draft_prefix_cache.hits > 0
    assert (tokens, drafts) == run(0)[:2]
