import pytest
import torch

from specdec.errors import InvalidParameterError
from specdec.kernels.quant import Int4Linear, Int8Linear, _quantized
from specdec.kernels.quantize import quantize, quantize_int4

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


def test_untuned_int8_rows_split_between_packed_kernel_and_dequantized_weights():
    """Untuned, a prefill's many rows go through the dense kernel on the *dequantized*
    weights (the packed kernel is slow there) and a decode step's few rows through the
    packed kernel: both compute the same quantized model, so a quantized target's prefill
    and its decode steps agree (up to rounding), as the lossless acceptors need."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    q = Int8Linear(linear)
    assert not torch.equal(q.weight, linear.weight)  # the weights that run are quantized
    many = torch.randn(4, 5, 64, dtype=torch.bfloat16)
    assert torch.equal(q(many), torch.nn.functional.linear(many, q.weight, q.bias))
    few = many[:1, :3]
    ref = torch.nn.functional.linear(few.float(), q.weight.float(), q.bias.float())
    torch.testing.assert_close(q(few).float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_layer_holds_its_4bit_blocks_once_and_nothing_dense(dtype):
    """An int4 layer's `weight` is a shape (no bytes); its only tensors are the 4-bit
    blocks (and the bias), and a dense kernel run on it by mistake fails at once. Untuned, every
    row count computes the same quantized product (the panels here: the suite builds no
    native kernel), a many-row pass close to the float64 dequantized product."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 48).to(dtype)
    q = Int4Linear(linear)
    assert q.weight.shape == (48, 256) and q.weight.dtype == dtype
    assert q.device.type == "cpu" == q.weight.device.type
    held = {name: t.nbytes for name, t in q.state_dict().items()}
    blocks = q.stored_bytes()  # qs, sc, mn, d, dmin
    assert sum(held.values()) == blocks + linear.bias.nbytes
    assert blocks < 48 * 256 * 0.6  # ~4.5 bits a weight
    assert "weight" not in held and not isinstance(q.weight, torch.Tensor)
    with pytest.raises(TypeError):  # a dense kernel run on it by mistake fails at once
        torch.nn.functional.linear(torch.randn(2, 256, dtype=dtype), q.weight)
    many = torch.randn(4, 5, 256, dtype=dtype)
    exact = many.double() @ q.q4.dequantize().double().t() + q.bias.double()
    out = q(many)
    assert out.dtype == dtype and out.shape == (4, 5, 48)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), exact, atol=tol, rtol=tol)


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
    assert isinstance(model.lm_head, Int4Linear)  # vocab 97: any output count, no torch kernel
    assert "int4" not in model.lm_head.kernels()  # torch's int4 kernel needs N % 16 == 0
    cache = model.new_cache(1, 16)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]), cache).logits).all()
    odd = torch.nn.Linear(48, 32)  # 48 inputs: not whole 64-weight chunks of the format
    assert _quantized(odd, "int4") is odd


def test_int4_kernels_read_the_blocks_and_torch_int4_competes_only_without_native(
    monkeypatch,
):
    """Where the native kernel builds it is an int4 layer's one kernel (batch-invariant at
    every row count); elsewhere torch's int4 kernel competes for bf16 layers (for fp32
    ones it is ~100x slower, Int4Linear's docstring) beside the dequantized panels."""
    layer = torch.nn.Linear(64, 48)
    monkeypatch.setattr(native, "q4_gemv", lambda: None)
    assert set(Int4Linear(layer.to(torch.bfloat16)).kernels()) == {"int4", "q4_panels"}
    assert set(Int4Linear(torch.nn.Linear(64, 48)).kernels()) == {"q4_panels"}
    monkeypatch.setattr(native, "q4_gemv", lambda: object())
    assert set(Int4Linear(torch.nn.Linear(64, 48)).kernels()) == {"q4_native"}


def test_int4_refuses_non_cpu_models():
    model = native_from_hf(hf_tiny("llama")).to("meta")
    with pytest.raises(InvalidParameterError, match="CPU only"):
        quantize_int4(model)


# --- the 4-bit format and the native int4 kernel -----------------------------------------

import torch.nn.functional as F  # noqa: E402

from specdec.kernels import native  # noqa: E402
from specdec.kernels.q4 import q4_quantize, q4_reference  # noqa: E402


@pytest.mark.parametrize("k", [64, 576, 1536])  # 576: a super-block of 256 cut short
def test_q4_reference_is_the_dequantized_product_up_to_int8_activations(k):
    """The reference the native kernel is held to computes x @ dequant(W).T with x rounded
    to int8 per 256 inputs: within 2% of the exact product, never equal to a wrong one."""
    torch.manual_seed(0)
    w = torch.randn(40, k) * 0.05
    q4 = q4_quantize(w)
    assert ((q4.dequantize() - w).norm() / w.norm()) < 0.1  # 4 bits of a Gaussian: ~8%
    x = torch.randn(5, k)
    exact = F.linear(x, q4.dequantize())
    rel = (q4_reference(x, q4) - exact).norm() / exact.norm()
    assert rel < 0.02
    wrong = F.linear(x, w)  # the unquantized weights: farther than the int8 rounding
    assert (wrong - exact).norm() / exact.norm() > 5 * rel


def test_q4_quantize_keeps_zero_groups_and_zero_activations_finite():
    w = torch.zeros(16, 128)
    w[:, 64:] = torch.linspace(-1, 1, 64)
    q4 = q4_quantize(w)
    assert torch.equal(q4.dequantize()[:, :64], torch.zeros(16, 64))
    x = torch.zeros(2, 128)
    assert torch.equal(q4_reference(x, q4), torch.zeros(2, 16))


def test_native_q4_kernel_matches_its_reference_and_is_batch_invariant(monkeypatch):
    """The native int4 kernel (built on first use where AVX2 + FMA exist) against its
    float64 PyTorch reference, for every row count of a verify pass (1..17: one pass over
    the weights up to 8 rows, even passes past that), 33 and a prefill's rows in several
    row blocks (every row count it serves, by the paths they take), and row by
    row equal to a one-row call: a decode step and a verify pass through it compute the
    same numbers."""
    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    native.q4_gemv.cache_clear()
    try:
        op = native.q4_gemv()
        linear = torch.nn.Linear(576, 40).to(torch.bfloat16)
        if op is None:
            assert "q4_native" not in Int4Linear(linear).kernels()
            pytest.skip("no native kernel on this machine")
        torch.manual_seed(0)
        for k in (64, 576, 1536):
            q4 = q4_quantize(torch.randn(24, k) * 0.05)
            block = _block_rows(k)  # two whole row blocks and a part of one
            for rows in [*range(1, 18), 33, *([2 * block + 13] if k == 1536 else [])]:
                x = torch.randn(rows, k)
                x[0, :32] = 0  # a zero group and, below, a zero row
                if rows > 1:
                    x[-1] = 0
                out = op(x, q4.qs, q4.sc, q4.mn, q4.d, q4.dmin)
                ref = q4_reference(x, q4)
                torch.testing.assert_close(out, ref, atol=1e-5 * ref.abs().max(), rtol=1e-5)
                one_by_one = torch.cat(
                    [op(x[i : i + 1], q4.qs, q4.sc, q4.mn, q4.d, q4.dmin) for i in range(rows)]
                )
                assert torch.equal(out, one_by_one)
        # bf16 activations and a bias, added before the one rounding to bf16.
        bias = torch.randn(24)
        xb = torch.randn(3, 1536).to(torch.bfloat16)
        fused = op(xb, q4.qs, q4.sc, q4.mn, q4.d, q4.dmin, bias)
        plain = op(xb.float(), q4.qs, q4.sc, q4.mn, q4.d, q4.dmin)
        assert fused.dtype == torch.bfloat16
        assert torch.equal(fused, (plain + bias).to(torch.bfloat16))
        layer = Int4Linear(linear)
        assert "q4_native" in layer.kernels()
        x = torch.randn(3, 576).to(torch.bfloat16)
        exact = F.linear(x.float(), layer.q4.dequantize(), layer.bias.float())
        out = layer.run("q4_native", x)
        assert out.dtype == torch.bfloat16
        assert ((out.float() - exact).norm() / exact.norm()) < 0.02
        native.q4_gemv.cache_clear()
        monkeypatch.setenv("SPECDEC_NATIVE", "0")
        assert "q4_native" not in layer.kernels() and "int4" not in layer.kernels()
    finally:
        native.q4_gemv.cache_clear()


def _block_rows(k: int) -> int:
    """Rows of one of the native kernel's row blocks of a long product at width k."""
    block = native._loaded["q4_gemv"].block_rows(1 << 20, k)
    assert native._loaded["q4_gemv"].block_rows(9, k) == 9  # a verify pass: one block
    return block


@pytest.fixture
def tile_kernels(monkeypatch):
    """The native int4 kernel and its tile layout builder, the native build on for the test
    (the suite turns it off elsewhere; the decode stack too): (q4_gemv, q4_tiles), q4_tiles
    None where the build has no tile path."""
    accessors = native.q4_gemv, native.q4_tiles, native.decode_stack
    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    for accessor in accessors:
        accessor.cache_clear()
    yield native.q4_gemv(), native.q4_tiles()
    for accessor in accessors:
        accessor.cache_clear()


def test_native_q4_tile_layout_matches_the_reference_and_is_batch_invariant(tile_kernels):
    """Every build can read int4 weights re-ordered into tiles of 16 output rows (q4_kernel.h:
    fewer instructions per extra row of a verify pass: a third with AVX-512 VNNI, 9
    multiplies per 256 products where rows take 16 with AVX2). The tile path sums each
    super-block's exact integers into two fused multiply-adds, so it is held to the float64
    reference as tightly as the row layout, and row by row equal to one-row calls (a decode
    step and a verify pass agree bitwise), for 1..9, 12, 16 and a prefill's rows in several
    row blocks, with a bias and with
    super-blocks cut short (K = 576, 896); `Int4Linear` builds its tiles where the shape
    allows (N % 16 == 0) and runs them."""
    op, tiles = tile_kernels
    if tiles is None:
        assert Int4Linear(torch.nn.Linear(64, 32)).tiles.numel() == 0
        pytest.skip("no native int4 build on this machine")
    torch.manual_seed(0)
    for n, k in ((16, 64), (48, 576), (32, 896), (64, 1536)):
        q4 = q4_quantize(torch.randn(n, k) * 0.05)
        laid = tiles(*q4.tensors())
        bias = torch.randn(n)
        block = _block_rows(k)  # two whole row blocks and a part of one, as above
        for rows in [*range(1, 10), 12, 16, *([2 * block + 13] if k == 1536 else [])]:
            x = torch.randn(rows, k)
            x[0, :32] = 0  # a zero group and, below, a zero row
            if rows > 1:
                x[-1] = 0
            tiled = op(x, *q4.tensors(), bias, laid)
            ref = q4_reference(x, q4) + bias
            torch.testing.assert_close(tiled, ref, atol=1e-5 * ref.abs().max(), rtol=1e-5)
            one_by_one = torch.cat(
                [op(x[i : i + 1], *q4.tensors(), bias, laid) for i in range(rows)]
            )
            assert torch.equal(tiled, one_by_one), (n, k, rows)
    layer = Int4Linear(torch.nn.Linear(576, 48).to(torch.bfloat16))
    assert layer.tiles.numel() > 0 and "tiles" not in layer.state_dict()
    assert Int4Linear(torch.nn.Linear(576, 40)).tiles.numel() == 0  # 40 % 16 != 0
    x = torch.randn(3, 576).to(torch.bfloat16)
    bias = layer.bias.detach().float()
    tiled = op(x, *layer.q4.tensors(), bias, layer.tiles)
    assert torch.equal(layer.run("q4_native", x), tiled)
    x = x.float()  # unrounded: the two layouts' last bits differ, so the tiles did run
    assert torch.equal(layer.run("q4_native", x), op(x, *layer.q4.tensors(), bias, layer.tiles))
    assert not torch.equal(layer.run("q4_native", x), op(x, *layer.q4.tensors(), bias))


def test_tile_prefetch_levels_compute_the_same_products_and_are_chosen_once(
    tile_kernels, monkeypatch, tmp_path
):
    """The tile layout's prefetch level (into L1 or L2, `native.set_tile_prefetch`) moves
    no bit of a product, for any row count; `tune_prefetch` times both levels over a
    model's tiled int4 layers, sets the faster, stores it for the machine and reads it
    back without timing again; a model with no tiled layer sets nothing."""
    from specdec.kernels import tuning

    op, tiles = tile_kernels
    if tiles is None:
        pytest.skip("no native int4 build on this machine")
    try:
        torch.manual_seed(0)
        q4 = q4_quantize(torch.randn(64, 896) * 0.05)
        laid = tiles(*q4.tensors())
        for rows in (1, 4, 9, 16):
            x = torch.randn(rows, 896)
            outs = []
            for level in native.TILE_PREFETCH_LEVELS:
                native.set_tile_prefetch(level)
                outs.append(op(x, *q4.tensors(), None, laid))
            native.set_tile_prefetch(0)
            assert all(torch.equal(outs[0], out) for out in outs[1:]), rows
        with pytest.raises(ValueError, match="prefetch level"):
            native.set_tile_prefetch(2)

        model = quantize(native_from_hf(hf_tiny("qwen2", hidden_size=128)), "int4")
        cache = tmp_path / "kernels.json"
        entry = tuning.tune_prefetch(model, cache=cache)
        assert set(entry["seconds"]) == {str(level) for level in native.TILE_PREFETCH_LEVELS}
        assert native.tile_prefetch() == entry["level"]
        native.set_tile_prefetch(1 - entry["level"])
        monkeypatch.setattr(tuning, "measure_prefetch", lambda layers: pytest.fail("timed"))
        assert tuning.tune_prefetch(model, cache=cache) == entry
        assert native.tile_prefetch() == entry["level"]  # read back, set again
        untiled = native_from_hf(hf_tiny("qwen2"))
        assert tuning.tune_prefetch(untiled, cache=cache) == {}
    finally:
        native.set_tile_prefetch(0)


def test_tiles_are_kept_only_where_no_slower_at_one_row():
    """Faster at four rows but slower at one (the Zen 3's qkv): rows; no slower at one and
    faster in sum (its down projection): tiles; faster at one, slower in sum: rows."""
    from specdec.kernels import tuning

    def seconds(t1, t4, r1, r4):
        return {"tiles": {"1": t1, "4": t4}, "rows": {"1": r1, "4": r4}}

    assert not tuning.keeps_tiles(seconds(5.37, 6.20, 4.87, 6.83))
    assert tuning.keeps_tiles(seconds(15.97, 20.34, 16.78, 24.24))
    assert not tuning.keeps_tiles(seconds(1.0, 9.0, 1.1, 5.0))


def test_tile_layout_is_kept_where_timed_faster_and_the_choice_is_stored(
    tile_kernels, monkeypatch, tmp_path
):
    """`tune_layout` times each group of a model's tiled int4 layers in tiles and in rows
    and keeps the tiles only where `keeps_tiles` says (a draft model is no longer kept in
    rows by a rule tuned on a Zen 4); the choice is stored per machine and read back
    without timing, and a choice stored by another rule is timed again; a group that keeps
    rows drops its tiles, its plans are keyed apart (`group_key`), the decode stack rebuilt
    from the layers computes what the eager layers do, and the model's outputs stay those
    of the same 4-bit weights."""
    from specdec.kernels import tuning
    from specdec.kernels.decode_stack import tune_stack
    from specdec.kernels.quantize import with_decode_stack

    op, tiles = tile_kernels
    if tiles is None:
        pytest.skip("no native int4 build on this machine")
    model = quantize(native_from_hf(hf_tiny("qwen2", hidden_size=128)), "int4")
    assert model.decode_stack is not None
    layers = tuning._tiled_int4(model)
    keys = [tuning.group_key(layer) for layer in layers]  # before tuning drops any
    tiled = dict(zip(keys, layers, strict=True))
    assert layers and all(key.endswith(" tiles") for key in keys)
    cache = tmp_path / "kernels.json"
    chosen = tuning.tune_layout(model, cache=cache)
    assert set(chosen) == set(tiled)
    for key, entry in chosen.items():
        assert set(entry["seconds"]) == {"tiles", "rows"}
        kept = tuning.keeps_tiles(entry["seconds"])
        assert entry["tiles"] is kept and entry["rule"] == tuning.LAYOUT_RULE
        assert (tiled[key].tiles.numel() > 0) is kept  # a group that keeps rows drops them

    # Read back without timing; a stored "rows" drops the tiles of that group only.
    fresh = quantize(native_from_hf(hf_tiny("qwen2", hidden_size=128)), "int4")
    x = torch.randint(0, 100, (1, 5))
    with torch.inference_mode():
        tiled_logits = fresh(x, fresh.new_cache(1, 16)).logits
    stored = tuning.stored_entries("tile_layout", cache=cache)
    o_projs = [layer.self_attn.o_proj for layer in fresh.layers]  # in one tiled group
    rows_key = tuning.group_key(o_projs[0])
    assert rows_key in stored and all(tuning.group_key(p) == rows_key for p in o_projs)
    stored = {key: {**entry, "tiles": key != rows_key} for key, entry in stored.items()}
    tuning.store(cache, "tile_layout", stored)
    monkeypatch.setattr(tuning, "measure_layout", lambda layers: pytest.fail("timed"))
    assert tuning.tune_layout(fresh, cache=cache) == {key: stored[key] for key in chosen}
    older = {key: {k: v for k, v in entry.items() if k != "rule"} for key, entry in stored.items()}
    assert all(tuning._layout_pending(entry) for entry in older.values())
    assert all(p.tiles.numel() == 0 for p in o_projs)
    assert not tuning.group_key(o_projs[0]).endswith("tiles")
    # Every other group keeps its tiles.
    assert len(tuning._tiled_int4(fresh)) == len(layers) - keys.count(rows_key)
    with_decode_stack(fresh)
    tune_stack(fresh, cache=cache)
    with torch.inference_mode():
        rows_logits = fresh(x, fresh.new_cache(1, 16)).logits
        fresh.decode_stack.forced = False
        eager_logits = fresh(x, fresh.new_cache(1, 16)).logits
        fresh.decode_stack.forced = None
    torch.testing.assert_close(rows_logits, tiled_logits, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(rows_logits, eager_logits, atol=2e-2, rtol=2e-2)


_ISA_OUTPUTS = """
import sys, torch
from specdec.kernels import native
from specdec.kernels.q4 import q4_quantize
torch.manual_seed(0)
outs = []
for k in (64, 576, 896, 1536):  # 1, 2 + 1 (cut short), 3.5 and 6 super-blocks
    q4 = q4_quantize(torch.randn(24, k) * 0.05)
    for rows in (1, 2, 3, 5, 8, 9):
        x = torch.randn(rows, k)
        outs.append(native.q4_gemv()(x, q4.qs, q4.sc, q4.mn, q4.d, q4.dmin))
torch.save(outs, sys.argv[1])
"""


def test_native_q4_avx512_build_computes_what_the_avx2_build_does(tmp_path):
    """Where the CPU has AVX-512 VNNI the int4 kernel's row layout takes a wider path; its
    integer lanes fold into AVX2's, so both builds give the same floats for it (and the
    AVX2 path, which CI machines without AVX-512 run, is checked here too)."""
    import os
    import subprocess
    import sys

    from specdec.kernels.cpu import cpu_info

    widest = native.instruction_set(set(cpu_info()[1].split()))
    if widest == "avx2":
        pytest.skip("no AVX-512 (with VNNI) on this CPU")
    outputs = {}
    for isa in (widest, "avx2"):
        env = {**os.environ, "SPECDEC_NATIVE": "1", "SPECDEC_NATIVE_ISA": isa}
        path = tmp_path / f"{isa}.pt"
        subprocess.run([sys.executable, "-c", _ISA_OUTPUTS, str(path)], env=env, check=True)
        outputs[isa] = torch.load(path)
    assert len(outputs["avx2"]) == 24
    for wide, narrow in zip(outputs[widest], outputs["avx2"], strict=True):
        assert torch.equal(wide, narrow)


def test_native_isa_can_only_be_narrowed(monkeypatch):
    monkeypatch.delenv("SPECDEC_NATIVE_ISA", raising=False)  # a run under a narrowed build
    avx512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert native.instruction_set(avx512) == "avx512"
    assert native.instruction_set({*avx512, "avx512_bf16"}) == "avx512bf16"
    amx = {*avx512, "avx512_bf16", "amx_tile", "amx_bf16"}
    assert native.instruction_set(amx) == "amx"
    assert native.instruction_set({*avx512, "amx_tile", "amx_bf16"}) == "avx512"  # no BF16
    assert native.instruction_set({"avx2", "fma", "avx512_bf16"}) == "avx2"
    assert native.instruction_set({"avx2", "fma"}) == "avx2"
    monkeypatch.setenv("SPECDEC_NATIVE_ISA", "avx2")
    assert native.instruction_set(avx512) == "avx2"
    monkeypatch.setenv("SPECDEC_NATIVE_ISA", "avx512")
    assert native.instruction_set({"avx2", "fma"}) == "avx2"  # never wider than the CPU
    assert native.instruction_set({*avx512, "avx512_bf16"}) == "avx512"
    monkeypatch.setenv("SPECDEC_NATIVE_ISA", "avx512bf16")
    assert native.instruction_set(amx) == "avx512bf16"
    monkeypatch.setenv("SPECDEC_NATIVE_ISA", "sse2")
    with pytest.raises(ValueError, match="SPECDEC_NATIVE_ISA"):
        native.instruction_set(avx512)
