"""The native transformer's configuration, read from a Hugging Face `config.json`.

One dataclass covers the whole Llama family; the architectures differ only in a few
switches (qkv bias, tied head, sliding window, RoPE scaling), which are resolved here once
so the model code never branches on an architecture name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from specdec.errors import ModelNotFoundError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and switches of a Llama-family decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)
    """RoPE scaling parameters (`rope_type` plus its factors); empty for plain RoPE."""
    qkv_bias: bool = False
    """Bias on the q, k and v projections (always on for Qwen2)."""
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    """Attend only to the last `sliding_window` positions (Mistral); None for full attention."""
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"RoPE scaling type {rope_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> ModelConfig:
        """Map a transformers config dict (4.x or 5.x layout) onto the native switches."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(cfg.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported by the native transformer "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        # transformers 5 moved rope_theta/rope_scaling into one `rope_parameters` dict.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        if rope.get("rope_type", "default") == "default":
            rope = {}
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        is_qwen2 = arch == "Qwen2ForCausalLM"
        if is_qwen2 and cfg.get("use_sliding_window"):
            raise UnsupportedModelError("Qwen2 with use_sliding_window=true is not supported")
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rope_theta=float(theta),
            rope_scaling=rope,
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=None if is_qwen2 else cfg.get("sliding_window"),
            architecture=arch,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise ModelNotFoundError(f"{path}: no config.json (not a Hugging Face model directory)")
        return cls.from_hf_dict(json.loads(config_file.read_text()))

    def inv_freq(self) -> list[float]:
        """RoPE inverse frequencies after the configured scaling, one per rotated pair."""
        half = self.head_dim // 2
        freqs = [1.0 / self.rope_theta ** (2 * i / self.head_dim) for i in range(half)]
        kind = self.rope_scaling.get("rope_type", "default")
        if kind == "linear":
            return [f / self.rope_scaling["factor"] for f in freqs]
        if kind == "llama3":
            return [_llama3_scale(f, self.rope_scaling) for f in freqs]
        return freqs


def _arch_from_model_type(model_type: str | None) -> str:
    return {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "mistral": "MistralForCausalLM",
    }.get(model_type or "", f"<model_type {model_type}>")


def _llama3_scale(freq: float, p: dict) -> float:
    """Llama 3.1's wavelength-dependent frequency scaling (long wavelengths slowed down)."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_ctx = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    if wavelen < old_ctx / high:
        return freq
    if wavelen > old_ctx / low:
        return freq / factor
    smooth = (old_ctx / wavelen - low) / (high - low)
    return (1 - smooth) * freq / factor + smooth * freq
