"""A quantizing load streams the weights into their 4-bit layers (same values as quantizing
the loaded model) and a load that would not fit is refused before it starts."""

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.kernels.quant import Int4Linear
from specdec.kernels.quantize import quantize
from specdec.models import footprint
from specdec.models.config import ModelConfig
from specdec.models.loading import load_transformer
from specdec.models.quant_load import load_model, load_quantized

from tiny import hf_tiny, tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2-fp")
    hf_tiny("qwen2", hidden_size=128, tie_word_embeddings=True).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_streamed_load_equals_quantizing_the_loaded_model(model_dir, kind):
    """Layer for layer the same quantized tensors and the same logits as
    `quantize(load_transformer(...))`; the tied head is its own quantized copy."""
    whole = quantize(load_transformer(model_dir, "fp32"), kind)
    streamed = load_quantized(model_dir, "fp32", kind)
    want, got = whole.state_dict(), streamed.state_dict()
    assert set(want) == set(got)
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert type(streamed.lm_head) is type(whole.lm_head)
    if kind == "int4":
        assert isinstance(streamed.layers[0].mlp.gate_up_proj, Int4Linear)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        a = whole(tokens, whole.new_cache(1, 8)).logits
        b = streamed(tokens, streamed.new_cache(1, 8)).logits
    assert torch.equal(a, b)


def test_an_int4_model_holds_about_its_4bit_size(model_dir):
    """Resident bytes of an int4 model: the embedding table in its dtype plus ~4.6 bits a
    projection weight, nothing dense beside them; the estimate the guard uses agrees."""
    cfg = ModelConfig.from_dir(model_dir)
    model = load_quantized(model_dir, "fp32", "int4")
    layers, head = footprint.projection_weights(cfg)
    embed = cfg.vocab_size * cfg.hidden_size * 4
    held = footprint.resident_bytes(model)
    blocks = sum(m.stored_bytes() for m in model.modules() if isinstance(m, Int4Linear))
    # ~4.6 bits a weight (0.69 bytes at K = 128: half a super-block of scales is padding)
    assert blocks <= (layers + head) * (footprint.INT4_BYTES + 0.1)
    assert held - embed - blocks < 0.03 * held  # norms, biases: nothing dense beside
    assert held < embed + (layers + head) * 4 / 5  # the fp32 projections alone: 5x more
    assert held <= footprint.estimate_bytes(cfg, torch.float32, "int4")


def test_a_first_int4_load_is_estimated_with_the_tiles_it_builds(tmp_path, native_on):
    """A quantizing int4 load holds the native kernel's tile layout beside the 4-bit blocks
    until the store is written; the guard's estimate counts it, and leaves it out for a
    load mapped from the store (which reads one layout). Widths of whole super-blocks (256),
    as real models have: narrower ones pad their tiles."""
    if native_on.q4_tiles() is None:
        pytest.skip("no native int4 build here")
    model_dir = tmp_path / "tiny-256"
    hf_tiny("qwen2", hidden_size=256, intermediate_size=512).save_pretrained(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    model = load_quantized(model_dir, "fp32", "int4")
    tiles = sum(m.tiles.nbytes for m in model.modules() if isinstance(m, Int4Linear))
    assert tiles > 0
    building = footprint.estimate_bytes(cfg, torch.float32, "int4")
    mapped = footprint.estimate_bytes(cfg, torch.float32, "int4", stored=True)
    assert footprint.resident_bytes(model) <= building
    assert building - mapped >= 0.9 * tiles


def test_a_load_that_would_not_fit_is_refused_before_it_starts(model_dir, monkeypatch):
    """Under a simulated small limit the load is refused with what it needs and what there
    is, in one line, as a SpecdecError (the CLI and server print it; never an OOM kill);
    no weight is read (the loader is never reached)."""
    monkeypatch.setenv(footprint.LIMIT_ENV, "10K")
    import specdec.models.quant_load as quant_load

    monkeypatch.setattr(quant_load, "load_quantized", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(footprint.InsufficientMemoryError) as err:
        load_model(model_dir, "fp32", "cpu", "int4", what="the target")
    message = str(err.value)
    assert isinstance(err.value, SpecdecError) and "\n" not in message
    assert "the target (int4)" in message and "0.0 GB is available" in message
    assert "needs about" in message
    monkeypatch.setenv(footprint.LIMIT_ENV, "64G")
    monkeypatch.setattr(footprint, "available_bytes", lambda: 64 * 10**9)
    monkeypatch.undo()
    assert isinstance(load_model(model_dir, "fp32", "cpu", "int4"), torch.nn.Module)


def test_the_cli_refuses_with_the_guards_message(model_dir, monkeypatch, capsys):
    from specdec.cli import main

    monkeypatch.setenv(footprint.LIMIT_ENV, "10K")
    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--quant", "int4", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not enough memory to load the target (int4)" in err
    assert "Traceback" not in err


def test_memory_limit_parsing():
    assert footprint.parse_bytes("2.5G") == 2_500_000_000
    assert footprint.parse_bytes("800m") == 800_000_000
    assert footprint.parse_bytes("1024") == 1024
    with pytest.raises(footprint.InsufficientMemoryError, match="expected bytes"):
        footprint.parse_bytes("lots")


def test_the_server_refuses_to_start_with_the_same_message(model_dir, monkeypatch, capsys):
    from specdec.cli import main

    monkeypatch.setenv(footprint.LIMIT_ENV, "10K")
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("the server started"))
    argv = ["serve", "--model", str(model_dir), "--dtype", "fp32", "--quant", "int4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not enough memory to load the target (int4)" in err and "Traceback" not in err


def test_generate_json_and_doctor_report_resident_memory(model_dir, capsys):
    """`generate --json` gives each model's resident MB and the peak RSS; the doctor's
    per-model estimate puts an int4 model well under its bf16 form."""
    import json

    from specdec.cli import main
    from specdec.doctor import resident_gb

    argv = ["generate", "--model", str(model_dir), "--dtype", "fp32", "--quant", "int4"]
    assert main([*argv, "--max-tokens", "2", "--json", "hi"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    memory = row["memory"]
    assert 0 < memory["target_mb"] < memory["peak_rss_mb"]
    cfg = ModelConfig.from_dir(model_dir)
    assert set(resident_gb(cfg)) == {"int4", "bf16"}  # GB: 0.0 for a tiny model
    int4 = footprint.resident_estimate(cfg, torch.bfloat16, "int4")
    assert 0 < int4 < footprint.resident_estimate(cfg, torch.bfloat16, "none") / 2
