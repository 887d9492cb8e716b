"""GGUF Q4_K blocks become `Q4Weights` exactly, and a Q4_K file's layers run its own bits."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, dequantize

from specdec.kernels.gguf_q4 import (
    BLOCK_BYTES,
    GGUFWeights,
    QuantReport,
    q4_k_blocks,
)


def _random_q4_k(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Arbitrary Q4_K blocks [rows, k / 256 * 144]: any bytes are a valid block once the two
    fp16 scales are finite, so random bytes exercise every 6-bit scale packing case."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, k // 256, BLOCK_BYTES), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-2, size=(rows, k // 256, 2)).astype(np.float16)
    blocks[..., 0:4] = scales.view(np.uint8).reshape(rows, k // 256, 4)
    return blocks.reshape(rows, -1)


def test_q4_k_blocks_dequantize_exactly_as_gguf_does():
    blocks = _random_q4_k(8, 512)
    ours = q4_k_blocks(blocks).dequantize().numpy()
    theirs = dequantize(blocks, GGMLQuantizationType.Q4_K)
    assert ours.shape == theirs.shape == (8, 512)
    assert np.array_equal(ours, theirs)


def _write(path, tensors):
    writer = GGUFWriter(str(path), "qwen2")
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)  # Q4_K: data is the blocks' bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_fused_layer_takes_q4_k_parts_as_they_are_and_requantizes_the_rest(tmp_path):
    q = _random_q4_k(16, 256, seed=1)
    k = _random_q4_k(8, 256, seed=2)
    v = (np.random.default_rng(3).standard_normal((8, 256)) * 0.05).astype(np.float32)
    path = tmp_path / "tiny.gguf"
    q4k, f32 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.F32
    _write(path, {"blk.0.attn_q.weight": (q, q4k), "blk.0.attn_k.weight": (k, q4k),
                  "blk.0.attn_v.weight": (v, f32)})  # fmt: skip
    exact = [torch.from_numpy(dequantize(b, q4k)) for b in (q, k)]
    loaded = torch.cat([*exact, torch.from_numpy(v)]).to(torch.bfloat16)  # as transformers loads
    report = QuantReport()
    weights = GGUFWeights(path).layer("layers.0.self_attn.qkv_proj", loaded, report)
    assert report.exact == ["blk.0.attn_q", "blk.0.attn_k"]
    assert report.requantized == ["blk.0.attn_v"]
    out = weights.dequantize()
    assert torch.equal(out[:24], torch.cat(exact))  # the file's own 4-bit weights
    assert ((out[24:] - torch.from_numpy(v)).norm() / torch.from_numpy(v).norm()) < 0.1

    # Blocks that do not dequantize to the loaded weights (rows permuted, say) are not used.
    report = QuantReport()
    swapped = torch.cat([exact[0].flip(0), exact[1], torch.from_numpy(v)]).to(torch.bfloat16)
    GGUFWeights(path).layer("layers.0.self_attn.qkv_proj", swapped, report)
    assert report.exact == ["blk.0.attn_k"]
    with pytest.raises(ValueError, match="rows"):
        GGUFWeights(path).layer("layers.0.self_attn.qkv_proj", loaded[:20], QuantReport())
