import pytest
import torch

from specdec.errors import InvalidParameterError
from specdec.models.quant import Int4Linear, quantize_int4

from tiny import hf_tiny, native_from_hf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_linear_is_close_and_exact_on_a_4bit_grid(dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=True).to(dtype)
    x = torch.randn(2, 3, 64, dtype=dtype)  # 6 rows: the int4 kernel's regime
    ref = linear(x).float()
    rel = (Int4Linear(linear)(x).float() - ref).norm() / ref.norm()
    assert rel < 0.15
    # Weights already on a 16-level grid per group of 32 (as in Q4 GGUF files) survive.
    with torch.no_grad():
        levels = torch.randint(0, 16, linear.weight.shape)
        levels[:, ::32], levels[:, 1::32] = 0, 15  # every group spans the full 16 levels
        grid = levels.float() * 0.01 - 0.08
        linear.weight.copy_(grid.to(dtype))
    exact = (Int4Linear(linear)(x).float() - linear(x).float()).abs().max()
    assert exact < (1e-4 if dtype == torch.float32 else 0.05)


def test_many_rows_take_the_dense_weights():
    """A prefill's many rows go through the original weights (the int4 kernel is slow
    there); a decode step's few rows through the int4 kernel."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    q = Int4Linear(linear)
    many = torch.randn(4, 5, 64, dtype=torch.bfloat16)
    few = many[:1, :3]
    assert torch.equal(q(many), linear(many))
    assert not torch.equal(q(few), linear(few))


def test_quantize_int4_model_skips_unsupported_shapes():
    model = quantize_int4(native_from_hf(hf_tiny("llama")))
    assert isinstance(model.layers[0].mlp.gate_up_proj, Int4Linear)
    assert not isinstance(model.lm_head, Int4Linear)  # vocab 97 is not a multiple of 16
    cache = model.new_cache(1, 16)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]), cache).logits).all()


def test_int4_refuses_non_cpu_models():
    model = native_from_hf(hf_tiny("llama")).to("meta")
    with pytest.raises(InvalidParameterError, match="CPU only"):
        quantize_int4(model)
