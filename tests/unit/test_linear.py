import pytest
import torch
import torch.nn.functional as F

from specdec.kernels.linear import Linear, pack_panels


@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 5, 48), (3, 4, 48), (2, 40, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_f_linear_for_every_row_count(shape, bias):
    torch.manual_seed(0)
    layer = Linear(48, 24, bias=bias)
    x = torch.randn(shape)
    out = layer(x)
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))


# --- measured kernel choice -------------------------------------------------------------

import json  # noqa: E402

from specdec.kernels import tuning  # noqa: E402
from specdec.kernels.linear import BUCKETS, bucket_of  # noqa: E402
from specdec.kernels.quant import Int4Linear, Int8Linear  # noqa: E402


def _layers(dtype, bias=True, n=3):
    torch.manual_seed(0)
    return [Linear(64, 48, bias=bias).to(dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_every_candidate_equals_f_linear(dtype, rows):
    layers = _layers(dtype) + [Int4Linear(nn) for nn in _layers(dtype)[:1]]
    layers += [Int8Linear(nn) for nn in _layers(dtype)[:1]]
    x = torch.randn(rows, 64).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    for layer in layers:
        dense = layer.q4.dequantize() if isinstance(layer, Int4Linear) else layer.weight.float()
        ref = F.linear(x.float(), dense, layer.bias.float())
        for name in layer.kernels():
            layer.prepare(name)
            out = layer.run(name, x)
            assert out.dtype == dtype and out.shape == (rows, 48), name
            torch.testing.assert_close(out.float(), ref, **tol, msg=f"{type(layer)} {name}")


def test_half_precision_offers_fp32_upcasts_and_fp32_does_not():
    bf16, fp32 = _layers(torch.bfloat16, n=1)[0], _layers(torch.float32, n=1)[0]
    for name in ("fp32_upcast", "fp32_panels"):
        assert name in bf16.kernels() and name not in fp32.kernels()
    assert set(fp32.kernels()) >= {"linear", "mv_mm"}


def test_fp32_panels_widen_the_weights_panel_by_panel(monkeypatch):
    """Panels of 16 output rows (the smallest) over 56 outputs: three whole panels and a
    part, each written to its own rows of the output, with the bias, from a layer whose
    weights require grad (as a model's do outside inference mode); 37 input rows, padded
    to 40 for the GEMM and cut back."""
    from specdec.kernels import linear

    monkeypatch.setattr(linear, "PANEL_BYTES", 16 * 64 * 4)
    monkeypatch.setattr(linear._panel_scratch, "buffer", None, raising=False)
    torch.manual_seed(0)
    layer = Linear(64, 56).to(torch.bfloat16)
    x = torch.randn(37, 64).to(torch.bfloat16)
    with torch.inference_mode():  # the reused buffer is born here (as when tuning) ...
        layer.run("fp32_panels", x)
    # ... and written to again outside inference mode below.
    ref = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    out = layer.run("fp32_panels", x)
    assert out.dtype == torch.bfloat16 and out.shape == (37, 56)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)
    # The same products as one fp32 GEMM over the whole widened matrix, up to its rounding.
    torch.testing.assert_close(out, layer.run("fp32_upcast", x), atol=1e-2, rtol=1e-2)


def test_buckets_cover_every_row_count():
    assert [bucket_of(r) for r in (1, 2, 3, 5, 9, 17, 33, 65, 999)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        256,
        256,
    ]
    assert BUCKETS[0] == 1


def _model(dtype=torch.bfloat16):
    model = torch.nn.Sequential(*_layers(dtype), Linear(48, 32, bias=False).to(dtype))
    return model


def test_tune_kernels_plans_every_bucket_and_forward_follows_it(tmp_path):
    model = _model()
    chosen = tuning.tune_kernels(model, cache=tmp_path / "k.json")
    assert len(chosen) == 2  # two shapes: 48x64 with bias, 32x48 without
    for entry in chosen.values():
        assert set(entry["plan"]) == {str(b) for b in BUCKETS}
        for rows, times in entry["seconds"].items():  # the fastest over the bucket's ends
            low = entry["seconds_low"][rows]
            summed = {name: t + low[name] for name, t in times.items()}
            assert summed[entry["plan"][rows]] == min(summed.values())
    layer = model[0]
    assert layer.plan and set(layer.formats) <= set(layer.plan.values())  # losers dropped
    calls = []
    name = layer.plan[1]
    kernel = layer.kernels()[name]
    layer._route[1] = (
        lambda lyr, fmt, x: calls.append(x.shape) or kernel.run(lyr, fmt, x),
        layer.formats.get(name),
    )
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    torch.testing.assert_close(
        layer(x), F.linear(x, layer.weight, layer.bias), atol=3e-2, rtol=2e-2
    )
    assert calls == [(1, 64)]


def test_the_cache_is_read_back_and_keyed_by_machine(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "k.json"
    assert tuning.pending_steps(_model(), cache=cache) == 2  # two groups to time
    tuning.tune_kernels(_model(), cache=cache)
    stored = json.loads(cache.read_text())
    assert stored["machine"] == tuning.machine()
    assert not any(entry.get("predicted") for entry in stored["groups"].values())
    assert tuning.pending_steps(_model(), cache=cache) == 0
    capsys.readouterr()
    # Same machine: no timing at all, and nothing said.
    monkeypatch.setattr(tuning, "measure_group", lambda layers: pytest.fail("re-timed"))
    tuning.tune_kernels(_model(), cache=cache)
    assert capsys.readouterr().err == ""
    # Another machine (here: another CPU model) measures its own.
    other = dict(tuning.machine(), cpu="Some Other CPU")
    monkeypatch.setattr(tuning, "machine", lambda: other)
    timed = []
    monkeypatch.setattr(
        tuning,
        "measure_group",
        lambda layers: timed.append(len(layers)) or stored["groups"][tuning.group_key(layers[0])],
    )
    tuning.tune_kernels(_model(), cache=cache)
    assert timed == [3, 1]
    assert json.loads(cache.read_text())["machine"]["cpu"] == "Some Other CPU"


def test_machine_ids_differ_by_cpu_and_threads(monkeypatch):
    base = tuning.machine_id()
    torch.set_num_threads(2)
    assert tuning.machine_id() != base
    torch.set_num_threads(1)
    assert tuning.machine_id() == base


def test_native_kernel_matches_its_pytorch_reference_or_is_absent(monkeypatch):
    """The native bf16 kernel (built on first use where AVX2 + FMA exist) against its
    pure-PyTorch reference, for every row count it takes in one call and beyond (chunks)."""
    from specdec.kernels import native

    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    native.bf16_gemv.cache_clear()
    op = native.bf16_gemv()
    if op is None:
        assert "native_bf16" not in Linear(64, 48).to(torch.bfloat16).kernels()
        pytest.skip("no native kernel on this machine")
    torch.manual_seed(0)
    # 43 outputs: tiles of 8, 3 or 2 output rows leave 3, 1 or 1 over; whole panels of 8 (5,
    # one beside the pairs or threes the AVX2 kernel takes at once) or one of 32 (beside the
    # 2 or 4 the AVX-512 kernel takes), and a last panel cut to 3 or 11 outputs; 7-8 rows
    # go in two groups.
    w = torch.randn(43, 72).to(torch.bfloat16)
    x = torch.randn(8, 72)
    layouts = native.bf16_panel_layouts()  # every panel layout the build reads, and rows
    assert native.bf16_panel_layout() in layouts
    for panels in (None, *[pack_panels(w, width, kstep) for width, kstep in layouts]):
        # The pair panels multiply bf16 pairs: x is rounded to bf16 first.
        xr = x.bfloat16().float() if panels is not None and panels.shape[1] == 36 else x
        for rows in range(1, 9):
            out = op(x[:rows], w, panels)
            torch.testing.assert_close(out, F.linear(xr[:rows], w.float()), atol=1e-4, rtol=1e-5)
            assert torch.equal(out, torch.cat([op(x[i : i + 1], w, panels) for i in range(rows)]))
    # [6, 72, 8]: output 8p + j of every k at [p, k, j], zeros past 43; [2, 72, 32] alike
    packed = pack_panels(w)
    assert packed.shape == (6, 72, 8) and torch.equal(packed[5, :, 3:], torch.zeros(72, 5))
    assert torch.equal(packed[2, 5], w[16:24, 5])
    wide = pack_panels(w, 32)
    assert wide.shape == (2, 72, 32) and torch.equal(wide[1, :, 11:], torch.zeros(72, 21))
    assert torch.equal(wide[1, 5, :11], w[32:43, 5])
    # [3, 36, 32]: outputs 16p + j of k = 2i, 2i + 1 at [p, i, 2j], [p, i, 2j + 1]
    pairs = pack_panels(w, 16, 2)
    assert pairs.shape == (3, 36, 32) and torch.equal(pairs[2, :, 22:], torch.zeros(36, 10))
    assert torch.equal(pairs[1, 5, 0::2], w[16:32, 10])
    assert torch.equal(pairs[1, 5, 1::2], w[16:32, 11])
    with pytest.raises(ValueError, match="kstep"):
        pack_panels(w[:, :71], 16, 2)
    # K a multiple of 32 and up to 17 rows: the AMX build's tiles where it has them (16 rows
    # a pass, 4 panels at once, the 2 left one at a time, a last one cut to 11 outputs).
    w2, x2 = torch.randn(107, 96).to(torch.bfloat16), torch.randn(17, 96)
    for width, kstep in layouts:
        panels = pack_panels(w2, width, kstep)
        xr = x2.bfloat16().float() if kstep == 2 else x2
        out = op(x2, w2, panels)
        torch.testing.assert_close(out, F.linear(xr, w2.float()), atol=1e-4, rtol=1e-5)
        for rows in (1, 5, 16):
            assert torch.equal(op(x2[:rows], w2, panels), out[:rows])
    width, kstep = native.bf16_panel_layout()
    with pytest.raises(RuntimeError, match="panels"):
        op(x, w, pack_panels(w, width, kstep)[:1].contiguous())
    unread = next(lo for lo in [(8, 1), (32, 1), (16, 2)] if lo not in layouts)
    with pytest.raises(RuntimeError, match="panels"):  # a layout of another build
        op(x, w, pack_panels(w, *unread))
    layer = Linear(72, 40).to(torch.bfloat16)
    layer.prepare("native_bf16")  # the panels wherever the kernel is built
    assert (layer.formats["native_bf16"] is not None) == native.bf16_panels()
    x = torch.randn(19, 72).to(torch.bfloat16)
    ref = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    torch.testing.assert_close(layer.run("native_bf16", x).float(), ref, atol=2e-2, rtol=1e-2)
    assert "native_bf16" in layer.kernels()
    # However the rows are split into calls (9 as 5 + 4), each row's numbers are a
    # one-row call's: a verify pass scores its tokens as one-token steps would.
    one_by_one = torch.cat([layer.run("native_bf16", x[i : i + 1]) for i in range(19)])
    for rows in (9, 12, 19):
        assert torch.equal(layer.run("native_bf16", x[:rows]), one_by_one[:rows])
    # Off by environment: the candidate disappears, PyTorch kernels remain.
    native.bf16_gemv.cache_clear()
    monkeypatch.setenv("SPECDEC_NATIVE", "0")
    try:
        assert "native_bf16" not in layer.kernels() and "linear" in layer.kernels()
    finally:
        native.bf16_gemv.cache_clear()


@pytest.fixture
def native_on(monkeypatch):
    """The native build on (the suite turns it off elsewhere), cleared again afterwards."""
    from specdec.kernels import native

    monkeypatch.setenv("SPECDEC_NATIVE", "1")
    native.bf16_gemv.cache_clear()
    yield native
    native.bf16_gemv.cache_clear()


def test_the_bf16_panel_layout_is_timed_once_per_machine_and_repacks(
    tmp_path, monkeypatch, native_on
):
    """Where the build reads two panel layouts (AVX-512 BF16: pairs or fp32 FMAs), the one
    timed faster here is packed from then on; layers packed in the other drop their panels
    and re-pack, and a later process reads the choice instead of timing. The timing is
    faked here (the real one: the next test), so this runs on any native build."""
    native = native_on
    if native.bf16_gemv() is None:
        pytest.skip("no native kernel on this machine")
    monkeypatch.setattr(native, "_panel_layout", None)
    # The tuned mode, where bf16 plans are timed among several kernels (by default the one
    # batch-invariant kernel is taken untimed: `kernels.invariance`).
    monkeypatch.setenv("SPECDEC_BF16_INVARIANT", "0")
    model = _model()
    # A kernel plan remembers the layout it was timed in, and one timed in another is stale.
    entries = tuning.tune_kernels(model, cache=tmp_path / "plans.json")
    assert {tuple(e["panels"]) for e in entries.values()} == {native.bf16_panel_layout()}
    key = tuning.group_key(model[0])
    assert not tuning._stale(entries[key], [model[0]])
    with monkeypatch.context() as m:
        m.setattr(native, "bf16_panel_layout", lambda: (99, 1))
        assert tuning._stale(entries[key], [model[0]])

    monkeypatch.setattr(native, "bf16_panel_layouts", lambda: [(16, 2), (32, 1)])
    layers = [m for m in model if isinstance(m, Linear)]
    for layer in layers:
        layer.formats.pop("native_bf16", None)  # packed above in this build's own default
        layer.use({1: "native_bf16"})  # packed in the default layout: pairs, [N / 16, K / 2, 32]
        assert layer.formats["native_bf16"].shape[1] == layer.in_features // 2
    timed = []

    def measure(swept):
        timed.append(len(swept))
        return {"layout": [32, 1], "seconds": {}, "bytes": 0}

    monkeypatch.setattr(tuning, "measure_bf16_panels", measure)
    cache = tmp_path / "k.json"
    assert tuning.tune_bf16_panels(model, cache=cache) is True  # panels were dropped
    assert timed == [len(layers)] and native.bf16_panel_layout() == (32, 1)
    for layer in layers:  # re-packed where the plan runs the native kernel: [N / 32, K, 32]
        n_panels = -(-layer.out_features // 32)
        assert layer.formats["native_bf16"].shape == (n_panels, layer.in_features, 32)
    assert json.loads(cache.read_text())["bf16_panels"]["layout"] == [32, 1]
    monkeypatch.setattr(native, "_panel_layout", None)  # a new process: read, not timed
    assert tuning.tune_bf16_panels(model, cache=cache) is False
    assert timed == [len(layers)] and native.bf16_panel_layout() == (32, 1)
    # A new process puts the stored layout in force before it loads, so a model is packed
    # once, in that layout, and nothing is re-packed after.
    monkeypatch.setattr(native, "_panel_layout", None)
    assert tuning.use_stored_bf16_panels(cache=tmp_path / "none.json") is False
    assert native.bf16_panel_layout() == (16, 2)
    assert tuning.use_stored_bf16_panels(cache=cache) is True
    fresh = _model()
    for layer in (m for m in fresh if isinstance(m, Linear)):
        layer.use({1: "native_bf16"})
        assert layer.formats["native_bf16"].shape[1:] == (layer.in_features, 32)
    assert tuning.tune_bf16_panels(fresh, cache=cache) is False


def test_measure_bf16_panels_times_every_layout_the_build_reads(native_on):
    native = native_on
    if len(native.bf16_panel_layouts()) < 2:
        pytest.skip("this build reads one bf16 panel layout: nothing to choose")
    layers = [m for m in _model() if isinstance(m, Linear)]
    entry = tuning.measure_bf16_panels(layers)
    names = {f"{w}x{k}" for w, k in native.bf16_panel_layouts()}
    assert set(entry["seconds"]) == names
    sums = {name: sum(t.values()) for name, t in entry["seconds"].items()}
    assert min(sums, key=sums.get) == "{}x{}".format(*entry["layout"])
    assert all(set(t) == {"1", "4", "8"} for t in entry["seconds"].values())


def test_a_bucket_is_planned_for_its_lowest_row_count_too(tmp_path, monkeypatch):
    """Bucket 16 serves 9-16 rows. A kernel whose cost does not grow with the rows (14 per
    layer, like one that widens the weights first) beats one that grows (1 per row) at 16
    rows but not at 9: the plan takes the least sum over both ends, and keeps both."""
    cost = {"fp32_panels": lambda rows: 14.0, "linear": float}
    monkeypatch.setattr(
        tuning,
        "_time",
        lambda group, name, x, best: cost.get(name, lambda rows: 1e3)(x.shape[0]) * len(group),
    )
    chosen = tuning.tune_kernels(_model(), cache=tmp_path / "k.json")
    entry = chosen["Linear 48x64 bfloat16 bias"]
    assert entry["seconds"]["16"]["linear"] == 16.0 and entry["seconds_low"]["16"]["linear"] == 9.0
    assert entry["seconds_low"]["1"] == entry["seconds"]["1"]
    assert entry["plan"]["8"] == entry["plan"]["16"] == "linear"  # 5 + 8, 9 + 16 < 14 + 14
    assert entry["plan"]["32"] == entry["plan"]["256"] == "fp32_panels"  # 17 + 32 > 28


def test_a_plan_without_every_bucket_is_measured_again(tmp_path, monkeypatch):
    """A cache written when the buckets were different (e.g. before the 256-row prefill
    bucket) would leave some row counts on no kernel at all: such an entry is re-timed."""
    cache = tmp_path / "k.json"
    tuning.tune_kernels(_model(), cache=cache)
    stored = json.loads(cache.read_text())
    for entry in stored["groups"].values():
        del entry["plan"]["256"]
    cache.write_text(json.dumps(stored))
    timed = []
    real = tuning.measure_group
    monkeypatch.setattr(tuning, "measure_group", lambda ls: timed.append(1) or real(ls))
    tuning.tune_kernels(_model(), cache=cache)
    assert timed == [1, 1]


def test_one_slow_sweep_does_not_drop_a_kernel(monkeypatch):
    """A candidate whose first sweep reads far slower than the best (the other core busy
    for a moment) gets a second sweep, and its repeats, when the second is not slow; a
    candidate slow twice running is dropped after those two."""
    calls = []

    def sweep(layers, name, x):
        calls.append(name)
        if name == "spiky":
            return 10.0 if calls.count("spiky") == 1 else 1.0
        return 10.0

    monkeypatch.setattr(tuning, "_sweep", sweep)
    assert tuning._time([], "spiky", None, best=1.0) == 1.0
    assert calls.count("spiky") == 2 + tuning.REPEATS
    assert tuning._time([], "slow", None, best=1.0) == 10.0
    assert calls.count("slow") == 2


def test_a_stale_native_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """A process killed mid-build leaves torch's lock file, on which every later build
    would wait forever; one younger than any build could be is another build's."""
    import os
    import time

    from specdec.kernels import native

    lock = tmp_path / "lock"
    lock.touch()
    native._clear_stale_lock(tmp_path)
    assert lock.exists()
    old = time.time() - native.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    native._clear_stale_lock(tmp_path)
    assert not lock.exists()
    native._clear_stale_lock(tmp_path)  # no lock: nothing to do
