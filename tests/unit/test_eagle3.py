"""The EAGLE-3 head: the target's auxiliary states are the layers' inputs, the head's forward
and training-time test equal a direct per-position reference, drafting through its cache
equals whole-sequence passes, and its files are vLLM's layout, round-trip and refuse what
does not fit."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec.drafters.base import PassStates
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.errors import (
    IncompatibleDraftError,
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from specdec.heads.eagle3 import (
    build_eagle3,
    default_aux_layers,
    is_eagle3_dir,
    load_eagle3,
)

from tiny import hf_tiny, native_from_hf

AUX = (0, 2, 3)  # the embedding, a middle layer's input and the last layer's input


@pytest.fixture(scope="module")
def hf():
    return hf_tiny("qwen2", num_hidden_layers=4)


@pytest.fixture(scope="module")
def target(hf):
    return native_from_hf(hf)


def random_head(target, seed=0, vocab_map=None, n_predict=4):
    head = build_eagle3(target, vocab_map, intermediate_size=48, n_predict=n_predict,
                        aux_layer_ids=AUX)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return head.eval()


def aux_states(target, tokens):
    """`[S, 3H]` the target's auxiliary states of a sequence `[S]`."""
    out = target(tokens[None], target.new_cache(1, len(tokens) + 1), aux_layers=AUX)
    return out.aux[0]


# --- a direct reference: vLLM's layer written out position by position --------------------


def _norm(x, w, eps):
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x [heads, D]
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2).float() / D)
    ang = pos * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    rot = torch.cat([-x[:, D // 2 :], x[:, : D // 2]], -1)
    return x * cos + rot * sin


def reference_states(head, tokens_next, hiddens):
    """The head's states s `[T, H]` for entries (token x_{j+1}, hidden g_j or s) with RoPE
    at j: per position, per head, with an explicit softmax."""
    c = head.config
    sd = {k: v.double() for k, v in head.state_dict().items() if v.is_floating_point()}
    eps, G = c.rms_norm_eps, c.num_heads // c.num_kv_heads
    T = len(tokens_next)
    qs, ks, vs, res = [], [], [], []
    for j in range(T):
        g = hiddens[j].double()
        e = _norm(head.embed[tokens_next[j]].double(), sd["midlayer.input_layernorm.weight"], eps)
        h = _norm(g, sd["midlayer.hidden_norm.weight"], eps)
        x = torch.cat([e, h])
        q = (sd["midlayer.self_attn.q_proj.weight"] @ x).view(c.num_heads, c.head_dim)
        k = (sd["midlayer.self_attn.k_proj.weight"] @ x).view(c.num_kv_heads, c.head_dim)
        v = (sd["midlayer.self_attn.v_proj.weight"] @ x).view(c.num_kv_heads, c.head_dim)
        qs.append(_rope(q, j, c.rope_theta))
        ks.append(_rope(k, j, c.rope_theta))
        vs.append(v)
        res.append(g)
    out = []
    for j in range(T):
        heads = []
        for hq in range(c.num_heads):
            kv = hq // G
            scores = torch.stack([qs[j][hq] @ ks[i][kv] for i in range(j + 1)]) / math.sqrt(
                c.head_dim
            )
            w = torch.softmax(scores, 0)
            heads.append(sum(w[i] * vs[i][kv] for i in range(j + 1)))
        r = res[j] + sd["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
        n = _norm(r, sd["midlayer.post_attention_layernorm.weight"], eps)
        gate, up = sd["midlayer.mlp.gate_proj.weight"] @ n, sd["midlayer.mlp.up_proj.weight"] @ n
        m = sd["midlayer.mlp.down_proj.weight"] @ (F.silu(gate) * up)
        out.append(r + m)
    return torch.stack(out)


def reference_logits(head, s):
    sd = head.state_dict()
    return sd["lm_head.weight"].double() @ _norm(
        s.double(), sd["norm.weight"].double(), head.config.rms_norm_eps
    )


def reference_drafts(head, tokens, aux, k):
    """Greedy drafts after `tokens [L+1]` (auxiliary states `[L, 3H]` at all but the last)
    by whole passes: each step appends (the head's state, the drafted token) and reruns."""
    hiddens = list(aux.double() @ head.fc.weight.double().T)
    nexts = tokens[1:].tolist()
    drafts = []
    for _ in range(k):
        s = reference_states(head, nexts, hiddens)[-1]
        d = int(head.vocab_map[reference_logits(head, s).argmax()])
        drafts.append(d)
        hiddens.append(s)
        nexts.append(d)
    return drafts


# --- tests ----------------------------------------------------------------------------


def test_aux_states_are_the_layers_inputs_and_cost_nothing_when_unasked(hf):
    target = native_from_hf(hf)
    tokens = torch.randint(2, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    plain = target(tokens, target.new_cache(2, 16))
    assert plain.aux is None
    out = target(tokens, target.new_cache(2, 16), aux_layers=AUX)
    ref = hf(tokens, output_hidden_states=True).hidden_states  # [i]: the input of layer i
    H = 64
    for n, layer in enumerate(AUX):
        torch.testing.assert_close(out.aux[..., n * H : (n + 1) * H], ref[layer])
    assert torch.equal(out.hidden, plain.hidden) and torch.equal(out.logits, plain.logits)


def test_forward_and_training_time_test_equal_a_direct_reference(target):
    head = random_head(target)
    seq = torch.randint(2, 97, (9,), generator=torch.Generator().manual_seed(1))
    aux = aux_states(target, seq)[:-1]  # [8, 3H]
    T = len(seq) - 1
    with torch.no_grad():
        preds = head.unrolled(seq[None, 1:], aux[None], torch.arange(T)[None], 3)
    g = list(aux.double() @ head.fc.weight.double().T)
    nexts = seq[1:].tolist()
    step1 = reference_states(head, nexts, g)
    torch.testing.assert_close(preds[0][0].double(), step1, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        head.logits(preds[0][0]).double(), torch.stack([reference_logits(head, s) for s in step1]),
        rtol=1e-4, atol=1e-4,
    )  # fmt: skip
    # step s at p: true entries up to p-s+1, then the chain's own states with true tokens
    for s in (2, 3):
        for p in range(s - 1, T):
            newest = p - s + 1
            hiddens = g[: newest + 1]
            for _ in range(s - 1):
                hiddens = hiddens + [reference_states(head, nexts[: len(hiddens)], hiddens)[-1]]
            want = reference_states(head, nexts[: len(hiddens)], hiddens)[-1]
            torch.testing.assert_close(preds[s - 1][0, p].double(), want, rtol=1e-4, atol=1e-4)


def test_drafts_through_the_cache_equal_whole_sequence_passes(target):
    head = random_head(target, vocab_map=torch.tensor([1, 4, 9, 16, 25, 36, 49, 64, 81, 90]))
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(2, 97, (n,), generator=g) for n in (9, 4, 13)]
    aux = [aux_states(target, s) for s in seqs]
    drafter = Eagle3Drafter(head, max_batch=4, max_len=64)
    drafter.admit([s.tolist() for s in seqs])
    lengths = torch.tensor([len(s) - 1 for s in seqs])
    T = int(lengths.max())
    tok = torch.zeros(3, T, dtype=torch.long)
    hid = torch.zeros(3, T, 64)
    ax = torch.zeros(3, T, 192)
    for i, (s, a) in enumerate(zip(seqs, aux, strict=True)):
        tok[i, : len(s) - 1], ax[i, : len(s) - 1] = s[:-1], a[:-1]
    drafter.observe_pass(PassStates(tok, hid, lengths, aux=ax))
    draft = drafter.propose(3, [], [])
    for i, (s, a) in enumerate(zip(seqs, aux, strict=True)):
        assert draft.tokens[i].tolist() == reference_drafts(head, s, a[:-1], 3)
    # a verify pass kept row 0's last token and one accepted draft; rows 1-2 kept none
    accepted, nexts = torch.tensor([1, 0, 0]), torch.tensor([5, 6, 7])
    grown = [
        torch.cat([seqs[0], draft.tokens[0, :1], nexts[:1]]),
        torch.cat([seqs[1], nexts[1:2]]),
        torch.cat([seqs[2], nexts[2:3]]),
    ]
    drafter.commit(accepted, nexts)
    aux = [aux_states(target, s) for s in grown]
    kept = 1 + accepted
    tok = torch.zeros(3, 2, dtype=torch.long)
    ax = torch.zeros(3, 2, 192)
    for i, (s, a) in enumerate(zip(grown, aux, strict=True)):
        n = int(kept[i])
        tok[i, :n], ax[i, :n] = s[-1 - n : -1], a[-1 - n : -1]
    drafter.observe_pass(PassStates(tok, torch.zeros(3, 2, 64), kept, aux=ax))
    draft = drafter.propose(4, [], [])
    for i, (s, a) in enumerate(zip(grown, aux, strict=True)):
        assert draft.tokens[i].tolist() == reference_drafts(head, s, a[:-1], 4)


def test_a_pass_without_aux_states_is_refused(target):
    drafter = Eagle3Drafter(random_head(target), max_batch=2, max_len=16)
    drafter.admit([[3, 4]])
    states = PassStates(torch.tensor([[3]]), torch.zeros(1, 1, 64), torch.tensor([1]))
    with pytest.raises(UnsupportedModelError, match=r"layer inputs \[0, 2, 3\]"):
        drafter.observe_pass(states)


VLLM_TENSORS = {  # vLLM's names and shapes for the tiny target (H 64, 4/2 heads of 16)
    "fc.weight": [64, 192],
    "midlayer.input_layernorm.weight": [64],
    "midlayer.hidden_norm.weight": [64],
    "midlayer.self_attn.q_proj.weight": [64, 128],
    "midlayer.self_attn.k_proj.weight": [32, 128],
    "midlayer.self_attn.v_proj.weight": [32, 128],
    "midlayer.self_attn.o_proj.weight": [64, 64],
    "midlayer.post_attention_layernorm.weight": [64],
    "midlayer.mlp.gate_proj.weight": [48, 64],
    "midlayer.mlp.up_proj.weight": [48, 64],
    "midlayer.mlp.down_proj.weight": [64, 48],
    "norm.weight": [64],
    "lm_head.weight": [10, 64],
    "d2t": [10],
    "t2d": [97],
}


def test_files_are_vllms_layout_and_round_trip(target, tmp_path):
    vocab = torch.tensor([96, 1, 5, 7, 9, 20, 40, 41, 42, 60])  # unsorted: stored sorted
    head = random_head(target, vocab_map=vocab)
    head.save(tmp_path / "h")
    assert is_eagle3_dir(tmp_path / "h") and not is_eagle3_dir(tmp_path)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
    assert config["vocab_size"] == 97 and config["draft_vocab_size"] == 10
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX)
    with safe_open(tmp_path / "h" / "model.safetensors", "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert shapes == VLLM_TENSORS
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    ids = sorted(vocab.tolist())
    assert (torch.arange(10) + d2t).tolist() == ids  # target id = draft id + d2t
    assert t2d.nonzero()[:, 0].tolist() == ids
    loaded = load_eagle3(tmp_path / "h", target)
    x = torch.randint(0, 97, (2, 6))
    a = torch.randn(2, 6, 192)
    pos = torch.arange(6)[None].expand(2, -1)
    with torch.no_grad():
        want = [head.logits(p) for p in head.unrolled(x, a, pos, 2)]
        got = [loaded.logits(p) for p in loaded.unrolled(x, a, pos, 2)]
    assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
    assert loaded.vocab_map.tolist() == ids


def test_a_head_without_a_reduced_vocabulary_or_layer_ids_takes_vllms_defaults(target, tmp_path):
    head = random_head(target)
    head.save(tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    del config["draft_vocab_size"], config["eagle_aux_hidden_state_layer_ids"]
    config["rope_theta"] = None  # transformers 5 writes only rope_parameters
    config["rope_parameters"]["rope_theta"] = 500.0
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "h" / "model.safetensors")
    del tensors["d2t"], tensors["t2d"]
    save_file(tensors, tmp_path / "h" / "model.safetensors")
    deep = native_from_hf(hf_tiny("qwen2", num_hidden_layers=8))
    loaded = load_eagle3(tmp_path / "h", deep)
    assert loaded.config.aux_layer_ids == default_aux_layers(8) == (2, 4, 5)
    assert loaded.vocab_map.tolist() == list(range(97))
    assert loaded.config.rope_theta == 500.0


def _edit(path, tensors=None, config=None):
    if tensors is not None:
        t = load_file(path / "model.safetensors")
        tensors(t)
        save_file(t, path / "model.safetensors")
    if config is not None:
        c = json.loads((path / "config.json").read_text())
        config(c)
        (path / "config.json").write_text(json.dumps(c))


def test_layer_ids_in_another_order_mean_vllms_increasing_order(target, tmp_path):
    # vLLM concatenates the auxiliary states in increasing layer order whatever the config's
    # list says, so a head listing [3, 0, 2] reads the states in order 0, 2, 3 there and here
    head = random_head(target)
    head.save(tmp_path / "h")
    _edit(tmp_path / "h", config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[3, 0, 2]))
    loaded = load_eagle3(tmp_path / "h", target)
    assert loaded.config.aux_layer_ids == AUX
    a = torch.randn(1, 5, 192)
    with torch.no_grad():
        assert torch.equal(loaded.combine(a), head.combine(a))
    with pytest.raises(IncompatibleDraftError, match=r"\[3, 0, 2\] must be in increasing"):
        build_eagle3(target, aux_layer_ids=(3, 0, 2))


def test_repeated_layer_ids_are_refused_at_load_and_build(target, tmp_path):
    # vLLM collects the states of a set of layers: [0, 2, 2] would hand its fc 2 states of 3
    head = random_head(target)
    head.save(tmp_path / "h")
    _edit(tmp_path / "h", config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 0, 2]))
    message = r"\[2, 0, 2\] repeat layer 2: vLLM hands over each layer's state once"
    with pytest.raises(ModelIntegrityError, match=message) as err:
        load_eagle3(tmp_path / "h", target)
    assert "config.json" in str(err.value) and "3 distinct layers" in str(err.value)
    with pytest.raises(InvalidParameterError, match=r"\[0, 2, 2\] repeat layer 2"):
        build_eagle3(target, aux_layer_ids=(0, 2, 2))


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (dict(tensors=lambda t: t.pop("fc.weight")), ModelIntegrityError, "missing: fc.weight"),
        (
            dict(tensors=lambda t: t.update({"fc.weight": torch.zeros(64, 128)})),
            ModelIntegrityError,
            r"fc.weight \[64, 128\] \(expected \[64, 192\]\)",
        ),
        (
            dict(tensors=lambda t: t["d2t"].__setitem__(9, 500)),
            ModelIntegrityError,
            "d2t maps draft id 9 to target id 509, outside the target's vocabulary of 97",
        ),
        (
            dict(tensors=lambda t: t["d2t"].__setitem__(1, -1)),
            ModelIntegrityError,
            "two draft ids to one target id",
        ),
        (
            dict(tensors=lambda t: t["t2d"].__setitem__(1, True)),
            ModelIntegrityError,
            "t2d does not mark",
        ),
        (
            dict(config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 2, 7])),
            IncompatibleDraftError,
            r"\[0, 2, 7\] name layers outside the target's 0..3",
        ),
        (
            dict(config=lambda c: c.update(vocab_size=151936)),
            IncompatibleDraftError,
            r"vocab_size 151936 \(target: 97\)",
        ),
        (
            dict(config=lambda c: c.update(num_hidden_layers=2)),
            ModelIntegrityError,
            "num_hidden_layers 2",
        ),
        (dict(config=lambda c: c.pop("hidden_size")), ModelIntegrityError, "missing hidden_size"),
    ],
    ids=[
        "missing",
        "misshapen",
        "d2t-out-of-range",
        "d2t-twice",
        "t2d",
        "layers",
        "vocab",
        "two-layers",
        "no-hidden-size",
    ],  # fmt: skip
)
def test_what_does_not_fit_is_refused_with_its_name(target, tmp_path, edit, error, message):
    random_head(target, vocab_map=torch.arange(10) * 3).save(tmp_path / "h")
    _edit(tmp_path / "h", **edit)
    with pytest.raises(error, match=message):
        load_eagle3(tmp_path / "h", target)


def test_a_head_for_another_target_is_refused(target, tmp_path):
    random_head(target).save(tmp_path / "h")
    other = native_from_hf(
        hf_tiny("qwen2", num_hidden_layers=4, hidden_size=32, num_attention_heads=2)
    )
    with pytest.raises(IncompatibleDraftError, match=r"hidden_size 64 \(target: 32\)"):
        load_eagle3(tmp_path / "h", other)
    shallow = native_from_hf(hf_tiny("qwen2"))  # 2 layers: layer 3 is not there
    with pytest.raises(IncompatibleDraftError, match="outside the target's 0..1"):
        load_eagle3(tmp_path / "h", shallow)
    with pytest.raises(ModelNotFoundError):
        load_eagle3(tmp_path / "missing", target)
    weights = tmp_path / "h" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelIntegrityError, match="corrupt or truncated"):
        load_eagle3(tmp_path / "h", target)


def test_a_fresh_head_starts_near_uniform_where_the_targets_tables_are_sharp(target):
    """A fresh head scores about ln(N) a token even for a target whose final norm and
    vocabulary head give sharp logits (the Qwen 1.5B's norm weighs ~4.6): it starts from
    not knowing, not from being confidently wrong."""
    import copy

    from specdec.training.losses import eagle3_losses

    sharp = copy.deepcopy(target)
    with torch.no_grad():
        sharp.norm.weight.fill_(5.0)
        sharp.lm_head.weight.mul_(5.0)
    tokens = torch.randint(
        0, sharp.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    aux = torch.stack([aux_states(sharp, row) for row in tokens])  # [2, 24, 3H]
    torch.manual_seed(0)
    head = build_eagle3(sharp, intermediate_size=48, n_predict=3, aux_layer_ids=AUX)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    _, m = eagle3_losses(head, aux, tokens, valid, steps=3)
    uniform = math.log(head.config.draft_vocab_size)
    assert all(loss < uniform + 0.5 for loss in m.loss_per_head), (m.loss_per_head, uniform)


def test_the_drafting_form_quantizes_every_projection_that_takes_the_format(target):
    """`for_drafting("int4")`: each projection whose input width takes 4-bit groups
    (K % 64 == 0; not `down_proj`, K = 48) in 4 bits and near its dense self; "none"
    leaves the head as it is; an unknown format is refused."""
    import copy

    from specdec.kernels.quant import Int4Linear

    head = random_head(target)
    int4 = copy.deepcopy(head).for_drafting("int4")
    attn, mlp = "midlayer.self_attn.", "midlayer.mlp."
    for path in ("fc", "lm_head", *(attn + n for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                 mlp + "gate_proj", mlp + "up_proj"):  # fmt: skip
        layer, reference = int4.get_submodule(path), head.get_submodule(path)
        assert isinstance(layer, Int4Linear), path
        x = torch.randn(5, layer.in_features)
        error = (layer(x) - reference(x)).norm() / reference(x).norm()
        assert error < 0.12, (path, float(error))
    assert not isinstance(int4.get_submodule(mlp + "down_proj"), Int4Linear)
    assert copy.deepcopy(head).for_drafting("none").fc.weight.equal(head.fc.weight)
    with pytest.raises(InvalidParameterError, match="quantization"):
        copy.deepcopy(head).for_drafting("int3")
