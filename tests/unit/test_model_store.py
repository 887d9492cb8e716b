"""An int4 model is stored once and mapped at later loads: the same tensors and logits as
building it, its weights backed by the file, and a corrupt or stale store rebuilt, never used."""

import os

import pytest
import torch

from specdec.kernels.gguf_q4 import QuantReport
from specdec.kernels.quant import Int4Linear
from specdec.models import quant_load, store
from specdec.models.config import ModelConfig
from specdec.models.store import ModelStore

from tiny import hf_tiny


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "tiny-qwen2" / "fp32"
    hf_tiny("qwen2", hidden_size=128, tie_word_embeddings=True).save_pretrained(path)
    return path


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_MODEL_STORE", "1")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "int4"


def _logits(model):
    with torch.inference_mode():
        return model(torch.tensor([[1, 2, 3, 4, 5]]), model.new_cache(1, 8)).logits


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(".safetensors")}


def test_a_stored_model_equals_the_built_one_and_maps_its_file(model_dir, root, monkeypatch):
    built = quant_load.load_quantized(model_dir, "fp32", "int4")
    built.quant_report = QuantReport(exact=["a"], requantized=["b"])
    monkeypatch.setattr(quant_load, "load_quantized", lambda *a, **k: built)
    first = quant_load.load_stored(model_dir, "fp32")
    (file,) = root.glob("*.safetensors")
    monkeypatch.setattr(quant_load, "load_quantized", lambda *a, **k: pytest.fail("rebuilt"))
    second = quant_load.load_stored(model_dir, "fp32")
    for model in (first, second):
        want, got = built.state_dict(), model.state_dict()
        assert set(want) == set(got)
        assert all(torch.equal(want[name], got[name]) for name in want)
        assert isinstance(model.layers[0].mlp.gate_up_proj, Int4Linear)
        assert model.quant_report == built.quant_report
        assert torch.equal(_logits(model), _logits(built))
    if os.path.exists("/proc/self/maps"):  # the weights are the file's pages, not a copy
        assert str(file) in _mapped_files()


def test_a_corrupt_store_is_rebuilt_with_a_warning(model_dir, root, caplog):
    quant_load.load_stored(model_dir, "fp32")
    (file,) = root.glob("*.safetensors")
    written = file.stat().st_mtime_ns
    data = bytearray(file.read_bytes())
    data[-100] ^= 0x40  # one flipped bit in a weight: a model that would run, wrongly
    file.write_bytes(bytes(data))
    os.utime(file, ns=(written, written + 1))  # a write moves the clock (coarse ones too)
    cfg = ModelConfig.from_dir(model_dir)
    assert ModelStore(file).load(cfg, torch.float32) is None
    assert "corrupt" in caplog.text and not file.exists()
    rebuilt = quant_load.load_stored(model_dir, "fp32")
    assert file.exists() and torch.equal(
        _logits(rebuilt), _logits(quant_load.load_quantized(model_dir, "fp32", "int4"))
    )
    file.write_bytes(file.read_bytes()[:1000])  # truncated
    assert ModelStore(file).load(cfg, torch.float32) is None
    assert "bytes where" in caplog.text


def test_a_changed_source_gets_a_new_store_and_the_stale_one_goes(model_dir, root):
    quant_load.load_stored(model_dir, "fp32")
    (old,) = root.glob("*.safetensors")
    weights = model_dir / "model.safetensors"
    os.utime(weights, ns=(0, weights.stat().st_mtime_ns + 10**9))  # a new checkpoint
    quant_load.load_stored(model_dir, "fp32")
    (new,) = root.glob("*.safetensors")
    assert new != old and not old.with_suffix(".json").exists()
    other = ModelStore.for_sources(model_dir, "bf16", "int4", None, root)
    assert other.file != new  # each dtype its own


def test_the_store_can_be_turned_off(model_dir, root, monkeypatch):
    monkeypatch.setenv("SPECDEC_MODEL_STORE", "0")
    assert not store.enabled()
    model = quant_load.load_model(model_dir, "fp32", "cpu", "int4")
    assert isinstance(model.layers[0].mlp.down_proj, Int4Linear)
    assert not root.exists()


def test_an_unchanged_store_is_trusted_and_a_touched_one_read_again(model_dir, root, monkeypatch):
    """A store whose inode, size and modification time are those last checked is mapped
    without reading it again; any change sends it through the checksums."""
    quant_load.load_stored(model_dir, "fp32")
    (file,) = root.glob("*.safetensors")
    cfg = ModelConfig.from_dir(model_dir)
    reads = []
    real = store._checksums
    monkeypatch.setattr(store, "_checksums", lambda *a: reads.append(1) or real(*a))
    assert ModelStore(file).load(cfg, torch.float32) is not None and not reads
    os.utime(file, ns=(0, file.stat().st_mtime_ns + 1))
    assert ModelStore(file).load(cfg, torch.float32) is not None and len(reads) == 1
    assert ModelStore(file).load(cfg, torch.float32) is not None and len(reads) == 1


@pytest.fixture
def built_native(native_on):
    """The native kernels, built (or found) where the rest of the suite builds them, before
    `root` moves $SPECDEC_HOME (a build there would take minutes)."""
    for accessor in (native_on.q4_gemv, native_on.q4_tiles, native_on.decode_stack):
        accessor()
    return native_on


def test_tiles_are_stored_and_mapped_not_laid_out_again(built_native, model_dir, root, monkeypatch):
    """The tile layout is written with the blocks, and a later load maps it: laying out the
    1.5B's tiles took ~6 s of every load. The mapped tiles are the ones the build makes."""
    native_on = built_native
    if native_on.q4_tiles() is None:
        pytest.skip("no native int4 build here")
    first = quant_load.load_stored(model_dir, "fp32")
    layer = first.layers[0].mlp.gate_up_proj
    assert layer.tiles.numel() > 0
    want = native_on.q4_tiles()(*layer.q4.tensors())
    monkeypatch.setattr(native_on, "q4_tiles", lambda: lambda *a: pytest.fail("laid out again"))
    second = quant_load.load_stored(model_dir, "fp32")
    tiled = [m for m in second.modules() if isinstance(m, Int4Linear) and m.tiles.numel()]
    assert tiled and torch.equal(second.layers[0].mlp.gate_up_proj.tiles, want)
    assert torch.equal(_logits(first), _logits(second))
