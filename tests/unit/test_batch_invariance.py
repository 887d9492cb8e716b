"""bf16 batch invariance: a row's logits do not depend on how many rows share its pass.

A verify pass of k tokens must score each token bitwise as k one-token steps do, a batched
step each row as that row alone, and a prompt prefilled in one pass as in chunks or beside
other prompts: what makes greedy bf16 speculation emit plain decoding's tokens and a busy
server a request's alone-output (`kernels.invariance`). Models are built as a load builds
them (the decode stack where it applies) with the plans this CPU's class is predicted to
keep (`kernel_plans`), at tiny widths and at the 0.5B's (896 wide, 4864 intermediate,
heads of 64): the kernels a real layer takes, not only a tiny one's.
"""

import pytest
import torch

from specdec.kernels import kernel_plans, native
from specdec.kernels.linear import Linear, pack_panels
from specdec.kernels.quantize import quantize

from tiny import hf_tiny, native_from_hf

pytestmark = pytest.mark.usefixtures("invariant_native_kernels")


SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=256),
    "0.5B-wide": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        num_hidden_layers=2,
    ),
}


def bf16_model(shape="tiny", seed=0):
    """A bf16 model as a CPU load makes it: the decode stack where it applies, and every
    projection and the stack on the plans predicted for this CPU."""
    model = quantize(
        native_from_hf(hf_tiny("qwen2", seed=seed, **SHAPES[shape]), torch.bfloat16), "none"
    )
    for module in model.modules():
        if isinstance(module, Linear):
            module.use(kernel_plans.predicted_plan(module))
    stack = model.decode_stack
    if stack is not None:
        stack.measured = {
            int(b): way == "stack" for b, way in kernel_plans.predicted_stack("bf16").items()
        }
    return model


def _logits(model, cache, passes):
    """Logits [B, T, V] of each pass (tokens [B, T], num_new [B]) in turn, one tensor
    per pass."""
    with torch.inference_mode():
        return [model(t, cache, num_new=n).logits for t, n in passes]


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("k", [5, 9, 17])  # a verify pass of each stack and plan bucket
def test_a_verify_pass_scores_each_token_as_one_token_steps_do(shape, k):
    model = bf16_model(shape)
    new = torch.arange(10, 10 + k)[None] % 90
    prompt = (torch.tensor([PROMPT[:9]]), torch.tensor([9]))

    at_once_cache = model.new_cache(1, 64)
    at_once = _logits(model, at_once_cache, [prompt, (new, torch.tensor([k]))])[1]
    steps_cache = model.new_cache(1, 64)
    one_by_one = _logits(
        model, steps_cache, [prompt] + [(new[:, i : i + 1], torch.tensor([1])) for i in range(k)]
    )[1:]
    assert torch.equal(at_once, torch.cat(one_by_one, dim=1))
    for a, b in zip(at_once_cache.k + at_once_cache.v, steps_cache.k + steps_cache.v, strict=True):
        assert torch.equal(a[:, :, : 9 + k], b[:, :, : 9 + k])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("threads", [1, 2])  # the products and attention split by threads
def test_each_row_of_a_batch_scores_as_the_row_alone(shape, threads):
    """Three prompts of different lengths prefilled in one ragged pass, then two verify-
    shaped passes of 4 tokens and a one-token step: each row's logits bitwise those of
    the same prompt and tokens alone."""
    torch.set_num_threads(threads)  # the suite's fixture sets 1 again for the next test
    model = bf16_model(shape)
    prompts = [PROMPT, PROMPT[3:10], PROMPT[5:18]]
    follow = [[list(range(b, b + 4)), list(range(b + 4, b + 8)), [b + 8]] for b in (40, 50, 60)]

    def passes(rows):
        lengths = [len(prompts[r]) for r in rows]
        tokens = torch.zeros(len(rows), max(lengths), dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, : lengths[i]] = torch.tensor(prompts[r])
        out = [(tokens, torch.tensor(lengths))]
        for step in range(3):
            t = torch.tensor([follow[r][step] for r in rows])
            out.append((t, torch.full((len(rows),), t.shape[1])))
        return out

    batched = _logits(model, model.new_cache(3, 64), passes([0, 1, 2]))
    for r in range(3):
        alone = _logits(model, model.new_cache(1, 64), passes([r]))
        n = len(prompts[r])
        assert torch.equal(batched[0][r, :n], alone[0][0, :n]), f"prefill, row {r}"
        for step in range(1, 4):
            assert torch.equal(batched[step][r], alone[step][0]), f"pass {step}, row {r}"


def test_a_prompt_scores_the_same_in_one_pass_or_in_chunks():
    """A 70-token prompt (a prefill bucket of its own) in one pass, and in passes of 16:
    the same logits at every position, and the same next steps."""
    model = bf16_model("tiny")
    prompt = torch.arange(70)[None] % 90 + 2
    whole = _logits(model, model.new_cache(1, 96), [(prompt, torch.tensor([70]))])[0]
    cache = model.new_cache(1, 96)
    chunks = _logits(model, cache, [(prompt[:, s : s + 16], None) for s in range(0, 70, 16)])
    assert torch.equal(whole, torch.cat(chunks, dim=1))


@pytest.mark.parametrize("layout", ["rows", "panels"])
def test_the_native_bf16_kernel_gives_each_row_the_floats_it_gives_it_alone(layout):
    """A real layer's shape (1536 x 1536) and an odd one (N = 1003, K = 1536), 1 to 40 rows
    and a prefill's 130: every row bitwise as in a one-row product, and within fp32
    rounding of a float64 reference."""
    gemv = native.bf16_gemv()
    torch.manual_seed(0)
    for n in (1536, 1003):
        w = (torch.randn(n, 1536) * 0.05).bfloat16()
        panels = pack_panels(w, native.bf16_panel_width(), native.bf16_panel_kstep())
        fmt = panels if layout == "panels" else None
        x = torch.randn(130, 1536).bfloat16().float()  # bf16 activations, as a model's
        alone = torch.cat([gemv(x[r : r + 1], w, fmt) for r in range(x.shape[0])])
        reference = x.double() @ w.double().T
        bound = 1536 * 2**-23 * (x.double().abs() @ w.double().abs().T)  # K eps |x||w|
        for rows in (*range(1, 17), 24, 33, 40, 130):
            out = gemv(x[:rows], w, fmt)
            assert torch.equal(out, alone[:rows]), f"{rows} rows, N = {n}"
            assert ((out.double() - reference[:rows]).abs() <= bound[:rows]).all()


def test_bf16_plans_choose_only_the_invariant_kernel_and_can_be_turned_off(monkeypatch):
    """In a real layer's shape, every bucket (steps, verify passes, prefills) plans the
    native kernel; with `SPECDEC_BF16_INVARIANT=0` the tuned candidates are back."""
    layer = Linear(1536, 1536, bias=False).to(torch.bfloat16)
    assert layer.invariant() and list(layer.candidates()) == ["native_bf16"]
    assert set(kernel_plans.predicted_plan(layer).values()) == {"native_bf16"}
    model = bf16_model("tiny")
    assert model.decode_stack.invariant and model.decode_stack.takes(300)
    monkeypatch.setenv("SPECDEC_BF16_INVARIANT", "0")
    assert not layer.invariant() and len(layer.candidates()) > 1
    assert not bf16_model("tiny").decode_stack.takes(300)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_dropping_the_rows_after_packing_keeps_every_logit_and_frees_a_copy(shape, monkeypatch):
    """A bf16 model's decoder projections compute from their panels alone: a model built as
    a load builds it holds no rows beside them (the vocabulary head keeps its own), and a
    prefill, a verify pass and a step give the logits bitwise that the model with its rows
    kept gives, in one copy fewer; packing another kernel's format from them is refused."""
    import specdec.kernels.quantize as quant
    from specdec.kernels.linear import drop_unread_rows
    from specdec.models.footprint import resident_bytes

    with monkeypatch.context() as keep:
        keep.setattr(quant, "drop_unread_rows", lambda model: 0)
        model = bf16_model(shape)  # rows and panels, as loads kept them
    passes = [
        (torch.tensor([PROMPT]), torch.tensor([len(PROMPT)])),
        (torch.arange(30, 35)[None], torch.tensor([5])),
        (torch.tensor([[7]]), torch.tensor([1])),
    ]
    before, held = _logits(model, model.new_cache(1, 64), passes), resident_bytes(model)
    freed = drop_unread_rows(model)
    quant.with_decode_stack(model)
    projections = [m for layer in model.layers for m in layer.modules() if type(m) is Linear]
    assert freed == sum(m.weight.numel() * 2 for m in projections) > 0
    assert all(m.rows_dropped() for m in projections) and not model.lm_head.rows_dropped()
    assert resident_bytes(model) <= held - freed + 4096
    after = _logits(model, model.new_cache(1, 64), passes)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    built = bf16_model(shape)  # as a load builds it: the rows go as the panels are packed
    built_projections = [m for layer in built.layers for m in layer.modules() if type(m) is Linear]
    assert all(m.rows_dropped() for m in built_projections) and not built.lm_head.rows_dropped()
    rebuilt = _logits(built, built.new_cache(1, 64), passes)
    assert all(torch.equal(a, b) for a, b in zip(before, rebuilt, strict=True))
    layer = projections[0]
    with torch.inference_mode():  # untuned calls too: the panels, never the placeholder
        x = torch.randn(3, layer.in_features).bfloat16()
        assert torch.equal(layer.default(x), layer(x))
    assert list(layer.kernels()) == ["native_bf16"]
    with pytest.raises(RuntimeError, match="dropped"):
        layer.prepare("fp32_panels")


def test_panels_unpack_to_their_rows_and_repack_in_another_layout():
    """Rows dropped are not lost: `rows()` unpacks them from the panels bit for bit, so a
    layer re-packs in another layout (a machine that times its layouts after the load)."""
    from specdec.kernels.linear import unpack_panels

    torch.manual_seed(0)
    weight = torch.randn(37, 64).bfloat16()  # 37 outputs: a partial last panel
    for width, kstep in [(8, 1), (16, 2), (32, 1)]:
        panels = pack_panels(weight, width, kstep)
        assert torch.equal(unpack_panels(panels, 37, 64), weight)
    layer = Linear.over(weight.clone())
    layer.prepare("native_bf16")
    assert layer.drop_rows() and layer.rows_dropped()
    assert torch.equal(layer.rows(), weight)
    layouts = native.bf16_panel_layouts()
    other = next((lay for lay in layouts if lay != native.bf16_panel_layout()), None)
    if other is None:
        pytest.skip(f"this build reads one panel layout ({layouts[0]})")
    was = native.bf16_panel_layout()
    try:
        native.set_bf16_panel_layout(other)
        assert layer.repack_panels()
        assert torch.equal(layer.formats["native_bf16"], pack_panels(weight, *other))
    finally:
        native.set_bf16_panel_layout(was)
