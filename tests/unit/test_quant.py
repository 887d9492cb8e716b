import pytest
import torch

from specdec.errors import InvalidParameterError
from specdec.models.quant import Int4Linear, Int8Linear, quantize, quantize_int4

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


@pytest.mark.parametrize("cls", [Int4Linear, Int8Linear])
def test_untuned_rows_split_between_packed_kernel_and_dequantized_weights(cls):
    """Untuned, a prefill's many rows go through the dense kernel on the *dequantized*
    weights (the packed kernel is slow there) and a decode step's few rows through the
    packed kernel: both compute the same quantized model, so a quantized target's prefill
    and its decode steps agree (up to rounding), as the lossless acceptors need."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    q = cls(linear)
    assert not torch.equal(q.weight, linear.weight)  # the weights that run are quantized
    many = torch.randn(4, 5, 64, dtype=torch.bfloat16)
    assert torch.equal(q(many), torch.nn.functional.linear(many, q.weight, q.bias))
    few = many[:1, :3]
    ref = torch.nn.functional.linear(few.float(), q.weight.float(), q.bias.float())
    torch.testing.assert_close(q(few).float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_is_close_and_exact_on_an_8bit_grid(dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=False).to(dtype)
    x = torch.randn(3, 64, dtype=dtype)
    ref = linear(x).float()
    assert ((Int8Linear(linear)(x).float() - ref).norm() / ref.norm()) < 0.02
    with torch.no_grad():  # weights already k * s with |k| <= 127 and a row max of 127 s
        levels = torch.randint(-127, 128, linear.weight.shape).float()
        levels[:, 0] = 127
        linear.weight.copy_((levels * 2**-10).to(dtype))
    assert torch.equal(Int8Linear(linear).weight, linear.weight)


@pytest.mark.parametrize("kind,cls", [("int4", Int4Linear), ("int8", Int8Linear)])
def test_quantize_a_target_keeps_it_decoding(kind, cls):
    model = quantize(native_from_hf(hf_tiny("qwen2")), kind)
    assert isinstance(model.layers[0].self_attn.qkv_proj, cls)
    cache = model.new_cache(1, 16)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]), cache).logits).all()
    assert quantize(model, "none") is model
    with pytest.raises(InvalidParameterError, match="int4, int8"):
        quantize(model, "int3")


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
