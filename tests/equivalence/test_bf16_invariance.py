"""bf16 greedy output is exact through the engine: speculative decoding emits plain
decoding's tokens, and a request batched beside others (joining mid-flight, prefilled in
chunks beside them) its alone-output, on a bf16 target of the 0.5B's layer widths through
the batch-invariant kernels (`kernels.invariance`). With the tuned kernels of before
(`SPECDEC_BF16_INVARIANT=0`) these outputs differ (checked in the last test)."""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import DraftModelDrafter, NgramDrafter
from specdec.engine import Engine
from specdec.kernels import kernel_plans
from specdec.kernels.linear import Linear
from specdec.kernels.quantize import quantize
from specdec.params import SamplingParams
from specdec.window import AdaptiveWindow, FixedWindow

from tiny import hf_tiny, native_from_hf, staggered

WIDE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    num_hidden_layers=2,
)
PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33], [7, 7, 8, 7, 7, 8, 7]]
PROMPTS += [list(range(2, 40)), [9, 19, 29, 39, 49]]
TOKENS = 24


pytestmark = pytest.mark.usefixtures("invariant_native_kernels")


def bf16(seed, **shape):
    """A bf16 model as a CPU load makes it, on the plans predicted for this CPU."""
    model = quantize(native_from_hf(hf_tiny("qwen2", seed=seed, **shape), torch.bfloat16), "none")
    for module in model.modules():
        if isinstance(module, Linear):
            module.use(kernel_plans.predicted_plan(module))
    if model.decode_stack is not None:
        plan = kernel_plans.predicted_stack("bf16")
        model.decode_stack.measured = {int(b): way == "stack" for b, way in plan.items()}
    return model


def _engines(target, draft, tokenizer, max_batch, prefill_chunk=None):
    def model_drafter(rows, length):
        return DraftModelDrafter(draft, 97, 97, rows, length)

    for name, factory, window in [
        ("draft k=4", model_drafter, FixedWindow(4)),
        ("draft k=9", model_drafter, FixedWindow(9)),
        ("draft auto", model_drafter, AdaptiveWindow(k_max=6)),
        ("ngram k=5", lambda rows, length: NgramDrafter(), FixedWindow(5)),
    ]:
        yield (
            name,
            Engine(
                target,
                tokenizer,
                frozenset(),
                max_batch=max_batch,
                drafter_factory=factory,
                acceptor=GreedyAcceptor(),
                window=window,
                max_len=96,
                prefill_chunk=prefill_chunk,
            ),
        )


def _outputs(tokenizer):
    """{way: token ids per prompt}: plain alone (the reference), plain and speculative
    batched (all at once, and joining one a step with prefills in passes of 16)."""
    target, draft = bf16(0, **WIDE), bf16(1, hidden_size=128, intermediate_size=256)
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    alone = Engine(target, tokenizer, frozenset(), max_batch=1)
    out = {"alone": [alone.generate([p], params)[0].token_ids for p in PROMPTS]}
    batched = Engine(target, tokenizer, frozenset(), max_batch=8)
    out["plain batched"] = [c.token_ids for c in batched.generate(PROMPTS, params)]
    for name, engine in _engines(target, draft, tokenizer, max_batch=1):
        out[f"{name} alone"] = [engine.generate([p], params)[0].token_ids for p in PROMPTS]
    for name, engine in _engines(target, draft, tokenizer, max_batch=8, prefill_chunk=16):
        seqs = staggered(engine, PROMPTS, [params] * len(PROMPTS))
        out[f"{name} staggered"] = [s.output_ids for s in seqs]
    return out


def test_bf16_greedy_speculation_and_batching_give_each_request_its_alone_output(tokenizer):
    out = _outputs(tokenizer)
    for way, tokens in out.items():
        assert tokens == out["alone"], way


def test_the_tuned_kernels_of_before_are_not_invariant(tokenizer, monkeypatch):
    """The negative control: the same runs through the tuned mix of kernels differ from
    the alone-output somewhere (so the test above can fail)."""
    monkeypatch.setenv("SPECDEC_BF16_INVARIANT", "0")
    out = _outputs(tokenizer)
    assert any(tokens != out["alone"] for tokens in out.values())
