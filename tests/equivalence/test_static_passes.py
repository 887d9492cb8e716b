"""The fixed-shape, bucketed passes (`static_passes=True`, run eagerly on the CPU) emit
exactly what the eager engine does, fp32 greedy, step for step: plain decoding, a draft
model (its steps static too), n-gram, speculator heads as a chain and as a tree, and rows
joining and leaving mid-run (every batch size picks its bucket; padding rows are free cache
rows). The same runs with CUDA graphs are tests/gpu/test_cuda_graphs.py."""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter, NgramDrafter, SpeculatorDrafter
from specdec.engine import Engine
from specdec.graphs.static_pass import StaticPasses
from specdec.heads import SpeculatorConfig
from specdec.heads.mlp import MLPSpeculator
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7], [9]]
LENGTHS = [20, 5, 13, 9, 16]


@pytest.fixture(scope="module")
def models():
    target = native_from_hf(hf_tiny("qwen2"))
    draft = native_from_hf(hf_tiny("qwen2", seed=1, num_hidden_layers=1))
    torch.manual_seed(0)
    heads = MLPSpeculator(SpeculatorConfig(3, 64, 64, 97, 97)).eval()
    return target, draft, heads


def _drafters(models, static: bool):
    """name -> (drafter factory, window, max_tree_nodes)."""
    target, draft, heads = models

    def model_drafter(model):
        return lambda b, n: DraftModelDrafter(model, 97, 97, b, n, static_passes=static)

    def heads_drafter(tree):
        return lambda b, n: SpeculatorDrafter(heads, b, tree=tree, static_passes=static)

    return {
        "plain": (None, FixedWindow(0), 0),
        "draft k=3": (model_drafter(draft), FixedWindow(3), 0),
        "self draft k=4": (model_drafter(target), FixedWindow(4), 0),
        "draft auto": (model_drafter(draft), AdaptiveWindow(k_max=5), 0),
        "n-gram k=4": (lambda b, n: NgramDrafter(), FixedWindow(4), 0),
        "heads chain": (heads_drafter(None), FixedWindow(3), 0),
        "heads tree": (heads_drafter((2, 2, 2)), FixedWindow(3), 2 + 4 + 8),
    }


def _engine(models, tokenizer, name, static, max_batch, acceptor):
    factory, window, nodes = _drafters(models, static)[name]
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
        static_passes=static,
    )


NAMES = list(_drafters((None, None, None), False))


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()], ids=["greedy", "rs"])
@pytest.mark.parametrize("max_batch", [3, 8])  # 3: rows join and leave through buckets 1, 2, 3
@pytest.mark.parametrize("name", NAMES)
def test_static_passes_equal_eager_step_for_step(models, tokenizer, name, max_batch, acceptor):
    params = [SamplingParams(temperature=0, max_tokens=n) for n in LENGTHS]
    runs = {}
    for static in (False, True):
        engine = _engine(models, tokenizer, name, static, max_batch, acceptor)
        seqs = staggered(engine, PROMPTS, params)
        # `auto` picks k from wall-clock costs: only its tokens are deterministic
        runs[static] = [(s.output_ids, None if "auto" in name else s.trace) for s in seqs]
        assert isinstance(engine._target, StaticPasses) == static
        drafter = engine._drafter
        if isinstance(drafter, DraftModelDrafter):
            _ = drafter.cache  # builds the cache and its forward where auto never drafted
            assert isinstance(drafter._forward, StaticPasses) == static
        if isinstance(drafter, SpeculatorDrafter):
            assert (drafter._static is not None) == static
    assert runs[True] == runs[False]


def test_all_at_once_with_sampling_seeds_equal_eager(models, tokenizer):
    """Sampling rows too: with the same seeds, the static path draws the same tokens
    (fp32: its probabilities are the eager ones to rounding)."""
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=n) for i, n in enumerate(LENGTHS)]
    outs = []
    for static in (False, True):
        engine = _engine(models, tokenizer, "draft k=3", static, 8, RejectionSampler())
        outs.append([c.token_ids for c in engine.generate(PROMPTS, params)])
    assert outs[0] == outs[1]


def test_default_cpu_engine_is_eager(models, tokenizer):
    """On the CPU nothing changes unless asked: the target's pass is the model itself."""
    engine = Engine(models[0], tokenizer, frozenset(), cuda_graphs=True)
    engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3))
    assert engine._target is models[0]
    assert (engine.static_passes, engine.cuda_graphs) == (False, False)


@pytest.mark.parametrize("max_batch", [3, 8])
def test_scripted_tree_accepts_whole_paths_through_static_passes(models, tokenizer, max_batch):
    """Trees whose right path is never the best-scoring one (test_speculator_tree's
    scripted heads), through the static tree pass and the static heads: the exact output
    and the exact pass count, so accepted paths are compacted in the static cache too."""
    import math

    from equivalence.test_speculator_tree import HEADS, TREE, N, ScriptedTreeSpeculator
    from equivalence.test_speculator_tree import PROMPTS as TREE_PROMPTS

    target = models[0]
    params = SamplingParams(temperature=0, max_tokens=N)
    plain = Engine(target, tokenizer, frozenset())
    refs = [c.token_ids for c in plain.generate(TREE_PROMPTS, params)]
    spec = ScriptedTreeSpeculator(target, TREE_PROMPTS, refs, lambda i: True)
    spec.strict = False  # padding rows of a bucket hold stale states
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=lambda b, n: SpeculatorDrafter(
            spec, b, tree=TREE, n_candidates=12, static_passes=True
        ),
        window=FixedWindow(5),
        max_tree_nodes=12 * HEADS,
        static_passes=True,
    )
    out = engine.generate(TREE_PROMPTS, params)
    assert [c.token_ids for c in out] == refs
    assert [c.stats.steps for c in out] == [math.ceil((N - 1) / (HEADS + 1))] * len(refs)
