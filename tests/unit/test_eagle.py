"""The eagle head: drafting through its cache computes what whole sequences compute, its
files round-trip and refuse what does not fit, and it learns."""

import json

import pytest
import torch
import torch.nn.functional as F

from specdec.drafters.base import PassStates
from specdec.drafters.eagle import EagleDrafter
from specdec.errors import (
    IncompatibleDraftError,
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
)
from specdec.heads.eagle import EagleConfig, build_eagle, is_eagle_dir, load_eagle
from specdec.heads.eagle3 import Eagle3Config
from specdec.training.target import TargetStates

from tiny import hf_tiny, native_from_hf


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2"))


def random_head(target, seed=0, vocab_map=None):
    """A head far from its identity start, so every block matters."""
    head = build_eagle(target, vocab_map=vocab_map, intermediate_size=48, n_predict=4)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return head.eval()


def reference_drafts(head, tokens, states, k):
    """Greedy drafts after `tokens [L+1]` (states `[L, E]` at all but the last) by whole
    causal passes: each step appends (the predicted state, the drafted token) and reruns."""
    feats, nexts = states, tokens[1:]
    drafts = []
    for _ in range(k):
        positions = torch.arange(len(nexts))[None]
        f = head.teacher_forced(nexts[None], feats[None], positions)[0, -1]
        d = int(head.vocab_map[head.logits(f).argmax()])
        drafts.append(d)
        feats = torch.cat([feats, f[None]])
        nexts = torch.cat([nexts, torch.tensor([d])])
    return drafts


def test_drafts_through_the_cache_equal_whole_sequence_passes(target):
    head = random_head(target)
    states_of = TargetStates(target)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(2, 97, (n,), generator=g) for n in (9, 4, 13)]
    drafter = EagleDrafter(head, max_batch=4, max_len=64)
    drafter.admit([s.tolist() for s in seqs])
    hidden = [states_of(s[None])[0] for s in seqs]  # [S, E]: every position's state
    # a prefill kept all positions but each row's last (its token was just sampled)
    lengths = torch.tensor([len(s) - 1 for s in seqs])
    T, E = int(lengths.max()), hidden[0].shape[-1]
    tok = torch.zeros(3, T, dtype=torch.long)
    hid = torch.zeros(3, T, E)
    for i, (s, h) in enumerate(zip(seqs, hidden, strict=True)):
        tok[i, : len(s) - 1], hid[i, : len(s) - 1] = s[:-1], h[:-1]
    drafter.observe_pass(PassStates(tok, hid, lengths))
    draft = drafter.propose(3, [], [])
    for i, (s, h) in enumerate(zip(seqs, hidden, strict=True)):
        assert draft.tokens[i].tolist() == reference_drafts(head, s, h[:-1], 3)
    # a verify pass kept row 0's last token and one accepted draft; rows 1-2 kept none
    accepted = torch.tensor([1, 0, 0])
    nexts = torch.tensor([5, 6, 7])
    grown = [
        torch.cat([seqs[0], draft.tokens[0, :1], nexts[:1]]),
        torch.cat([seqs[1], nexts[1:2]]),
        torch.cat([seqs[2], nexts[2:3]]),
    ]
    drafter.commit(accepted, nexts)
    hidden = [states_of(s[None])[0] for s in grown]
    kept = 1 + accepted
    tok = torch.zeros(3, 2, dtype=torch.long)
    hid = torch.zeros(3, 2, E)
    for i, (s, h) in enumerate(zip(grown, hidden, strict=True)):
        n = int(kept[i])
        tok[i, :n], hid[i, :n] = s[-1 - n : -1], h[-1 - n : -1]
    drafter.observe_pass(PassStates(tok, hid, kept))
    draft = drafter.propose(4, [], [])
    for i, (s, h) in enumerate(zip(grown, hidden, strict=True)):
        assert draft.tokens[i].tolist() == reference_drafts(head, s, h[:-1], 4)
    assert draft.probs is None  # deterministic: q is one-hot


def test_steps_without_drafting_queue_states_and_a_moved_row_keeps_its_cache(target):
    head = random_head(target, seed=2)
    states_of = TargetStates(target)
    seq = torch.randint(2, 97, (12,), generator=torch.Generator().manual_seed(3))
    hidden = states_of(seq[None])[0]
    drafter = EagleDrafter(head, max_batch=3, max_len=64)
    drafter.admit([[9, 9], [4, 4], seq[:6].tolist()])
    E = hidden.shape[-1]
    drafter.observe_pass(PassStates(seq[None, :5], hidden[None, :5], torch.tensor([5]), 2))
    drafter.observe_pass(
        PassStates(torch.ones(2, 1, dtype=torch.long), torch.randn(2, 1, E), torch.tensor([1, 1]))
    )
    drafter.propose(2, [], [])  # catches row 2 up on its five entries
    assert drafter.last_catch_up[0] == 3
    # that step kept nothing, then four plain steps (k = 0) keep one position per row
    for t in range(6, 11):
        if t > 6:
            assert drafter.propose(0, [], []).tokens.shape == (3, 0)
        drafter.commit(torch.zeros(3, dtype=torch.long), torch.tensor([1, 1, int(seq[t])]))
        tok = torch.tensor([[1], [1], [int(seq[t - 1])]])
        hid = torch.cat([torch.randn(2, 1, E), hidden[None, t - 1 : t]])
        drafter.observe_pass(PassStates(tok, hid, torch.ones(3, dtype=torch.long)))
    drafter.reset_row(0)
    drafter.move_row(2, 0)
    draft = drafter.propose(3, [], [])
    assert draft.tokens[0].tolist() == reference_drafts(head, seq[:11], hidden[:10], 3)


def test_files_round_trip_and_refuse_what_does_not_fit(target, tmp_path):
    vocab = torch.tensor([1, 5, 7, 9, 20, 40, 41, 42, 60, 96])
    head = random_head(target, vocab_map=vocab)
    head.save(tmp_path / "h")
    assert is_eagle_dir(tmp_path / "h") and not is_eagle_dir(tmp_path)
    loaded = load_eagle(tmp_path / "h", target)
    x = torch.randint(0, 97, (2, 6))
    f = torch.randn(2, 6, 64)
    pos = torch.arange(6)[None].expand(2, -1)
    assert torch.equal(head.teacher_forced(x, f, pos), loaded.teacher_forced(x, f, pos))
    assert loaded.vocab_map.tolist() == vocab.tolist()
    other = native_from_hf(hf_tiny("qwen2", hidden_size=32, num_attention_heads=2))
    with pytest.raises(IncompatibleDraftError, match="another model"):
        load_eagle(tmp_path / "h", other)
    with pytest.raises(ModelNotFoundError):
        load_eagle(tmp_path / "missing", target)
    weights = tmp_path / "h" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelIntegrityError, match="corrupt or truncated"):
        load_eagle(tmp_path / "h", target)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    del config["head_dim"]
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelIntegrityError, match="head_dim"):
        load_eagle(tmp_path / "h", target)


def test_training_steps_unrolled_learn_the_later_drafts(target):
    """A few hundred optimizer steps on one sequence's states: the second draft step,
    trained through `unrolled`, comes to predict what follows; a head trained on the
    first step alone does worse there (it never saw its own predictions)."""
    states_of = TargetStates(target)
    seq = torch.randint(2, 97, (1, 48), generator=torch.Generator().manual_seed(4))
    f = states_of(seq)
    labels = target.lm_head(f).argmax(-1)  # [1, 48]: the target's choice after each
    positions = torch.arange(47)[None]

    def train(steps_trained):
        torch.manual_seed(0)
        head = build_eagle(target, intermediate_size=64, n_predict=2)
        opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
        for _ in range(150):
            preds = head.unrolled(seq[:, 1:], f[:, :-1], positions, steps_trained)
            loss = sum(
                F.cross_entropy(head.logits(p[0, s:]), labels[0, s + 1 :])
                for s, p in enumerate(preds)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            second = head.unrolled(seq[:, 1:], f[:, :-1], positions, 2)[1]
            return (head.logits(second[0, 1:]).argmax(-1) == labels[0, 2:]).float().mean()

    assert train(2) > 0.9
    assert train(2) > train(1) + 0.2


def test_for_drafting_fuses_without_changing_the_function(target):
    """`for_drafting("none")` (q, k, v as one product, the vocabulary head as a layer)
    computes what the head did; "int4" quantizes every projection whose shape takes it."""
    import copy

    from specdec.kernels.quant import Int4Linear

    head = random_head(target)
    x = torch.randint(0, 97, (2, 7))
    f = torch.randn(2, 7, 64)
    pos = torch.arange(7)[None].expand(2, -1)
    with torch.no_grad():
        before = head.logits(head.teacher_forced(x, f, pos))
        fused = copy.deepcopy(head).for_drafting("none")
        torch.testing.assert_close(fused.logits(fused.teacher_forced(x, f, pos)), before)
        quantized = copy.deepcopy(head).for_drafting("int4")
        # each projection whose input width takes 4-bit groups (K % 64 == 0; not `down`,
        # K = 48) is near its bf16 self: 4-bit weights and 8-bit activations, ~8% here
        # (their exactness against the dequantized weights is test_quant's)
        for name in ("fc", "qkv_proj", "o", "gate_up", "vocab_head"):
            layer, reference = getattr(quantized, name), getattr(fused, name)
            assert isinstance(layer, Int4Linear), name
            x_in = torch.randn(5, layer.in_features)
            error = (layer(x_in) - reference(x_in)).norm() / reference(x_in).norm()
            assert error < 0.12, (name, float(error))
        assert not isinstance(quantized.down, Int4Linear)


@pytest.mark.parametrize("quant", ["none", "int4"])
def test_a_drafting_form_may_take_an_earlier_forms_vocabulary_layer(target, quant):
    """The vocabulary table never trains, so a learner's next drafting form takes the
    current one's layer as it is (no second quantization): the same layer object, and
    the same logits as a form made from scratch."""
    import copy

    first = copy.deepcopy(random_head(target, seed=0)).for_drafting(quant)
    newer = random_head(target, seed=1)
    fresh = copy.deepcopy(newer).for_drafting(quant)
    lent = copy.deepcopy(newer).for_drafting(quant, vocab_head=first.vocab_head)
    assert lent.vocab_head is first.vocab_head and fresh.vocab_head is not first.vocab_head
    x = torch.randint(0, 97, (2, 7))
    f = torch.randn(2, 7, 64)
    pos = torch.arange(7)[None].expand(2, -1)
    with torch.no_grad():
        expected = fresh.logits(fresh.teacher_forced(x, f, pos))
        torch.testing.assert_close(lent.logits(lent.teacher_forced(x, f, pos)), expected)


def reference_path_logp(head, tokens, states, path):
    """Draft-vocabulary log-probabilities `[len(path) + 1, N]` at each depth of `path`
    after `tokens [L+1]` (states `[L, E]`), by whole causal passes forced along the path."""
    feats, nexts = states, tokens[1:]
    out = []
    for i in range(len(path) + 1):
        positions = torch.arange(len(nexts))[None]
        f = head.teacher_forced(nexts[None], feats[None], positions)[0, -1]
        out.append(torch.log_softmax(head.logits(f), -1))
        if i < len(path):
            feats = torch.cat([feats, f[None]])
            nexts = torch.cat([nexts, torch.tensor([path[i]])])
    return torch.stack(out)


def reference_tree_paths(head, tokens, states, topk, vmap, prefix=()):
    """Every combination of each depth's top-k under forced whole passes."""
    depth = len(prefix)
    if depth == len(topk):
        return [tuple(prefix)]
    logp = reference_path_logp(head, tokens, states, list(prefix))[depth]
    return [
        path
        for i in logp.topk(topk[depth]).indices.tolist()
        for path in reference_tree_paths(head, tokens, states, topk, vmap, (*prefix, vmap[i]))
    ]


def _prefilled(head, target, seqs, **tree):
    drafter = EagleDrafter(head, max_batch=4, max_len=64, **tree)
    drafter.admit([s.tolist() for s in seqs])
    hidden = [TargetStates(target)(s[None])[0] for s in seqs]
    lengths = torch.tensor([len(s) - 1 for s in seqs])
    T, E = int(lengths.max()), hidden[0].shape[-1]
    tok, hid = torch.zeros(len(seqs), T, dtype=torch.long), torch.zeros(len(seqs), T, E)
    for i, (s, h) in enumerate(zip(seqs, hidden, strict=True)):
        tok[i, : len(s) - 1], hid[i, : len(s) - 1] = s[:-1], h[:-1]
    drafter.observe_pass(PassStates(tok, hid, lengths))
    return drafter, hidden


def test_a_candidate_tree_holds_every_top_k_combination_of_forced_passes(target):
    """tree=(3, 2, 2) with every path kept: the paths are exactly the combinations of each
    depth's top-k under whole causal passes forced along the path, and the chain of top-1
    drafts is one of them."""
    from specdec.params import SamplingParams

    head = random_head(target, seed=4, vocab_map=torch.arange(2, 60))
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(2, 97, (n,), generator=g) for n in (10, 5)]
    drafter, hidden = _prefilled(head, target, seqs, tree=(3, 2, 2))
    assert drafter.max_nodes == 3 + 6 + 12
    greedy = [SamplingParams(temperature=0)] * 2
    draft = drafter.propose(3, greedy, [])
    vmap = head.vocab_map.tolist()
    for b, (s, h) in enumerate(zip(seqs, hidden, strict=True)):
        tree = draft.trees[b]
        got = {tuple(tree.tokens[n] for n in path) for path in tree.paths}
        assert got == set(reference_tree_paths(head, s, h[:-1], (3, 2, 2), vmap))
        assert tuple(reference_drafts(head, s, h[:-1], 3)) in got
    # the beam: at most n_candidates paths, each one of the combinations
    drafter, _ = _prefilled(head, target, seqs, tree=(3, 2, 2), n_candidates=4)
    assert drafter.max_nodes == 3 + 4 + 4
    draft = drafter.propose(3, greedy, [])
    assert all(len(t.paths) <= 4 and t.num_nodes <= 11 for t in draft.trees)
    sampling = [SamplingParams(temperature=1.0)] * 2
    drafter, _ = _prefilled(head, target, seqs, tree=(3, 2, 2), sampled_tree=False)
    assert all(len(t.paths) == 1 for t in drafter.propose(3, sampling, []).trees)


def test_impossible_trees_are_refused(target):
    from specdec.errors import InvalidParameterError

    head = random_head(target, vocab_map=torch.arange(2, 12))  # 10 draft ids
    for tree in [(11, 1), (2, 2, 2, 2, 2), (0, 1)]:
        with pytest.raises(InvalidParameterError):
            EagleDrafter(head, max_batch=1, max_len=16, tree=tree)


_LAYER = dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
_CONFIGS = {
    "eagle": (EagleConfig, dict(_LAYER, vocab_size=10, target_vocab_size=97)),
    "eagle3": (
        Eagle3Config,
        dict(_LAYER, draft_vocab_size=10, target_vocab_size=97, aux_layer_ids=(0, 1, 2)),
    ),
}


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(head_dim=0), "sizes must be >= 1"),
        (dict(intermediate_size=0), "sizes must be >= 1"),
        (dict(num_kv_heads=3), "4 heads do not share 3 key/value heads evenly"),
        (dict(num_kv_heads=0), "4 heads do not share 0 key/value heads evenly"),
        (dict(n_predict=0), "n_predict must be >= 1"),
    ],
)
def test_a_head_config_its_layer_cannot_be_built_from_is_refused(kind, change, message):
    """Both heads' configs refuse what their decoder layer cannot be built from, naming the
    head kind and the field; the unchanged config is taken."""
    cls, fields = _CONFIGS[kind]
    assert cls(**fields).n_predict == 5
    with pytest.raises(InvalidParameterError, match=f"^{kind} head config: {message}"):
        cls(**{**fields, **change})
