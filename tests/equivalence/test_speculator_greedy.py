"""Speculator heads drafting: greedy speculative output == plain greedy output in fp32.

The scripted heads find where they are from the hidden state alone: they look the state the
engine gave them (`observe`) up among the target's states over the reference sequences, so
a state from the wrong position (or row) would make them propose the wrong tokens and the
exact step counts below would fail.
"""

import math

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import SpeculatorDrafter
from specdec.engine import Engine
from specdec.heads import SpeculatorConfig
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import plain_greedy_references

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25
HEADS = 3


class ScriptedSpeculator:
    """Proposes the true greedy continuation at draft positions where `right(i)`, a wrong
    token elsewhere; checks the state and last token it is given."""

    def __init__(self, target, prompts, references, right):
        self.config = SpeculatorConfig(HEADS, 64, 64, 97, 97)
        self.proj = [torch.nn.Linear(1, 1)]  # the drafter reads the dtype from proj[0]
        states = TargetStates(target)
        self.sequences = [p + r for p, r in zip(prompts, references, strict=True)]
        self.states = [states(torch.tensor([s]))[0] for s in self.sequences]  # [S, E] each
        self.right = right
        self.calls = 0

    def propose_greedy(self, hidden, last, n):
        self.calls += 1
        out = torch.zeros(len(hidden), n, dtype=torch.long)
        for row, (h, token) in enumerate(zip(hidden, last.tolist(), strict=True)):
            dist = [(s - h).norm(dim=-1) for s in self.states]
            seq = min(range(len(dist)), key=lambda r: float(dist[r].min()))
            pos = int(dist[seq].argmin())  # the last position in the target's cache
            assert float(dist[seq][pos]) < 1e-4, "observe() gave a state of no cached position"
            sequence = self.sequences[seq]
            assert token == sequence[pos + 1], "the last token is not the one sampled there"
            for i in range(n):
                true = sequence[pos + 2 + i] if pos + 2 + i < len(sequence) else 0
                out[row, i] = true if self.right(i) else (true + 1) % 97
        return out


@pytest.fixture(scope="module")
def setup(tokenizer):
    return plain_greedy_references(tokenizer, PROMPTS, N)


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize("max_batch", [8, 2])  # 2: rows finish, move and get re-admitted
@pytest.mark.parametrize(
    "right,steps",
    [
        (lambda i: True, math.ceil((N - 1) / (HEADS + 1))),
        (lambda i: False, N - 1),
        (lambda i: i < 1, math.ceil((N - 1) / 2)),
    ],
    ids=["all right", "all wrong", "first right"],
)
def test_scripted_heads_exact_output_and_passes(
    setup, tokenizer, acceptor, max_batch, right, steps
):
    target, refs, params = setup
    spec = ScriptedSpeculator(target, PROMPTS, refs, right)
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, length: SpeculatorDrafter(spec, b),
        acceptor=acceptor,
        window=FixedWindow(5),  # more than the heads: each step drafts HEADS tokens
    )
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert [c.stats.steps for c in out] == [steps] * len(PROMPTS)
    assert spec.calls > 0
