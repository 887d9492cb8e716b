"""The engine on a CUDA device: what CPU-only CI cannot check (skipped there).

The same contracts as the CPU tiers, with every model, cache, sampler generator and
drafter on the GPU: fp32 greedy speculative decoding emits plain greedy decoding's tokens
with each drafter (draft model, n-gram, speculator heads as a chain and as a tree, the
adaptive window), and speculative sampling emits plain sampling's sequence distribution
(the chi-square test of tests/statistical, whose power against biased acceptors is shown
there). TF32 is switched off: it rounds fp32 matmul inputs to a 10-bit mantissa, which is
a different model, not the one the equality is about.

Run on a GPU machine: `pytest tests/gpu`.
"""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor, RejectionSampler
from specdec.drafters import DraftModelDrafter, EagleDrafter, NgramDrafter, SpeculatorDrafter
from specdec.engine import Engine
from specdec.heads import SpeculatorConfig
from specdec.heads.eagle import build_eagle
from specdec.heads.mlp import MLPSpeculator
from specdec.models.config import ModelConfig
from specdec.models.loading import build_transformer
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
N = 25


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
    return on_cuda(hf_tiny("qwen2")), on_cuda(hf_tiny("qwen2", seed=1, num_hidden_layers=1))


@pytest.fixture(scope="module")
def references(models, tokenizer):
    params = SamplingParams(temperature=0, max_tokens=N)
    plain = Engine(models[0], tokenizer, frozenset())
    return [c.token_ids for c in plain.generate(PROMPTS, params)]


def test_cuda_logits_match_cpu():
    hf = hf_tiny("llama")
    cpu, gpu = native_from_hf(hf), on_cuda(hf)
    tokens = torch.tensor([PROMPTS[1]])
    with torch.inference_mode():
        expected = cpu(tokens, cpu.new_cache(1, 32)).logits
        got = gpu(tokens.to(CUDA), gpu.new_cache(1, 32)).logits
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


def _random_heads(target, seed: int = 0) -> MLPSpeculator:
    torch.manual_seed(seed)
    cfg = SpeculatorConfig(3, 64, 64, 97, 97)
    return MLPSpeculator(cfg).to(CUDA).eval()


def _random_eagle(target, seed: int = 0):
    """An untrained eagle head on the GPU: its drafts are mostly rejected, which exercises
    the drafter's cache rollback on every step."""
    torch.manual_seed(seed)
    return build_eagle(target, intermediate_size=64, n_predict=4).to(CUDA).eval()


DRAFTERS = {
    "draft model k=1": (lambda m: lambda b, n: DraftModelDrafter(m[1], 97, 97, b, n), 1),
    "draft model k=6": (lambda m: lambda b, n: DraftModelDrafter(m[1], 97, 97, b, n), 6),
    "self draft k=4": (lambda m: lambda b, n: DraftModelDrafter(m[0], 97, 97, b, n), 4),
    "n-gram k=3": (lambda m: lambda b, n: NgramDrafter(), 3),
    "draft model auto": (lambda m: lambda b, n: DraftModelDrafter(m[1], 97, 97, b, n), "auto"),
    "heads chain": (lambda m: lambda b, n: SpeculatorDrafter(_random_heads(m[0]), b, CUDA), 3),
    "eagle k=3": (lambda m: lambda b, n: EagleDrafter(_random_eagle(m[0]), b, n), 3),
}


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionSampler()])
@pytest.mark.parametrize("max_batch", [8, 2])  # 2: rows finish, move and are re-admitted
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_speculative_equals_plain(models, tokenizer, references, name, max_batch, acceptor):
    make, k = DRAFTERS[name]
    window = AdaptiveWindow(k_max=6) if k == "auto" else FixedWindow(k)
    engine = Engine(
        models[0],
        tokenizer,
        frozenset(),
        max_batch=max_batch,
        drafter_factory=make(models),
        acceptor=acceptor,
        window=window,
    )
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [c.token_ids for c in out] == references
    if name.startswith("self draft"):
        assert all(c.stats.acceptance_rate == 1.0 for c in out)


def test_greedy_candidate_tree_equals_plain(models, tokenizer, references):
    heads = _random_heads(models[0], seed=3)
    engine = Engine(
        models[0],
        tokenizer,
        frozenset(),
        max_batch=4,
        drafter_factory=lambda b, n: SpeculatorDrafter(heads, b, CUDA, tree=(2, 2, 2)),
        window=FixedWindow(3),
        max_tree_nodes=2 + 4 + 8,
    )
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N))
    assert [c.token_ids for c in out] == references


def test_bf16_speculative_runs_and_self_draft_accepts(tokenizer):
    """bf16 on the GPU (the serving dtype): a self-drafting engine accepts every token
    and emits what plain bf16 decoding does."""
    target = on_cuda(hf_tiny("llama"), torch.bfloat16)
    params = SamplingParams(temperature=0, max_tokens=N)
    plain = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(PROMPTS, params)]
    engine = Engine(
        target,
        tokenizer,
        frozenset(),
        drafter_factory=lambda b, n: DraftModelDrafter(target, 97, 97, b, n),
        window=FixedWindow(4),
    )
    out = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in out] == plain
    assert all(c.stats.acceptance_rate == 1.0 for c in out)


def test_speculative_sampling_distribution_on_cuda(tokenizer):
    """The end-to-end chi-square homogeneity test of tests/statistical, on the GPU."""
    from statistical import test_end_to_end_distribution as e2e

    target, draft = e2e.sharp_tiny(), e2e.sharp_tiny()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * e2e.NOISE * p.std())
    target, draft = on_cuda(target), on_cuda(draft)
    case = e2e.CASES["top-k 3, 4 tokens"]
    plain = e2e.sequences(Engine(target, tokenizer, frozenset(), max_batch=e2e.MAX_BATCH), case, 0)
    spec_engine = e2e.spec_engine(target, draft, tokenizer, RejectionSampler())
    spec = e2e.sequences(spec_engine, case, e2e.N)
    value = e2e.homogeneity(plain, spec)
    print(f"p = {value:.3g}", f"acceptance {spec['acceptance']:.3f}")
    assert value > e2e.PASS
    assert 0.2 < spec["acceptance"] < 0.8
