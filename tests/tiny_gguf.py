"""Tiny GGUF files with a byte-level BPE tokenizer in their metadata, written by gguf-py."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def byte_level_tokens() -> list[str]:
    """The 256 byte-level BPE symbols (GPT-2's printable spelling of every byte)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    seed: int = 0,
    *,
    layers: int = 1,
    biases: bool = False,
    quantized: bool = False,
) -> dict[str, np.ndarray]:
    """A model with random weights: F32, or with the feed-forward weights in Q8_0 blocks
    (`quantized`) and q/k/v biases (`biases`, as qwen2 has).

    Returns the tensors written as F32, in the layout GGUFWriter takes them in.
    """
    import gguf

    tokens = byte_level_tokens() + ["\u0120t", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 3) + [gguf.TokenType.CONTROL] * 3
    vocab, hidden, ffn, heads, kv_heads = len(tokens), 64, 64, 4, 2
    head_dim = hidden // heads

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["\u0120 t"])
    writer.add_bos_token_id(vocab - 3)
    writer.add_eos_token_id(vocab - 1)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
    )

    shapes = {"token_embd.weight": (vocab, hidden)}
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (heads * head_dim, hidden),
            f"blk.{i}.attn_k.weight": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v.weight": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_output.weight": (hidden, heads * head_dim),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.ffn_gate.weight": (ffn, hidden),
            f"blk.{i}.ffn_up.weight": (ffn, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ffn),
        }
        if biases:
            shapes |= {
                f"blk.{i}.attn_q.bias": (heads * head_dim,),
                f"blk.{i}.attn_k.bias": (kv_heads * head_dim,),
                f"blk.{i}.attn_v.bias": (kv_heads * head_dim,),
            }
    shapes |= {"output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    rng = np.random.default_rng(seed)
    tensors = {n: rng.standard_normal(s).astype(np.float32) * 0.1 for n, s in shapes.items()}
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, array in tensors.items():
        if quantized and ".ffn_" in name and name.endswith("weight") and "norm" not in name:
            writer.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors
