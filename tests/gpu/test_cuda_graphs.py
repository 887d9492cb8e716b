"""CUDA-graph replay of the static passes (`specdec.graphs.static_pass`) on a GPU: what
CPU-only CI cannot check (skipped there; tests/equivalence/test_static_passes.py runs the
same static buffers eagerly on the CPU).

fp32 with TF32 off, greedy: an engine whose target passes, draft-model steps and heads'
drafting replay captured graphs emits exactly what the eager engine (`cuda_graphs=False`)
emits, step for step, for every drafter, trees, and rows joining and leaving (every batch
size picks its bucket); a graph-replayed forward matches the eager forward's logits; and
speculative sampling with graphs on passes the chi-square test against plain sampling.
By default a model's passes run the faster of its own layers and the compiled ones
(`specdec.graphs.fused_layers`), raced at the first capture; each fused stack is also
forced and checked on its own.

Run on a GPU machine: `make test-gpu` (or `pytest tests/gpu`).
"""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter, NgramDrafter, SpeculatorDrafter
from specdec.engine import Engine
from specdec.graphs.static_pass import StaticPasses
from specdec.heads import SpeculatorConfig
from specdec.heads.mlp import MLPSpeculator
from specdec.models.config import ModelConfig
from specdec.models.loading import build_transformer
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, staggered

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7], [9]]
LENGTHS = [20, 5, 13, 9, 16]


@pytest.fixture(scope="module", autouse=True)
def _true_fp32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def on_cuda(hf, dtype=torch.float32):
    cfg = ModelConfig.from_hf_dict(hf.config.to_dict())
    return build_transformer(cfg, hf.state_dict(), dtype, CUDA)


@pytest.fixture(scope="module")
def models():
    target = on_cuda(hf_tiny("qwen2"))
    draft = on_cuda(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    torch.manual_seed(0)
    heads = MLPSpeculator(SpeculatorConfig(3, 64, 64, 97, 97)).to(CUDA).eval()
    return target, draft, heads


def _drafters(models, graphs: bool):
    """name -> (drafter factory, window, max_tree_nodes); graphs on or off everywhere."""
    target, draft, heads = models
    opts = {"static_passes": graphs, "cuda_graphs": graphs}

    def model_drafter(model):
        return lambda b, n: DraftModelDrafter(model, 97, 97, b, n, **opts)

    def heads_drafter(tree):
        return lambda b, n: SpeculatorDrafter(heads, b, CUDA, tree=tree, **opts)

    return {
        "plain": (None, FixedWindow(0), 0),
        "draft k=1": (model_drafter(draft), FixedWindow(1), 0),
        "draft k=6": (model_drafter(draft), FixedWindow(6), 0),
        "self draft k=4": (model_drafter(target), FixedWindow(4), 0),
        "draft auto": (model_drafter(draft), AdaptiveWindow(k_max=6), 0),
        "n-gram k=3": (lambda b, n: NgramDrafter(), FixedWindow(3), 0),
        "heads chain": (heads_drafter(None), FixedWindow(3), 0),
        "heads tree": (heads_drafter((2, 2, 2)), FixedWindow(3), 2 + 4 + 8),
    }


def _engine(models, tokenizer, name, graphs, max_batch, acceptor):
    factory, window, nodes = _drafters(models, graphs)[name]
    return Engine(
        models[0],
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=factory,
        acceptor=acceptor,
        window=window,
        max_len=64,
        max_tree_nodes=nodes,
        static_passes=graphs,
        cuda_graphs=graphs,
    )


def _captured(engine) -> bool:
    passes = engine._target._passes.values()
    return bool(passes) and all(replay.graph is not None for _, replay in passes)


NAMES = list(_drafters((None, None, None), False))


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()], ids=["greedy", "rs"])
@pytest.mark.parametrize("max_batch", [3, 8])  # 3: rows join and leave through buckets 1, 2, 3
@pytest.mark.parametrize("name", NAMES)
def test_graph_replay_equals_eager(models, tokenizer, name, max_batch, acceptor):
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    runs = {}
    for graphs in (False, True):
        engine = _engine(models, tokenizer, name, graphs, max_batch, acceptor)
        seqs = staggered(engine, PROMPTS, params)
        # `auto` picks k from wall-clock costs: only its tokens are deterministic
        runs[graphs] = [(s.output_ids, None if "auto" in name else s.trace) for s in seqs]
        if graphs:
            assert _captured(engine)
    assert runs[True] == runs[False]


@pytest.mark.parametrize("stack", ["fused", "fused, efficient attention"])
@pytest.mark.parametrize("name", ["plain", "draft k=6", "heads tree", "n-gram k=3"])
def test_fused_layers_replay_equals_eager(models, tokenizer, name, stack):
    """The models' passes forced through the compiled layers (`layer_stack`; by default
    the first capture races them against the model's own), greedy, fp32."""
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    runs = {}
    saved = [model.layer_stack for model in models[:2]]
    try:
        for graphs in (False, True):
            models[0].layer_stack = models[1].layer_stack = stack
            engine = _engine(models, tokenizer, name, graphs, 3, GreedyAcceptor())
            runs[graphs] = [(s.output_ids, s.trace) for s in staggered(engine, PROMPTS, params)]
            if graphs:
                assert _captured(engine) and set(engine._target.stacks.values()) == {stack}
    finally:
        models[0].layer_stack, models[1].layer_stack = saved
    assert runs[True] == runs[False]


def test_graphs_are_the_default_on_cuda(models, tokenizer):
    engine = Engine(models[0], tokenizer, frozenset())
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
    assert isinstance(engine._target, StaticPasses) and _captured(engine)
    eager = Engine(models[0], tokenizer, frozenset(), cuda_graphs=False)
    assert [c.token_ids for c in out] == [
        c.token_ids for c in eager.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
    ]
    assert eager._target is models[0]


@torch.inference_mode()
@pytest.mark.parametrize("fuse", [False, True], ids=["model layers", "fused layers"])
def test_replayed_forward_matches_eager_logits(models, fuse):
    target = models[0]
    eager, static = target.new_cache(4, 64), target.new_cache(4, 64)
    for cache in (eager, static):
        for row, prompt in enumerate(PROMPTS[:3]):
            target(torch.tensor([prompt], device=CUDA), cache, first_row=row)
    passes = StaticPasses(target, static, 4, 5, graphs=True, fuse=fuse)
    for step in range(6):  # the first call captures, the rest replay
        tokens = torch.randint(0, 97, (3, 5), device=CUDA)
        num_new = torch.tensor([5, 2 + step % 3, 1])
        want = target(tokens, eager, num_new=num_new)
        got = passes(tokens, static, num_new=num_new)
        for b in range(3):
            k = int(num_new[b])
            torch.testing.assert_close(got.logits[b, :k], want.logits[b, :k], atol=1e-4, rtol=1e-4)
        eager.truncate(eager.lengths[:3] - 1)
        static.truncate(static.lengths[:3] - 1)
    assert all(replay.graph is not None for _, replay in passes._passes.values())
    assert set(passes.stacks.values()) == {"fused" if fuse else "eager"}


def test_speculative_sampling_distribution_with_graphs(tokenizer):
    """The end-to-end chi-square homogeneity test of tests/statistical, graphs on."""
    from statistical import test_end_to_end_distribution as e2e

    target, draft = e2e.sharp_tiny(), e2e.sharp_tiny()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * e2e.NOISE * p.std())
    target, draft = on_cuda(target), on_cuda(draft)
    case = e2e.CASES["top-k 3, 4 tokens"]
    plain_engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=e2e.MAX_BATCH,
        static_passes=True,
        cuda_graphs=True,
    )
    plain = e2e.sequences(plain_engine, case, 0)
    spec_engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=e2e.MAX_BATCH,
        drafter_factory=lambda b, n: DraftModelDrafter(
            draft, 97, 97, b, n, static_passes=True, cuda_graphs=True
        ),
        acceptor=RejectionSampler(),
        window=FixedWindow(3),
        static_passes=True,
        cuda_graphs=True,
    )
    spec = e2e.sequences(spec_engine, case, e2e.N)
    assert _captured(spec_engine) and _captured(plain_engine)
    value = e2e.homogeneity(plain, spec)
    print(f"p = {value:.3g}", f"acceptance {spec['acceptance']:.3f}")
    assert value > e2e.PASS
    assert 0.2 < spec["acceptance"] < 0.8
