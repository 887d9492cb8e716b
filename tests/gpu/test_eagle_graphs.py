"""The eagle head's drafting steps captured as CUDA graphs (`specdec.graphs.static_eagle`)
on a GPU, and the acceptance-controlled timing drafter there: what CPU-only CI cannot
check (skipped there; tests/unit/test_static_eagle.py runs the same buffers eagerly).

fp32 with TF32 off, greedy: with the target's passes and the head's steps replayed as
graphs, every proposal of the head equals the eager head's (target and head eager),
token for token, with rows joining and leaving and windows of every length; the run's
output is plain greedy; the drafter's realised acceptance follows its profile. Sampling
with the head's graphs passes the chi-square test against plain sampling.

Run on a GPU machine: `pytest tests/gpu/test_eagle_graphs.py`.
"""

import pytest
import torch
import torch.nn.functional as F

from specdec.acceptors import RejectionSampler
from specdec.bench.timing_drafter import (
    AcceptanceControlledDrafter,
    profile_chi_square,
    realised_acceptance,
    records_from,
)
from specdec.drafters.eagle import EagleDrafter
from specdec.engine import Engine
from specdec.heads.eagle import build_eagle
from specdec.models.config import ModelConfig
from specdec.models.loading import build_transformer
from specdec.params import SamplingParams
from specdec.training.target import TargetStates
from specdec.window import FixedWindow

from tiny import hf_tiny, staggered

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
K = 4
WINDOWS = (3, 1, 0, 4, 2, 4, 0, 0, 4)  # k per step, in turn


@pytest.fixture(scope="module", autouse=True)
def _true_fp32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class CycledWindow(FixedWindow):
    def __init__(self) -> None:
        super().__init__(K)
        self.turn = 0

    def choose(self, rows, catch_up=0, remaining=None) -> int:
        self.turn += 1
        return WINDOWS[self.turn % len(WINDOWS)]


@pytest.fixture(scope="module")
def setup(tokenizer):
    hf = hf_tiny("qwen2")
    target = build_transformer(
        ModelConfig.from_hf_dict(hf.config.to_dict()), hf.state_dict(), torch.float32, CUDA
    )
    head = build_eagle(target, intermediate_size=48, n_predict=K)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device) * 0.2)
    head = head.to(CUDA).eval()
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (3, 9, 5, 12, 4)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = Engine(target, tokenizer, frozenset(), max_batch=5, cuda_graphs=False)
    outputs = [c.token_ids for c in plain.generate(prompts, params)]
    return target, head, prompts, params, records_from(prompts, outputs)


def run(setup, tokenizer, graphs: bool, max_batch: int, profile=(0.8,), window=None):
    target, head, prompts, params, records = setup
    proposals, heads, drafters = [], [], []
    propose = EagleDrafter.propose

    def recorded(self, k, p, g):
        draft = propose(self, k, p, g)
        proposals.append(draft.tokens.tolist())
        return draft

    def factory(rows, length):
        heads.append(EagleDrafter(head, rows, length, static_passes=graphs, cuda_graphs=graphs))
        drafters.append(AcceptanceControlledDrafter(records, profile, 97, cost=heads[-1], seed=1))
        return drafters[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        window=window or CycledWindow(),
        static_passes=graphs,
        cuda_graphs=graphs,
    )
    EagleDrafter.propose = recorded
    try:
        seqs = staggered(engine, prompts, [params] * len(prompts))
    finally:
        EagleDrafter.propose = propose
    assert [s.output_ids for s in seqs] == list(records.values())
    assert sum(d.off_record for d in drafters) == 0
    return proposals, heads, [s.trace for s in seqs]


@pytest.mark.parametrize("max_batch", [3, 5])  # 3: rows join and leave through buckets 1..3
def test_head_graph_replay_equals_eager(setup, tokenizer, max_batch):
    eager, _, eager_traces = run(setup, tokenizer, False, max_batch)
    replayed, heads, traces = run(setup, tokenizer, True, max_batch)
    assert replayed == eager and traces == eager_traces and len(eager) > 20
    passes = [r for h in heads if h._static is not None for r in h._static._passes.values()]
    assert passes and all(replay.graph is not None for replay in passes)


def test_timing_drafter_follows_its_profile_with_graphs(setup, tokenizer):
    profile = (0.9, 0.6, 0.75, 0.5)
    _, _, traces = run(setup, tokenizer, True, 5, profile=profile, window=FixedWindow(K))
    reached, kept = realised_acceptance(traces)
    assert reached[0] > 40
    # chi-square, 4 degrees of freedom at P = 0.001
    assert profile_chi_square(reached, kept, profile)[0] < 18.47


TREE = (2, 2, 1)


def trees(setup, tokenizer, graphs: bool, max_batch: int):
    """(paths, scores) of every candidate tree a tree drafter proposed, the engine
    verifying them, and the head's replays."""
    target, head, prompts, params, records = setup
    proposed, drafters = [], []
    tree_draft = EagleDrafter._tree_draft

    def recorded(self, paths, scores, p):
        proposed.append((paths.tolist(), scores))
        return tree_draft(self, paths, scores, p)

    def factory(rows, length):
        drafters.append(
            EagleDrafter(head, rows, length, TREE, 3, static_passes=graphs, cuda_graphs=graphs)
        )
        return drafters[-1]

    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        window=CycledWindow(),
        max_tree_nodes=EagleDrafter(head, 1, 8, TREE, 3).max_nodes,
        static_passes=graphs,
        cuda_graphs=graphs,
    )
    EagleDrafter._tree_draft = recorded
    try:
        seqs = staggered(engine, prompts, [params] * len(prompts))
    finally:
        EagleDrafter._tree_draft = tree_draft
    assert [s.output_ids for s in seqs] == list(records.values())
    replays = [r for d in drafters if d._static is not None for r in d._static._passes.values()]
    return proposed, replays


@pytest.mark.parametrize("max_batch", [2, 5])
def test_head_tree_graph_replay_equals_eager(setup, tokenizer, max_batch):
    eager, _ = trees(setup, tokenizer, False, max_batch)
    replayed, replays = trees(setup, tokenizer, True, max_batch)
    assert replays and all(replay.graph is not None for replay in replays)
    assert len(replayed) == len(eager) > 20
    for (paths, scores), (want_paths, want_scores) in zip(replayed, eager, strict=True):
        assert paths == want_paths
        torch.testing.assert_close(scores, want_scores)


def test_speculative_sampling_distribution_with_head_graphs(tokenizer):
    """The end-to-end chi-square homogeneity test of tests/statistical with the eagle
    head drafting through its graphs (and the target's passes replayed): sampling with
    its greedy drafts is sampling from the target. The head is `build_eagle`'s start
    (near the identity on the state), whose first drafts the sharpened target often
    keeps."""
    from statistical import test_end_to_end_distribution as e2e

    hf = e2e.sharp_tiny()
    target = build_transformer(
        ModelConfig.from_hf_dict(hf.config.to_dict()), hf.state_dict(), torch.float32, CUDA
    )
    case = e2e.CASES["top-k 3, 4 tokens"]
    opts = {"static_passes": True, "cuda_graphs": True}
    greedy = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True)
    reference = Engine(target, tokenizer, frozenset(), cuda_graphs=False)
    head = fitted_head(target, e2e.PROMPT + reference.generate([e2e.PROMPT], greedy)[0].token_ids)
    plain = e2e.sequences(
        Engine(target, tokenizer, frozenset(), max_batch=e2e.MAX_BATCH, **opts), case, 0
    )
    drafters = []

    def factory(rows, length):
        drafters.append(EagleDrafter(head, rows, length, **opts))
        return drafters[-1]

    spec_engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=e2e.MAX_BATCH,
        drafter_factory=factory,
        acceptor=RejectionSampler(),
        window=FixedWindow(3),
        **opts,
    )
    spec = e2e.sequences(spec_engine, case, e2e.N)
    replays = [r for d in drafters if d._static is not None for r in d._static._passes.values()]
    assert replays and all(replay.graph is not None for replay in replays)
    value = e2e.homogeneity(plain, spec)
    print(f"p = {value:.3g}", f"acceptance {spec['acceptance']:.3f}")
    assert value > e2e.PASS
    assert spec["acceptance"] > 0.1


def fitted_head(target, sequence: list[int], steps: int = 60):
    """An eagle head fitted (teacher-forced, two draft steps) to the target's choices
    along one sequence."""
    torch.manual_seed(0)
    head = build_eagle(target, intermediate_size=64, n_predict=3).to(CUDA)
    tokens = torch.tensor([sequence], device=CUDA)
    feats = TargetStates(target)(tokens)  # [1, L, E]
    labels = target.lm_head(feats).argmax(-1)[0]  # the target's choice after each
    T = tokens.shape[1] - 1
    positions = torch.arange(T, device=CUDA)[None]
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        preds = head.unrolled(tokens[:, 1:], feats[:, :-1], positions, 2)
        loss = sum(
            F.cross_entropy(head.logits(p[0, step:]), labels[step + 1 :])
            for step, p in enumerate(preds)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)
