"""`gguf_convert` writes what transformers' own GGUF loading and saving write, file for file
and tensor for tensor, and refuses a file that lacks a weight by naming it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tiny_gguf import write_tiny_gguf

from specdec import gguf_convert
from specdec.errors import ModelIntegrityError
from specdec.gguf_file import GGUFFile
from specdec.models.loading import torch_dtype

FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def _transformers_conversion(path, out, dtype):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.save_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch_dtype(dtype)
    )
    model.hf_quantizer = None  # as hub did: the weights are plain tensors by now
    del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)


@pytest.mark.parametrize(
    "arch, dtype, quantized, biases",
    [
        ("llama", "fp32", False, False),  # q and k rows reordered back from llama.cpp's rope
        ("llama", "bf16", True, False),
        ("qwen2", "bf16", True, True),
    ],
)
def test_conversion_equals_transformers_file_for_file(tmp_path, arch, dtype, quantized, biases):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, arch, layers=2, quantized=quantized, biases=biases)
    _transformers_conversion(path, tmp_path / "theirs", dtype)
    gguf_convert.convert(path, tmp_path / "ours", dtype)

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    for name in FILES:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    expected, got = load_file(theirs / "model.safetensors"), load_file(ours / "model.safetensors")
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_a_file_missing_a_weight_is_refused_with_its_name(tmp_path):
    import gguf

    full = tmp_path / "full.gguf"
    write_tiny_gguf(full)
    source = GGUFFile(full)
    writer = gguf.GGUFWriter(str(tmp_path / "cut.gguf"), "llama")
    for key, value in source.metadata.items():
        if key.startswith("llama."):
            writer.add_uint32(key, value) if isinstance(value, int) else writer.add_float32(
                key, value
            )
    writer.add_token_list([f"t{i}" for i in range(8)])
    for name in source.tensors:
        if name != "blk.0.ffn_down.weight":
            writer.add_tensor(name, source.dequantized(name).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelIntegrityError, match="model.layers.0.mlp.down_proj.weight"):
        gguf_convert.convert(tmp_path / "cut.gguf", tmp_path / "out", "fp32")
