"""A llama / qwen2 / mistral GGUF file as a transformers model directory, in seconds.

Writes what `AutoModelForCausalLM.from_pretrained(gguf_file=...).save_pretrained()` writes
(config, generation config, tokenizer, safetensors; tests/unit/test_gguf_convert.py compares
the two file by file), from one fast read of the file (`gguf_file.GGUFFile`): transformers
reads it three times through `gguf.GGUFReader`, ~18 s each for a Qwen2 vocabulary, and a
fresh `make demo` spent ~4 of its 13 minutes there (2-vCPU Zen 3). The values come from
`GGUFFile.dequantized` in fp32 (bitwise what transformers' loader gives: the test above),
cast to the dtype last.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.console import status
from specdec.errors import ModelIntegrityError
from specdec.gguf_file import GGUFFile
from specdec.models.loading import torch_dtype


def config_dict(gguf: GGUFFile) -> dict:
    """The transformers config keys the file's metadata gives, renamed by transformers' own
    table (as its GGUF loader does), a mistral told from a llama by its name."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    architecture = gguf.architecture
    name = gguf.metadata.get("general.name", "")
    model_type = (
        "mistral" if architecture == "llama" and "mistral" in name.lower() else architecture
    )
    config = {"tie_word_embeddings": "output.weight" not in gguf.tensors}
    for key, value in gguf.metadata.items():
        prefix, _, rest = key.replace(architecture, model_type, 1).partition(".")
        renamed = renames.get(prefix, {}).get(rest)
        if renamed not in (None, -1):
            config[renamed] = (
                value.replace(architecture, model_type) if isinstance(value, str) else value
            )
    config.setdefault("vocab_size", gguf.metadata.get("tokenizer.ggml.tokens"))
    return config


# GGUF tensor names (llama.cpp's) -> transformers' parameter names, for llama, qwen2 and
# mistral alike: the model's own, then a layer's (`blk.N.<part>` -> `model.layers.N.<part>`).
# Other tensors a file may carry (llama 3's rope frequencies) are left out: the model
# computes its own.
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MODEL_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def weight_name(gguf_name: str) -> str | None:
    """The transformers name of a GGUF tensor, or None for one the model does not take."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    block, _, rest = gguf_name.partition(".")
    layer, _, part = rest.partition(".")
    if block == "blk" and layer.isdigit() and part in LAYER_NAMES:
        return f"model.layers.{layer}.{LAYER_NAMES[part]}"
    return None


def _reverse_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a llama q or k projection's rows for its rope."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def convert(gguf_path: Path, out: Path, dtype: str) -> None:
    """Write the model directory of `gguf_path` into `out` (an empty or new directory)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, GenerationConfig

    gguf = GGUFFile(gguf_path)
    config = AutoConfig.for_model(**config_dict(gguf))
    _check_complete(gguf_path, {weight_name(name) for name in gguf.tensors}, config)
    out.mkdir(parents=True, exist_ok=True)
    status(f"converting {gguf_path.name} ({gguf.architecture}) to {dtype}: tokenizer")
    try:
        _save_tokenizer(gguf_path, config.model_type, out)
    except (ValueError, KeyError) as error:
        raise ModelIntegrityError(
            f"{gguf_path.name}: no tokenizer in its metadata ({error})"
        ) from error

    status(f"converting {gguf_path.name}: dequantizing weights to {dtype}")
    cast = torch_dtype(dtype)
    permuted = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    tensors = {}
    for gguf_name in gguf.tensors:
        name = weight_name(gguf_name)
        if name is None:
            continue
        values = gguf.dequantized(gguf_name)
        heads = permuted.get(gguf_name.split(".")[-2]) if gguf.architecture == "llama" else None
        if heads is not None and gguf_name.endswith(".weight"):
            values = _reverse_permute(values, heads)
        tensors[name] = values.to(cast).contiguous()

    status(f"writing safetensors ({dtype}) to {out}")
    config.architectures = [MODEL_CLASSES[config.model_type]]
    config.dtype = cast
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


def _check_complete(gguf_path: Path, names: set[str | None], config) -> None:
    """Every weight the model needs is in the file (`names`: the transformers names of its
    tensors; biases are needed only where the file has them)."""
    needed = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_word_embeddings:
        needed.append("lm_head.weight")
    needed += [
        f"model.layers.{i}.{part}"
        for i in range(config.num_hidden_layers)
        for part in LAYER_NAMES.values()
        if not part.endswith(".bias")
    ]
    missing = [name for name in needed if name not in names]
    if missing:
        raise ModelIntegrityError(
            f"{gguf_path.name} lacks {len(missing)} weight(s) the model needs: {missing[:4]}"
        )


def _save_tokenizer(gguf_path: Path, model_type: str, out: Path) -> None:
    """The tokenizer class transformers picks for the model type, built from the file's
    metadata (transformers' own GGUF tokenizer reader, which reads the file once, quickly)."""
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    name = TOKENIZER_MAPPING_NAMES.get(model_type) or "TokenizersBackend"  # llama: the backend
    tokenizer_class = tokenizer_class_from_name(name)
    tokenizer = tokenizer_class.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out)
