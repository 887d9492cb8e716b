"""The native decode stack (every layer of a small int4 or bf16 step in one call) against the
eager layers, its batch invariance, and when it is used."""

import pytest
import torch

from specdec.acceptors import GreedyAcceptor
from specdec.drafters import DraftModelDrafter
from specdec.engine import Engine
from specdec.kernels import native
from specdec.kernels.decode_stack import DecodeStack
from specdec.kernels.linear import BUCKETS, Linear
from specdec.kernels.quantize import quantize
from specdec.params import SamplingParams
from specdec.window import FixedWindow

from tiny import hf_tiny, native_from_hf


@pytest.fixture(scope="module", autouse=True)
def native_kernels():
    """The native build on (the suite turns it off elsewhere), for the stack and the eager
    int4 layers alike, so both compute with the same int4 kernel."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_NATIVE", "1")
        kernels = native.q4_gemv, native.bf16_gemv, native.decode_stack
        for kernel in (*kernels, native.q4_tiles):  # tiles: where the build has them
            kernel.cache_clear()
        if any(kernel() is None for kernel in kernels):
            pytest.skip("native kernels unavailable (no compiler or AVX2)")
        yield
    for kernel in (*kernels, native.q4_tiles):
        kernel.cache_clear()


def _int4(kind="qwen2", dtype=torch.float32, seed=0, **overrides):
    shape = {"hidden_size": 128, "intermediate_size": 256, **overrides}
    model = quantize(native_from_hf(hf_tiny(kind, seed=seed, **shape), dtype), "int4")
    assert isinstance(model.decode_stack, DecodeStack)
    return model


def _bf16(kind="qwen2", seed=0, native_upto=None, **overrides):
    """A bf16 model whose every projection runs the native bf16 kernel (as tuning plans it
    in the batch-invariant mode; its decoder projections keep their panels alone), so the
    eager layers and the stack compute their products alike; with `native_upto`, only up
    to that many rows, `linear` beyond (a plan of the tuned mode)."""
    shape = {"hidden_size": 128, "intermediate_size": 256, **overrides}
    model = quantize(native_from_hf(hf_tiny(kind, seed=seed, **shape), torch.bfloat16), "none")
    for module in model.modules():
        if isinstance(module, Linear):
            upto = native_upto or BUCKETS[-1]
            module.use({b: "native_bf16" if b <= upto else "linear" for b in BUCKETS})
    assert isinstance(model.decode_stack, DecodeStack)
    return model


def _run(model, steps, use_stack):
    """Hidden states of a prompt pass then `steps` [(tokens [B, T], num_new [B])], with the
    stack on or off for the steps (the prompt always eager)."""
    stack, model.decode_stack = model.decode_stack, None
    cache = model.new_cache(2, 64)
    outs = []
    with torch.inference_mode():
        model(torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]]), cache)
        model.decode_stack = stack if use_stack else None
        for tokens, num_new in steps:
            outs.append(model(tokens, cache, num_new=num_new).hidden)
    model.decode_stack = stack
    return outs, cache


STEPS = [
    (torch.tensor([[11, 12, 13], [21, 22, 0]]), torch.tensor([3, 2])),  # ragged: row 1 pads
    (torch.tensor([[14], [23]]), torch.tensor([1, 1])),
    (torch.tensor([[15, 16], [24, 25]]), torch.tensor([2, 2])),
]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])  # qkv biases / none
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stack_computes_what_the_eager_layers_compute(kind, dtype):
    """Same roundings as the eager layers. In fp32 only the order of a few reductions differs,
    which the int4 kernel's int8 activation rounding can turn, at a rare near-tie, into one
    step of an activation: so nearly every value agrees to fp32 noise and none is far off.
    In bf16 PyTorch's attention also rounds its probabilities to bf16 (the stack keeps fp32),
    so values agree to a few bf16 steps."""
    model = _int4(kind, dtype)
    fused, _ = _run(model, STEPS, True)
    eager, _ = _run(model, STEPS, False)
    for a, b in zip(fused, eager, strict=True):
        a, b = a.float().clone(), b.float().clone()
        a[1, 2:] = b[1, 2:] = 0  # row 1's padding in the ragged step: meaningless outputs
        diff, scale = (a - b).abs(), b.abs().max()
        close = 1e-5 if dtype == torch.float32 else 2e-2
        assert (diff <= close * scale).float().mean() > 0.99, diff.max()
        assert diff.max() < 0.05 * scale


@pytest.mark.parametrize("make", [_int4, _bf16])
def test_stack_hands_over_the_layer_inputs_the_eager_layers_keep(make):
    """An EAGLE-3 head's layer inputs come out of the stack's one call, in the order asked:
    the embedding (id 0) exactly, a later layer's input as the eager layers compute it (to
    the agreement above), and asking for them changes nothing else the pass returns."""
    model = make(num_hidden_layers=3)
    asked = (2, 0, 1)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])
    tokens, num_new = torch.tensor([[11, 12, 13], [21, 22, 0]]), torch.tensor([3, 2])
    outs = {}
    for use_stack, aux_layers in ((True, ()), (True, asked), (False, asked)):
        stack, model.decode_stack = model.decode_stack, None
        cache = model.new_cache(2, 32)
        with torch.inference_mode():
            model(prompt, cache)
            model.decode_stack = stack if use_stack else None
            outs[use_stack, aux_layers] = model(tokens, cache, num_new, aux_layers=aux_layers)
        model.decode_stack = stack
    plain, fused, eager = outs[True, ()], outs[True, asked], outs[False, asked]
    assert plain.aux is None
    assert torch.equal(fused.hidden, plain.hidden) and torch.equal(fused.logits, plain.logits)
    H = model.config.hidden_size
    assert fused.aux.shape == (2, 3, 3 * H) and fused.aux.dtype == model.dtype
    for a, b in ((fused.aux, eager.aux), (fused.hidden, eager.hidden)):
        a, b = a.float().clone(), b.float().clone()
        a[1, 2:] = b[1, 2:] = 0  # row 1's padding
        assert (a - b).abs().max() < 0.05 * b.abs().max()
    assert torch.equal(fused.aux[..., H : 2 * H], model.embed_tokens(tokens))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_bf16_stack_computes_what_the_eager_layers_compute(kind):
    """bf16 weights: the same products as the eager native_bf16 layers, the same roundings;
    PyTorch's attention rounds its probabilities to bf16 where the stack keeps fp32, so
    values agree to a few bf16 steps."""
    model = _bf16(kind)
    fused, _ = _run(model, STEPS, True)
    eager, _ = _run(model, STEPS, False)
    for a, b in zip(fused, eager, strict=True):
        a, b = a.float().clone(), b.float().clone()
        a[1, 2:] = b[1, 2:] = 0  # row 1's padding in the ragged step
        diff, scale = (a - b).abs(), b.abs().max()
        assert (diff <= 2e-2 * scale).float().mean() > 0.99, diff.max()
        assert diff.max() < 0.05 * scale


@pytest.mark.parametrize("make", [_int4, _bf16], ids=["int4", "bf16"])
def test_stack_with_odd_projection_widths(make):
    """Sizes off the kernels' tiles (a 9-row verify, split 5 + 4; two query heads per kv
    head; a 192-wide MLP, part of one int4 super-block) against the eager layers."""
    model = make(num_key_value_heads=2, num_attention_heads=4, intermediate_size=192)
    steps = [(torch.arange(40, 49).reshape(1, 9).repeat(2, 1), torch.tensor([9, 9]))]
    fused, _ = _run(model, steps, True)
    eager, _ = _run(model, steps, False)
    diff, scale = (fused[0].float() - eager[0].float()).abs(), eager[0].float().abs().max()
    assert diff.max() < 0.05 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stack_is_batch_invariant(dtype):
    """A 4-token pass scores each token bitwise as four one-token steps do, and writes the
    same keys and values: what makes greedy speculation through it equal plain decoding."""
    model = _int4(dtype=dtype)
    tokens = torch.tensor([[31, 32, 33, 34], [41, 42, 43, 44]])
    at_once, cache_a = _run(model, [(tokens, torch.tensor([4, 4]))], True)
    one_by_one, cache_b = _run(
        model, [(tokens[:, i : i + 1], torch.tensor([1, 1])) for i in range(4)], True
    )
    assert torch.equal(at_once[0], torch.cat(one_by_one, dim=1))
    for k_a, k_b in zip(cache_a.k + cache_a.v, cache_b.k + cache_b.v, strict=True):
        assert torch.equal(k_a[:, :, :11], k_b[:, :, :11])


def test_a_prompt_through_the_stack_matches_the_eager_layers_and_its_own_steps():
    """A ragged prefill of 45 and 29 tokens through the stack: each token scored bitwise as
    when the prompt comes a token at a time, and close to the eager layers. The prefill's
    causal mask hides whole blocks of 8 keys from the early tokens (skipped) and parts of
    blocks from the others (scored eight keys at a time); a token at a time, the keys past
    the span end a partial block instead: bitwise equality says hidden keys count as absent
    ones. Against the eager layers only loosely: over a long prompt an int8 near-tie in one
    token's activations reaches every later token through the keys (row 1 of this prompt
    leaves fp32 noise at token 6 after a near-tie at token 3), as it does in eager decoding."""
    model = _int4(dtype=torch.float32)
    for module in model.modules():  # the eager layers' products: the stack's int4 kernel
        if isinstance(module, Linear):
            module.use({b: "q4_native" for b in BUCKETS})
    stack = model.decode_stack
    stack.forced = True  # the stack for every pass, the prefill's too
    prompt = torch.arange(2, 92).reshape(2, 45) % 90
    lengths = torch.tensor([45, 29])

    def prefill(use_stack, step):
        model.decode_stack = stack if use_stack else None
        cache, outs = model.new_cache(2, 64), []
        with torch.inference_mode():
            for t in range(0, 45, step):
                num_new = (lengths - t).clamp(0, step)
                outs.append(model(prompt[:, t : t + step], cache, num_new=num_new).hidden)
        model.decode_stack = stack
        return torch.cat(outs, dim=1)

    fused, eager, stepped = prefill(True, 45), prefill(False, 45), prefill(True, 1)
    for out in (fused, eager, stepped):
        out[1, 29:] = 0  # row 1's padding: meaningless outputs
    assert torch.equal(fused, stepped)
    diff, scale = (fused - eager).abs(), eager.abs().max()
    assert diff.max() < 0.05 * scale


def test_stack_computes_the_same_at_either_tile_prefetch_level():
    """How the tile layout prefetches (into L1 or L2, chosen per machine) changes which
    cache the weights wait in, never a product: the stack's passes agree bitwise."""
    model = _int4()
    if model.layers[0].mlp.gate_up_proj.tiles.numel() == 0:
        pytest.skip("no tile layout in this machine's native build (AVX-512 VNNI)")
    outs = {}
    try:
        for level in native.TILE_PREFETCH_LEVELS:
            native.set_tile_prefetch(level)
            outs[level] = _run(model, STEPS, True)[0]
    finally:
        native.set_tile_prefetch(0)
    for a, b in zip(outs[0], outs[1], strict=True):
        assert torch.equal(a, b)


def test_int4_speculative_greedy_equals_plain_through_the_stack(tokenizer):
    """fp32 greedy speculation with a draft model on an int4 target == plain int4 decoding,
    token for token (every verify pass here has at most 8 rows: all through the stack)."""
    target = _int4()
    draft = _int4(seed=1, num_hidden_layers=1)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = [[5, 17, 42, 8], [60, 3, 3, 9, 12]]
    plain = Engine(target, tokenizer, frozenset()).generate(prompts, params)
    for k in (1, 3):
        factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            drafter_factory=factory,
            acceptor=GreedyAcceptor(),
            window=FixedWindow(k),
        )
        out = engine.generate(prompts, params)
        assert [c.token_ids for c in out] == [c.token_ids for c in plain]


def test_int4_speculative_greedy_equals_plain_through_the_eager_int4_kernel(tokenizer):
    """Without the stack, int4 layers run every row count through the one native int4
    kernel (no dense copy to fall back to): verify passes of 10 and 18 rows (2 sequences,
    k = 4 and 8) score each token as plain's one-row steps do, so greedy speculation gives
    plain's tokens exactly."""
    target = _int4()
    draft = _int4(seed=1, num_hidden_layers=1)
    target.decode_stack = draft.decode_stack = None
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = [[5, 17, 42, 8], [60, 3, 3, 9, 12]]
    plain = Engine(target, tokenizer, frozenset()).generate(prompts, params)
    for k in (4, 8):
        factory = lambda b, length: DraftModelDrafter(draft, 97, 97, b, length)  # noqa: E731
        engine = Engine(
            target,
            tokenizer,
            frozenset(),
            drafter_factory=factory,
            acceptor=GreedyAcceptor(),
            window=FixedWindow(k),
        )
        out = engine.generate(prompts, params)
        assert [c.token_ids for c in out] == [c.token_ids for c in plain]


def test_stack_takes_the_steps_its_plan_gives_the_int4_kernel(monkeypatch):
    model = _int4()
    stack = model.decode_stack
    assert stack.takes(1) and stack.takes(8) and not stack.takes(9)  # no plan: packed max
    probe = model.layers[0].mlp.gate_up_proj
    probe.plan = {1: "q4_native", 2: "q4_native", 4: "linear", 256: "linear"}
    assert stack.takes(2) and not stack.takes(3) and not stack.takes(300)
    monkeypatch.setenv("SPECDEC_FUSED", "0")
    assert DecodeStack.for_model(model) is None


def test_bf16_stack_is_batch_invariant():
    model = _bf16()
    tokens = torch.tensor([[31, 32, 33, 34, 35], [41, 42, 43, 44, 45]])
    at_once, _ = _run(model, [(tokens, torch.tensor([5, 5]))], True)
    one_by_one, _ = _run(
        model, [(tokens[:, i : i + 1], torch.tensor([1, 1])) for i in range(5)], True
    )
    assert torch.equal(at_once[0], torch.cat(one_by_one, dim=1))


def test_bf16_stack_takes_the_steps_its_plan_gives_the_bf16_kernel(monkeypatch):
    """In the tuned mode (`SPECDEC_BF16_INVARIANT=0`); by default a bf16 stack takes every
    pass (tests/unit/test_batch_invariance.py)."""
    monkeypatch.setenv("SPECDEC_BF16_INVARIANT", "0")
    model = _bf16(native_upto=16)
    stack = model.decode_stack
    assert stack.takes(1) and stack.takes(16) and not stack.takes(17)
    for module in model.modules():
        if isinstance(module, Linear):
            module.use({})
    assert not stack.takes(1)  # untuned bf16 layers stay eager
    monkeypatch.delenv("SPECDEC_BF16_INVARIANT")
    invariant = _bf16().decode_stack
    assert invariant.takes(1) and invariant.takes(17) and invariant.takes(2048)


def test_bf16_stack_reads_every_panel_layout_of_the_build(monkeypatch):
    """Each bf16 panel layout the build reads (AVX-512 BF16 builds: the pairs and the fp32
    FMA panels, one chosen per machine by timing) gives the stack the eager layers'
    products, and the products of one layout agree with another's to bf16 rounding."""
    outputs = []
    for layout in native.bf16_panel_layouts():
        monkeypatch.setattr(native, "_panel_layout", layout)
        model = _bf16()
        panels = model.layers[0].mlp.gate_up_proj.formats["native_bf16"]
        assert panels.shape[1:] == (128 // layout[1], layout[0] * layout[1])
        fused, _ = _run(model, STEPS, True)
        eager, _ = _run(model, STEPS, False)
        for a, b in zip(fused, eager, strict=True):
            a, b = a.float()[0], b.float()[0]
            assert ((a - b).abs() <= 2e-2 * b.abs().max()).float().mean() > 0.99
        outputs.append(fused[-1].float()[0])
    for other in outputs[1:]:
        assert ((other - outputs[0]).abs() <= 2e-2 * outputs[0].abs().max()).float().mean() > 0.99


def test_tuning_the_panel_layout_rebuilds_the_stack_on_the_new_panels(tmp_path, monkeypatch):
    """A model loaded in the build's default layout, then timed faster in the other one
    (faked here): `_tuned` re-packs its layers and builds its stack again on the new
    panels, which compute what the eager layers do."""
    from specdec import llm
    from specdec.kernels import tuning

    layouts = native.bf16_panel_layouts()
    if len(layouts) < 2:
        pytest.skip("this build reads one bf16 panel layout")
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_panel_layout", layouts[0])
    model = _bf16()
    before = model.decode_stack
    chosen = {"layout": list(layouts[1]), "seconds": {}, "bytes": 0}
    monkeypatch.setattr(tuning, "measure_bf16_panels", lambda layers: chosen)
    llm._tuned(model)
    assert native.bf16_panel_layout() == layouts[1] and model.decode_stack is not before
    for module in model.modules():
        if isinstance(module, Linear):
            module.use(dict.fromkeys(BUCKETS, "native_bf16"))
            assert module.formats["native_bf16"].shape[1] == module.in_features // layouts[1][1]
    model.decode_stack.measured = {}  # the plans above decide, not the timed passes
    fused, _ = _run(model, STEPS, True)
    eager, _ = _run(model, STEPS, False)
    for a, b in zip(fused, eager, strict=True):
        a, b = a.float()[0], b.float()[0]
        assert ((a - b).abs() <= 2e-2 * b.abs().max()).float().mean() > 0.99


def test_stack_only_for_all_int4_or_bf16_cpu_models():
    dense = native_from_hf(hf_tiny("qwen2"))  # fp32
    assert dense.decode_stack is None and DecodeStack.for_model(dense) is None
    assert quantize(native_from_hf(hf_tiny("qwen2")), "int8").decode_stack is None
    odd = quantize(native_from_hf(hf_tiny("qwen2", hidden_size=96)), "int4")  # K % 64 != 0
    assert odd.decode_stack is None


def test_whole_passes_decide_where_the_stack_runs(tmp_path, monkeypatch):
    """`tune_stack` times whole passes both ways per bucket and the stack takes the
    buckets it won, over what the projections' plans say; the choice is stored per
    machine and model shape, and read back without timing again (in the tuned mode: a
    batch-invariant bf16 stack takes every pass untimed)."""
    from specdec.kernels import decode_stack as ds

    monkeypatch.setenv("SPECDEC_BF16_INVARIANT", "0")
    model = _bf16(native_upto=16)
    stack = model.decode_stack
    cache = tmp_path / "kernels.json"
    ran = []
    real_run = stack.run
    monkeypatch.setattr(stack, "run", lambda *a: ran.append(a[0].shape) or real_run(*a))
    entry = ds.tune_stack(model, cache=cache)
    assert set(entry["plan"]) == {str(b) for b in ds.STACK_BUCKETS}
    seconds = entry["seconds"]
    for bucket, way in entry["plan"].items():  # the plan is the faster way at both ends
        ends = {str(r) for r in (ds.tuning.lowest_rows(int(bucket)), int(bucket))}
        total = {w: sum(seconds[r][w] for r in ends) for w in ("stack", "eager")}
        assert way == min(total, key=total.get)
    assert ran, "the stack was timed"
    assert stack.forced is None

    # A plan the layers' kernels would not give: stack at 1-2 rows, eager at 3-4.
    plan = {str(b): "stack" if b <= 2 else "eager" for b in ds.STACK_BUCKETS}
    stored = ds.tuning.stored_entries("stacks", cache=cache)
    stored[ds.stack_key(model)]["plan"] = plan
    ds.tuning.store(cache, "stacks", stored)
    monkeypatch.setattr(ds, "_measure", lambda *a: pytest.fail("timed again"))
    ds.tune_stack(model, cache=cache)
    assert stack.takes(1) and stack.takes(2) and not stack.takes(3) and not stack.takes(16)
    assert not stack.takes(17)
    probe = model.layers[0].mlp.gate_up_proj  # past the timed buckets: the layers' plan
    probe.plan = {**probe.plan, 256: "native_bf16"}
    assert stack.takes(100)
    probe.plan = {**probe.plan, 256: "linear"}
    ran.clear()
    _run(model, [(torch.tensor([[5], [6]]), torch.tensor([1, 1]))], True)
    _run(model, [(torch.tensor([[5, 6], [7, 8]]), torch.tensor([2, 2]))], True)
    assert ran == [(2, 1, 128)]  # 2 rows ran in the stack, 4 in the eager layers
    # The kernel plans' section survives the stacks' writes, and the reverse.
    ds.tuning.store(cache, "groups", {"g": 1})
    stacks = ds.tuning.stored_entries("stacks", cache=cache)
    assert stacks[ds.stack_key(model)]["plan"] == plan
