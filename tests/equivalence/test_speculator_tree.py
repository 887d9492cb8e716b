"""Candidate trees from speculator heads, verified in one pass: greedy output == plain
greedy output in fp32, with exact target-pass counts.

The scripted heads locate the state `observe` gave them among the target's states over the
reference sequences (as in test_speculator_greedy) and propose, per head, candidates in
which the true continuation is NOT the first (rank 1 of top-k) when `right(i)`, and absent
otherwise. The best-scoring path is therefore always wrong, and a walk that followed it (or
a cache compacted to the wrong nodes) would break the exact outputs and step counts.
"""

import itertools
import math

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import SpeculatorDrafter
from specdec.engine import Engine
from specdec.heads import SpeculatorConfig
from specdec.heads.tree import TreeDraft
from specdec.params import SamplingParams
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf, plain_greedy_references

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25
HEADS = 3
TREE = (3, 2, 2)


class ScriptedTreeSpeculator:
    def __init__(self, target, prompts, references, right):
        self.config = SpeculatorConfig(HEADS, 64, 64, 97, 97)
        self.proj = [torch.nn.Linear(1, 1)]  # the drafter reads the dtype from proj[0]
        states = TargetStates(target)
        self.sequences = [p + r for p, r in zip(prompts, references, strict=True)]
        self.states = [states(torch.tensor([s]))[0] for s in self.sequences]  # [S, E] each
        self.right = right
        self.calls = 0
        self.strict = True  # False: states off the references get arbitrary candidates

    def _locate(self, h, token):
        dist = [(s - h).norm(dim=-1) for s in self.states]
        seq = min(range(len(dist)), key=lambda r: float(dist[r].min()))
        pos = int(dist[seq].argmin())
        if not self.strict and float(dist[seq][pos]) >= 1e-4:
            return [(token + 1 + i) % 97 for i in range(HEADS)]
        assert float(dist[seq][pos]) < 1e-4, "observe() gave a state of no cached position"
        sequence = self.sequences[seq]
        if not self.strict and token != sequence[pos + 1]:
            return [(token + 1 + i) % 97 for i in range(HEADS)]
        assert token == sequence[pos + 1], "the last token is not the one sampled there"
        return [sequence[i] if i < len(sequence) else 0 for i in range(pos + 2, pos + 2 + HEADS)]

    def propose_tree(self, hidden, last, topk):
        self.calls += 1
        n = len(topk)
        P = math.prod(topk)
        paths = torch.zeros(len(hidden), P, n, dtype=torch.long)
        scores = torch.zeros(len(hidden), P)
        for row, (h, token) in enumerate(zip(hidden, last.tolist(), strict=True)):
            true = self._locate(h, token)
            for p, ranks in enumerate(itertools.product(*(range(k) for k in topk))):
                on_track = True
                for i, r in enumerate(ranks):
                    if on_track and self.right(i) and r == 1:
                        tok = true[i]
                    else:  # a wrong token, distinct per rank
                        tok = (true[i] + 1 + r) % 97
                    on_track = on_track and tok == true[i]
                    paths[row, p, i] = tok
                    scores[row, p] -= r
        return paths, scores


@pytest.fixture(scope="module")
def setup(tokenizer):
    return plain_greedy_references(tokenizer, PROMPTS, N)


def _engine(target, tokenizer, spec, max_batch, acceptor, n_candidates, k=5):
    return Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, length: SpeculatorDrafter(
            spec, b, tree=TREE, n_candidates=n_candidates
        ),
        acceptor=acceptor,
        window=FixedWindow(k),  # more than the heads: each step drafts a tree of HEADS levels
        max_tree_nodes=n_candidates * HEADS,
    )


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()], ids=["greedy", "rs"])
@pytest.mark.parametrize("max_batch", [8, 2])  # 2: rows finish, move and get re-admitted
@pytest.mark.parametrize(
    "right,n_candidates,steps",
    [
        (lambda i: True, 12, math.ceil((N - 1) / (HEADS + 1))),
        (lambda i: False, 12, N - 1),
        (lambda i: i < 1, 12, math.ceil((N - 1) / 2)),
        # The 4 best paths have rank sums 0, 1, 1, 1: the true prefix survives at depth 1.
        (lambda i: True, 4, math.ceil((N - 1) / 2)),
    ],
    ids=["all right", "all wrong", "first right", "pruned"],
)
def test_scripted_tree_exact_output_and_passes(
    setup, tokenizer, acceptor, max_batch, right, n_candidates, steps
):
    target, refs, params = setup
    spec = ScriptedTreeSpeculator(target, PROMPTS, refs, right)
    engine = _engine(target, tokenizer, spec, max_batch, acceptor, n_candidates)
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert [c.stats.steps for c in out] == [steps] * len(PROMPTS)
    drafted = [c.stats.drafted for c in out]
    assert all(d <= HEADS * steps for d in drafted) and spec.calls > 0


def test_ragged_acceptance_in_one_batch(setup, tokenizer):
    """Rows accept different path lengths in the same passes (compaction per row)."""
    target, refs, params = setup
    depth = {0: 3, 1: 0, 2: 1, 3: 2}  # per prompt: heads right before the first miss

    class Ragged(ScriptedTreeSpeculator):
        def propose_tree(self, hidden, last, topk):
            rows = []
            for row in range(len(hidden)):
                which = min(
                    range(len(self.states)),
                    key=lambda r: float((self.states[r] - hidden[row]).norm(dim=-1).min()),
                )
                self.right = lambda i, d=depth[which]: i < d
                rows.append(super().propose_tree(hidden[row : row + 1], last[row : row + 1], topk))
            return torch.cat([p for p, _ in rows]), torch.cat([s for _, s in rows])

    spec = Ragged(target, PROMPTS, refs, None)
    engine = _engine(target, tokenizer, spec, 8, GreedyAcceptor(), 12)
    passes = []
    forward = target.forward
    target.forward = lambda *a, **kw: passes.append(1) or forward(*a, **kw)
    try:
        out = engine.generate(PROMPTS, params)
    finally:
        del target.forward
    assert [c.token_ids for c in out] == refs
    expected = [math.ceil((N - 1) / (depth[b] + 1)) for b in range(len(PROMPTS))]
    assert len(passes) == 1 + max(expected)  # one prefill, then one pass per step
    assert [c.stats.steps for c in out] == expected
    assert [c.stats.accepted for c in out] == [N - 1 - s for s in expected]


@pytest.mark.parametrize("sampled_tree", [True, False])
def test_trees_for_sampled_rows(setup, tokenizer, sampled_tree):
    """temperature > 0 rows get the whole tree (verified by recursive rejection sampling),
    or with `sampled_tree=False` only the best path; greedy rows always get the tree."""
    target, refs, _ = setup
    spec = ScriptedTreeSpeculator(target, PROMPTS, refs, lambda i: True)
    drafter = SpeculatorDrafter(spec, 4, tree=TREE, n_candidates=12, sampled_tree=sampled_tree)
    drafter.admit([p + r[:1] for p, r in zip(PROMPTS[:2], refs[:2], strict=True)])
    states = torch.stack([spec.states[b][len(PROMPTS[b]) - 1] for b in range(2)])
    drafter.observe(states)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8)]
    draft = drafter.propose(5, params, [None, None])
    assert isinstance(draft, TreeDraft)
    greedy, sampled = draft.trees
    assert len(greedy.paths) == 12 and greedy.max_depth == HEADS
    if sampled_tree:
        assert len(sampled.paths) == 12
    else:
        assert len(sampled.paths) == 1 and sampled.num_nodes == HEADS
    # The best path (ranks 0, 0, 0) is wrong: the true continuation is a later candidate.
    best = [greedy.tokens[n] for n in greedy.paths[0]]
    assert best != refs[0][1:4] and refs[0][1:4] in [
        [greedy.tokens[n] for n in path] for path in greedy.paths
    ]


def test_mixed_batch_greedy_rows_stay_exact(setup, tokenizer):
    """Greedy rows next to sampling rows in the same tree passes keep their exact output
    (the sampling rows leave the references, where the scripted heads propose anything)."""
    target, refs, params = setup
    spec = ScriptedTreeSpeculator(target, PROMPTS, refs, lambda i: True)
    spec.strict = False
    engine = _engine(target, tokenizer, spec, 8, RejectionSampler(), 12)
    sampled = SamplingParams(temperature=0.8, max_tokens=N, seed=3)
    out = engine.generate(PROMPTS, [params, sampled, params, sampled])
    assert [out[0].token_ids, out[2].token_ids] == [refs[0], refs[2]]
    steps = math.ceil((N - 1) / (HEADS + 1))
    assert [out[0].stats.steps, out[2].stats.steps] == [steps, steps]
    assert all(len(c.token_ids) == N for c in out)


def test_tree_refusals(setup, tokenizer):
    from specdec.acceptors import LossyTypicalAcceptor
    from specdec.errors import InvalidParameterError

    target, refs, params = setup
    spec = ScriptedTreeSpeculator(target, PROMPTS, refs, lambda i: True)
    with pytest.raises(InvalidParameterError, match="top-k sizes"):
        SpeculatorDrafter(spec, 2, tree=(3, 2, 2, 2))
    # A chain-only acceptor has no tree form: refused, never silently applied.
    engine = _engine(target, tokenizer, spec, 8, LossyTypicalAcceptor(), 12)
    with pytest.raises(InvalidParameterError, match="verifies chains only"):
        engine.generate(PROMPTS[:1], params)
    # Cache room for the widest tree must be reserved.
    engine = _engine(target, tokenizer, spec, 8, GreedyAcceptor(), 12)
    engine.max_tree_nodes = 4
    with pytest.raises(InvalidParameterError, match="max_tree_nodes"):
        engine.generate(PROMPTS[:1], params)


@pytest.mark.parametrize("right", [lambda i: True, lambda i: i < 2], ids=["all right", "two"])
def test_sliding_window_target(tokenizer, right):
    """A Mistral-style target whose window (8) the sequences outgrow: still exact."""
    target = native_from_hf(hf_tiny("mistral", sliding_window=8))
    params = SamplingParams(temperature=0, max_tokens=N)
    refs = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(PROMPTS, params)]
    spec = ScriptedTreeSpeculator(target, PROMPTS, refs, right)
    out = _engine(target, tokenizer, spec, 8, GreedyAcceptor(), 12).generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    heads_right = HEADS if right(HEADS - 1) else 2
    assert [c.stats.steps for c in out] == [math.ceil((N - 1) / (heads_right + 1))] * len(PROMPTS)
