"""Fixed-shape passes (`specdec.graphs.static_pass`) on the CPU: the bucket choice, the
padding masks, in-place buffers, and the same logits and cache contents as the eager
`Transformer.forward` for decode, ragged verify, tree verify and padded rows, with the
model's own layers and with the compiled ones (`specdec.graphs.fused_layers`, fp32)."""

import copy
import time

import pytest
import torch

from specdec.graphs.fused_layers import fused_layers_apply
from specdec.graphs.static_pass import (
    Bucket,
    PassBuffers,
    Replay,
    StaticHeads,
    StaticPasses,
    _replay_ms,
    bucket_sizes,
    capture_seconds,
    pick,
    static_mask,
    use_static_passes,
)
from specdec.heads import SpeculatorConfig
from specdec.heads.mlp import MLPSpeculator
from specdec.kernels.quantize import quantize

from tiny import hf_tiny, native_from_hf

MAX_LEN = 48


@pytest.fixture(scope="module", params=["qwen2", "mistral"])  # mistral: a sliding window
def model(request):
    overrides = {"sliding_window": 6} if request.param == "mistral" else {}
    return native_from_hf(hf_tiny(request.param, **overrides))


def test_bucket_sizes_are_powers_of_two_then_the_limit():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(6) == (1, 2, 4, 6)
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(48, 16) == (16, 32, 48)
    assert bucket_sizes(10, 16) == (10,)


def test_pick_takes_the_smallest_bucket_that_fits():
    sizes = (1, 2, 4, 6)
    assert [pick(sizes, n) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError):
        pick(sizes, 7)


def test_defaults_static_and_graphs_only_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert use_static_passes(cpu, None, None) == (False, False)
    assert use_static_passes(cpu, None, True) == (False, False)  # ignored on the CPU
    assert use_static_passes(cpu, True, None) == (True, False)
    assert use_static_passes(cuda, None, None) == (True, True)
    assert use_static_passes(cuda, None, False) == (False, False)  # --no-cuda-graphs: eager
    assert use_static_passes(cuda, True, False) == (True, False)


def test_passes_bucket_rows_tokens_and_span(model):
    passes = StaticPasses(model, model.new_cache(6, MAX_LEN), 5, 9, min_span=16)
    assert passes.row_sizes == (1, 2, 4, 5)
    assert passes.token_sizes == (1, 2, 4, 8, 9)
    assert passes.span_sizes == (16, 32, 48)
    assert passes.bucket(3, 5, 17, 0) == Bucket(4, 8, 32, 0)
    assert passes.bucket(5, 1, 3, 1) == Bucket(5, 1, 16, 1)


def test_static_mask_matches_the_eager_masks_on_real_queries():
    lengths = torch.tensor([3, 0, 5])
    num_new = torch.tensor([2, 4, 1])
    T, span = 4, 12
    offsets = torch.arange(T).repeat(3, 1)
    visible = torch.ones(T, T, dtype=torch.bool).tril().repeat(3, 1, 1)
    got = static_mask(lengths, num_new, offsets, visible, span, window=None)[:, 0]
    keys = torch.arange(span)
    positions = lengths[:, None] + offsets
    causal = keys[None, None, :] <= positions[:, :, None]  # [B, T, S] the eager rule
    for b in range(3):
        n = int(num_new[b])
        assert torch.equal(got[b, :n], causal[b, :n]), b
        # padding queries see key 0 only (never an empty row)
        assert torch.equal(got[b, n:], (keys == 0).expand(T - n, -1)), b


def test_static_mask_sliding_window():
    lengths, num_new = torch.tensor([7]), torch.tensor([2])
    offsets = torch.arange(2)[None]
    visible = torch.ones(2, 2, dtype=torch.bool).tril()[None]
    got = static_mask(lengths, num_new, offsets, visible, 10, window=3)[0, 0]
    # query at position 7 sees 5, 6, 7; query at 8 sees 6, 7, 8
    assert got[0].nonzero().flatten().tolist() == [5, 6, 7]
    assert got[1].nonzero().flatten().tolist() == [6, 7, 8]


def _prefill(model, cache, prompts):
    for row, prompt in enumerate(prompts):
        model(torch.tensor([prompt]), cache, first_row=row)


PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 3, 3, 9, 12, 80, 81, 2, 44], [33]]


def _pair(model, rows=4):
    """An eager and a static cache, both prefilled with PROMPTS."""
    eager, static = model.new_cache(rows, MAX_LEN), model.new_cache(rows, MAX_LEN)
    _prefill(model, eager, PROMPTS)
    _prefill(model, static, PROMPTS)
    return eager, static


def _assert_same_cache(a, b, rows):
    assert torch.equal(a.lengths[:rows], b.lengths[:rows])
    for ka, kb, va, vb in zip(a.k, b.k, a.v, b.v, strict=True):
        for row in range(rows):
            n = int(a.lengths[row])
            torch.testing.assert_close(kb[row, :, :n], ka[row, :, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(vb[row, :, :n], va[row, :, :n], atol=1e-5, rtol=1e-5)


@torch.inference_mode()
@pytest.mark.parametrize("fuse", [False, True], ids=["model layers", "fused layers"])
def test_decode_and_ragged_verify_equal_eager(model, fuse):
    eager, static = _pair(model)
    passes = StaticPasses(model, static, 4, 6, min_span=16, fuse=fuse)
    calls = [
        (torch.tensor([[7], [8], [9]]), None),  # decode: one token per row
        (torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([4, 2, 1])),
        (torch.tensor([[3, 4, 5, 6, 7]] * 3), torch.tensor([5, 5, 3])),  # crosses span 16
        (torch.tensor([[1], [2]]), None),  # a row left: padding rows 2..3 are free rows
    ]
    for tokens, num_new in calls:
        B = tokens.shape[0]
        want = model(tokens, eager, num_new=num_new)
        got = passes(tokens, static, num_new=num_new)
        assert got.logits.shape == want.logits.shape and got.hidden.shape == want.hidden.shape
        n = torch.full((B,), tokens.shape[1]) if num_new is None else num_new
        for b in range(B):  # real positions only: padded tokens' outputs are meaningless
            k = int(n[b])
            torch.testing.assert_close(got.logits[b, :k], want.logits[b, :k], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got.hidden[b, :k], want.hidden[b, :k], atol=1e-4, rtol=1e-4)
        _assert_same_cache(eager, static, B)
        eager.truncate(eager.lengths[:B] - 1)  # roll back like a rejected draft
        static.truncate(static.lengths[:B] - 1)
    assert set(passes.stacks.values()) == {"fused" if fuse else "eager"}


@torch.inference_mode()
def test_logits_at_equals_eager(model):
    eager, static = _pair(model)
    passes = StaticPasses(model, static, 4, 2, min_span=16)
    tokens, num_new = torch.tensor([[4, 5], [6, 0], [7, 8]]), torch.tensor([2, 1, 2])
    at = (num_new - 1)[:, None]
    want = model(tokens, eager, num_new=num_new, logits_at=at)
    got = passes(tokens, static, num_new=num_new, logits_at=at)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("fuse", [False, True], ids=["model layers", "fused layers"])
def test_tree_verify_equals_eager(model, fuse):
    eager, static = _pair(model)
    passes = StaticPasses(model, static, 4, 6, min_span=16, fuse=fuse)
    # root + 3 nodes: 0 -> {1, 2}, 1 -> 3; row 1 has only root + 1 node
    offsets = torch.tensor([[0, 1, 1, 2], [0, 1, 1, 2], [0, 1, 2, 3]])
    visible = torch.zeros(3, 4, 4, dtype=torch.bool)
    for b in range(3):
        visible[b] = torch.eye(4, dtype=torch.bool)
        visible[b, :, 0] = True
    visible[:2, 3, 1] = True
    visible[2] = torch.ones(4, 4, dtype=torch.bool).tril()
    num_new = torch.tensor([4, 2, 4])
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    want = model(tokens, eager, num_new=num_new, tree=(offsets, visible))
    got = passes(tokens, static, num_new=num_new, tree=(offsets, visible))
    for b in range(3):
        k = int(num_new[b])
        torch.testing.assert_close(got.logits[b, :k], want.logits[b, :k], atol=1e-4, rtol=1e-4)
    _assert_same_cache(eager, static, 3)


@torch.inference_mode()
def test_padding_never_writes_real_slots_and_buffers_stay_in_place(model):
    """Padding tokens and padding rows write only the scratch slot; repeated calls of one
    bucket reuse the same buffers (updated in place, as a CUDA graph needs)."""
    cache = model.new_cache(4, MAX_LEN)
    _prefill(model, cache, PROMPTS)
    for k in cache.k:
        k[3].fill_(7.0)  # a free row, as padding row 3 of a 4-row bucket
    before = [k.clone() for k in cache.k]
    passes = StaticPasses(model, cache, 4, 4, min_span=16)
    tokens, num_new = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), torch.tensor([3, 1, 2])
    start = cache.lengths[:3].clone()
    passes(tokens, cache, num_new=num_new)
    buffers, _ = passes._passes[passes.bucket(3, 3, 14, 0)]
    pointers = [t.data_ptr() for t in (buffers.tokens, buffers.slots, buffers.visible)]
    scratch = cache.scratch_slot
    for old, new in zip(before, cache.k, strict=True):
        for row in range(3):  # only slots start .. start + num_new (and scratch) changed
            changed = (old[row] != new[row]).any(-1).any(0).nonzero().flatten().tolist()
            real = set(range(int(start[row]), int(start[row] + num_new[row])))
            assert set(changed) <= real | {scratch}, (row, changed)
        changed = (old[3] != new[3]).any(-1).any(0).nonzero().flatten().tolist()
        assert set(changed) <= {scratch}
    cache.truncate(start)
    passes(tokens + 1, cache, num_new=num_new)
    buffers2, _ = passes._passes[passes.bucket(3, 3, 14, 0)]
    assert buffers2 is buffers
    assert [t.data_ptr() for t in (buffers.tokens, buffers.slots, buffers.visible)] == pointers
    assert buffers.tokens[:3, :3].tolist() == (tokens + 1).tolist()


def test_static_passes_refuse_another_cache_or_too_many_rows(model):
    cache = model.new_cache(2, MAX_LEN)
    with pytest.raises(ValueError):
        StaticPasses(model, cache, 3, 2)
    passes = StaticPasses(model, cache, 2, 2)
    with pytest.raises(ValueError):
        passes(torch.tensor([[1]]), model.new_cache(2, MAX_LEN))
    with pytest.raises(ValueError):
        StaticPasses(model, cache, 2, 2, graphs=True)  # graphs need CUDA


@torch.inference_mode()
def test_static_heads_equal_eager_heads():
    torch.manual_seed(0)
    heads = MLPSpeculator(SpeculatorConfig(3, 64, 64, 97, 97)).eval()
    hidden, last = torch.randn(6, 64), torch.randint(0, 97, (6,))
    static = StaticHeads(heads, hidden, last)
    assert static.row_sizes == (1, 2, 4, 6)
    for rows in (1, 3, 6):
        want = heads.propose_greedy(hidden[:rows], last[:rows], 3)
        assert torch.equal(static.propose_greedy(rows, 3), want)
        paths, scores = heads.propose_tree(hidden[:rows], last[:rows], (2, 2))
        got_paths, got_scores = static.propose_tree(rows, (2, 2))
        assert torch.equal(got_paths, paths)
        torch.testing.assert_close(got_scores, scores)
    hidden[0] += 1.0  # updated in place by the drafter: the next pass reads it
    want = heads.propose_greedy(hidden[:1], last[:1], 2)
    assert torch.equal(static.propose_greedy(1, 2), want)


def test_cost_measurements_time_the_static_passes(model):
    """The benchmarks' verify curve and draft step can time the passes an engine with
    static passes runs (CUDA graphs on a GPU): same shapes, positive times."""
    from specdec.bench.costs import forward_seconds, measure_costs

    times = forward_seconds(model, 2, (1, 3), 10, repeats=1, static_passes=True)
    assert set(times) == {1, 3} and all(t > 0 for t in times.values())
    costs = measure_costs(model, model, 2, 10, (0, 2), repeats=1, static_passes=True)
    assert costs["c"] > 0 and set(costs["v"]) == {"0", "2"}


@torch.inference_mode()
def test_nothing_is_captured_on_the_cpu(model):
    """The eager static path never captures, so the engine's step timings are untouched."""
    before = capture_seconds()
    cache = model.new_cache(2, MAX_LEN)
    passes = StaticPasses(model, cache, 2, 2)
    passes(torch.tensor([[1, 2], [3, 4]]), cache)
    assert all(replay.graph is None for _, replay in passes._passes.values())
    assert capture_seconds() == before


@torch.inference_mode()
def test_graph_outputs_are_shared_across_spans(model):
    """With graphs, a pass writes its outputs into tensors kept per (rows, tokens,
    logits), shared by every span bucket (checked here on `_forward` directly, which a
    CUDA graph captures): the logits of a verify are too large to keep one per graph."""
    cache = model.new_cache(2, MAX_LEN)
    passes = StaticPasses(model, cache, 2, 2, min_span=16)
    passes.graphs = True  # what a CUDA graph would capture; no capture on the CPU
    outs = []
    for span in (16, 32):
        buffers = PassBuffers(Bucket(2, 2, span, 0), model.device, cache.scratch_slot)
        outs.append(passes._forward(buffers))
    assert outs[0][0] is outs[1][0] and outs[0][1] is outs[1][1]
    assert outs[0][0].shape == (2, 2, model.config.vocab_size)


def test_fused_layers_run_only_on_dense_layers_and_by_default_only_with_graphs(model):
    """Quantized layers have their own kernels: the fused stack (plain `F.linear`) would
    compute another model. Without graphs the default is the model's own layers."""
    assert fused_layers_apply(model)
    cache = model.new_cache(2, MAX_LEN)
    assert not StaticPasses(model, cache, 2, 2).fuse
    assert StaticPasses(model, cache, 2, 2, fuse=True).fuse
    int4 = quantize(copy.deepcopy(model), "int4") if model.config.hidden_size % 64 == 0 else None
    if int4 is not None:
        assert not fused_layers_apply(int4)
        assert not StaticPasses(int4, int4.new_cache(2, MAX_LEN), 2, 2, fuse=True).fuse


def test_the_faster_replay_wins():
    """Two layer stacks race per bucket; the one whose replays take less time is kept."""
    fast = Replay(lambda: None, graphs=False)
    slow = Replay(lambda: time.sleep(0.002), graphs=False)
    times = _replay_ms({"fused": slow, "eager": fast})
    assert set(times) == {"fused", "eager"} and times["eager"] < 1 < 2 <= times["fused"]


@torch.inference_mode()
def test_a_race_decides_once_per_model(model):
    """With graphs (on CUDA) the first bucket races the stacks and records the winner as
    the model's `layer_stack`; every later pass of the model runs it, so its rounding is
    the same in every bucket. The race is forced here on the CPU, where it runs the
    buffers eagerly."""
    model.layer_stack = None
    first_cache, second_cache = model.new_cache(4, MAX_LEN), model.new_cache(4, MAX_LEN)
    first = StaticPasses(model, first_cache, 4, 6)
    first.fuse = first.race = True  # what graphs set on CUDA
    assert set(first._stacks()) == {"fused", "eager"}
    first(torch.tensor([[1], [2], [3]]), first_cache)
    chosen = model.layer_stack
    assert first.stacks == {first.bucket(3, 1, 1, 0): chosen}
    assert set(first.race_ms) == {"fused", "eager"}
    assert chosen == min(first.race_ms, key=first.race_ms.get)
    second = StaticPasses(model, second_cache, 4, 6)
    second.fuse = second.race = True
    second(torch.tensor([[1, 2, 3, 4]] * 3), second_cache)
    assert set(second.stacks.values()) == {chosen} and set(second._stacks()) == {chosen}
    model.layer_stack = None


@torch.inference_mode()
@pytest.mark.parametrize("fuse", [False, True], ids=["model layers", "fused layers"])
def test_bf16_passes_score_a_token_the_same_whatever_their_width(fuse):
    """Five 1-token passes and one 5-token pass give bitwise the same bf16 logits, so a
    model drafting for itself (1-2 token steps) agrees with its own verify passes. The
    fused stack broke this until it kept every cast the eager code makes (inductor held
    some bf16 intermediates in fp32, differently per shape); on an H200 the symptom was
    a self-drafting bf16 engine rejecting its own drafts."""
    hf = hf_tiny("llama")
    model = native_from_hf(hf, torch.bfloat16)
    caches = model.new_cache(1, MAX_LEN), model.new_cache(1, MAX_LEN)
    for cache in caches:
        model(torch.tensor([[5, 17, 42, 8, 9, 10]]), cache)
    narrow = StaticPasses(model, caches[0], 1, 5, min_span=16, fuse=fuse)
    wide = StaticPasses(model, caches[1], 1, 5, min_span=16, fuse=fuse)
    tokens = [11, 12, 13, 14, 15]
    one_by_one = torch.stack([narrow(torch.tensor([[t]]), caches[0]).logits[0, 0] for t in tokens])
    at_once = wide(torch.tensor([tokens]), caches[1]).logits[0]
    assert torch.equal(one_by_one, at_once)


@torch.inference_mode()
def test_a_stack_that_fails_to_compile_leaves_the_model_own_layers(model, monkeypatch):
    """A compiler failure in a race (or later, in a bucket of a model whose race chose
    the fused stack) is a warning: the model's own layers run that bucket."""
    from specdec.graphs import static_pass

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(static_pass, "run_fused_layers", broken)
    for chosen in (None, "fused"):
        model.layer_stack = chosen
        cache = model.new_cache(2, MAX_LEN)
        passes = StaticPasses(model, cache, 2, 2)
        passes.fuse = passes.race = True  # what graphs set on CUDA
        with pytest.warns(UserWarning, match="fused layers failed"):
            out = passes(torch.tensor([[1], [2]]), cache)
        assert set(passes.stacks.values()) == {"eager"} and out.logits.shape[:2] == (2, 1)
        # A race that lost every compiled stack settles the model on its own layers; a
        # model that had settled on the fused ones keeps them for its other buckets.
        assert model.layer_stack == ("eager" if chosen is None else "fused")
    model.layer_stack = None


@torch.inference_mode()
def test_running_out_of_memory_is_no_compiler_failure(model, monkeypatch):
    from specdec.graphs import static_pass

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(static_pass, "run_fused_layers", out_of_memory)
    model.layer_stack = None
    cache = model.new_cache(2, MAX_LEN)
    passes = StaticPasses(model, cache, 2, 2)
    passes.fuse = passes.race = True
    with pytest.raises(torch.OutOfMemoryError):
        passes(torch.tensor([[1], [2]]), cache)
    model.layer_stack = None


@torch.inference_mode()
def test_a_bucket_alternating_chains_and_trees_equals_eager(model):
    """A chain's positions and visibility are constants a bucket holds between calls; a
    tree overwrites them and the next chain must restore them."""
    eager, static = _pair(model)
    passes = StaticPasses(model, static, 4, 6, min_span=16)
    offsets = torch.tensor([[0, 1, 1, 2]] * 3)  # root, two children, a grandchild of 1
    visible = torch.eye(4, dtype=torch.bool).repeat(3, 1, 1)
    visible[:, :, 0] = True
    visible[:, 3, 1] = True
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    for tree in (None, (offsets, visible), None, (offsets, visible), None):
        want = model(tokens, eager, tree=tree)
        got = passes(tokens, static, tree=tree)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        eager.truncate(eager.lengths[:3] - 4)
        static.truncate(static.lengths[:3] - 4)
    assert len(passes._passes) == 1
