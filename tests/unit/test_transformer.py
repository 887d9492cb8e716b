"""The native transformer against transformers' own implementation, and its KV cache."""

import pytest
import torch

from specdec.models.config import ModelConfig

from tiny import hf_tiny, native_from_hf


def _logits(model, tokens, max_len=64):
    cache = model.new_cache(tokens.shape[0], max_len)
    return model(tokens, cache).logits


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("llama", {}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": 8}),
        ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}}),
        (
            "llama",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
        ),
    ],
)
def test_logits_match_transformers(kind, overrides):
    hf = hf_tiny(kind, **overrides)
    native = native_from_hf(hf)
    tokens = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
    assert (expected - _logits(native, tokens)).abs().max() < 1e-4


def test_incremental_decode_matches_full_forward(hf_and_native):
    _, native = hf_and_native
    tokens = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    full = _logits(native, tokens)
    cache = native.new_cache(1, 64)
    native(tokens[:, :5], cache)
    steps = [native(tokens[:, i : i + 1], cache).logits for i in range(5, 12)]
    assert (torch.cat(steps, dim=1) - full[:, 5:]).abs().max() < 1e-4
    assert int(cache.lengths[0]) == 12


def test_truncate_then_rewrite_equals_fresh_run(hf_and_native):
    _, native = hf_and_native
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 97, (2, 7), generator=gen)
    wrong, right = (
        torch.randint(0, 97, (2, 5), generator=gen),
        torch.randint(0, 97, (2, 5), generator=gen),
    )
    cache = native.new_cache(2, 64)
    native(prefix, cache)
    native(wrong, cache)  # a rejected draft
    cache.truncate(torch.tensor([7, 9]))  # row 1 kept two of the "wrong" tokens
    out0 = native(right, cache).logits
    fresh = _logits(native, torch.cat([prefix, right], 1))[:, 7:]
    fresh1 = _logits(native, torch.cat([prefix[1:], wrong[1:, :2], right[1:]], 1))[:, 9:]
    assert (out0[0] - fresh[0]).abs().max() < 1e-4
    assert (out0[1] - fresh1[0]).abs().max() < 1e-4


def test_ragged_batch_equals_each_row_alone(hf_and_native):
    _, native = hf_and_native
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 97, (n,), generator=gen) for n in (3, 9, 6)]
    cache = native.new_cache(3, 64)
    padded = torch.zeros(3, 9, dtype=torch.long)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    lengths = torch.tensor([3, 9, 6])
    batch = native(padded, cache, num_new=lengths).logits
    # then one ragged multi-token step on top of the different lengths
    step = torch.randint(0, 97, (3, 4), generator=gen)
    batch_step = native(step, cache, num_new=torch.tensor([4, 2, 3])).logits
    for i, p in enumerate(prompts):
        alone = _logits(native, p[None])
        assert (batch[i, : len(p)] - alone[0]).abs().max() < 1e-4
        n = [4, 2, 3][i]
        alone_step = _logits(native, torch.cat([p, step[i, :n]])[None])[0, len(p) :]
        assert (batch_step[i, :n] - alone_step).abs().max() < 1e-4
    assert cache.lengths[:3].tolist() == [7, 11, 9]


def test_logits_at_selects_positions(hf_and_native):
    _, native = hf_and_native
    tokens = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(5))
    full = _logits(native, tokens)
    cache = native.new_cache(2, 64)
    out = native(tokens, cache, logits_at=torch.tensor([[5], [2]]))
    assert out.logits.shape == (2, 1, 97) and out.hidden.shape == (2, 6, 64)
    assert torch.allclose(out.logits[0, 0], full[0, 5], atol=1e-5)
    assert torch.allclose(out.logits[1, 0], full[1, 2], atol=1e-5)


def test_move_row_keeps_the_sequence(hf_and_native):
    _, native = hf_and_native
    tokens = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(6))
    cache = native.new_cache(2, 64)
    native(tokens, cache)
    cache.move_row(1, 0)
    nxt = torch.tensor([[7]])
    moved = native(nxt, cache).logits
    fresh = _logits(native, torch.cat([tokens[1:], nxt], 1))[:, -1:]
    assert (moved - fresh).abs().max() < 1e-4


def test_bf16_runs_close_to_fp32():
    hf = hf_tiny("qwen2")
    tokens = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(7))
    fp32 = _logits(native_from_hf(hf), tokens)
    bf16 = _logits(native_from_hf(hf, torch.bfloat16), tokens)
    assert bf16.dtype == torch.float32
    assert (fp32 - bf16).abs().max() < 0.1


def test_config_refuses_unsupported_architecture():
    from specdec.errors import UnsupportedModelError

    cfg = hf_tiny("llama").config.to_dict()
    cfg["architectures"] = ["GemmaForCausalLM"]
    with pytest.raises(UnsupportedModelError, match="GemmaForCausalLM.*not supported"):
        ModelConfig.from_hf_dict(cfg)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(UnsupportedModelError, match="'yarn' is not supported"):
        ModelConfig.from_hf_dict(cfg)


def test_context_overflow_is_refused_before_writing(hf_and_native):
    from specdec.errors import ContextLengthError

    _, native = hf_and_native
    cache = native.new_cache(1, 8)
    with pytest.raises(ContextLengthError, match="needs 9 positions.*holds 8"):
        native(torch.zeros(1, 9, dtype=torch.long), cache)
    assert int(cache.lengths[0]) == 0
