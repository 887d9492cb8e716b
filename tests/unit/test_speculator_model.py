"""MLP speculator heads: shapes, the chain, save/load round trips and loading errors."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.drafters import SpeculatorDrafter
from specdec.errors import IncompatibleDraftError, ModelIntegrityError, ModelNotFoundError
from specdec.heads import (
    SpeculatorConfig,
    build_speculator,
    is_speculator_dir,
    load_speculator,
)

from tiny import hf_tiny, native_from_hf

MODES = {
    "target tables": dict(),
    "target tables, draft vocab": dict(draft_vocab=torch.arange(10, 50)),
    "own tables": dict(reuse_target=False, inner_dim=32),
    "own tables, tied": dict(reuse_target=False, tie_weights=True),
    "own tables, draft vocab": dict(reuse_target=False, draft_vocab=torch.arange(10, 50)),
}


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2"))


def _random_init(spec):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in spec.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norms too, so biases are exercised
    return spec


@pytest.mark.parametrize("mode", MODES)
def test_shapes_and_round_trip(target, tmp_path, mode):
    spec = _random_init(build_speculator(target, n_predict=3, **MODES[mode]))
    N = spec.config.vocab_size
    hidden, tokens = torch.randn(2, 5, 64), torch.randint(0, 97, (2, 5, 3))  # [B, L, E], [B, L, n]
    logits = spec(hidden, tokens)
    assert len(logits) == 3 and all(t.shape == (2, 5, N) for t in logits)
    chain = spec.propose_greedy(hidden[:, 0], tokens[:, 0, 0], 2)  # [B, 2] target ids
    assert chain.shape == (2, 2) and bool((chain < 97).all())
    if spec.config.reduced_vocab:
        assert set(chain.flatten().tolist()) <= set(range(10, 50))

    spec.save(tmp_path)
    assert is_speculator_dir(tmp_path)
    loaded = load_speculator(tmp_path, target)
    assert loaded.config == spec.config
    for a, b in zip(logits, loaded(hidden, tokens), strict=True):
        torch.testing.assert_close(a, b)
    assert torch.equal(loaded.propose_greedy(hidden[:, 0], tokens[:, 0, 0], 2), chain)


def test_mlp_speculator_layout(target, tmp_path):
    """Own tables at full vocabulary: the config fields and tensor names other stacks load,
    embeddings stored with the fms-extras scale."""
    spec = build_speculator(target, n_predict=2, reuse_target=False, inner_dim=32)
    spec.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator"
    for key, value in dict(n_predict=2, emb_dim=64, inner_dim=32, vocab_size=97).items():
        assert config[key] == value
    assert {"tie_weights", "scale_input"} <= set(config)
    names = set(load_file(tmp_path / "model.safetensors"))
    expected = {f"{t}.{i}.weight" for t in ("emb", "proj", "head", "ln") for i in range(2)}
    assert names == expected | {"ln.0.bias", "ln.1.bias"}
    stored = load_file(tmp_path / "model.safetensors")["emb.0.weight"]
    torch.testing.assert_close(stored * math.sqrt(32 / 2), spec.emb[0].weight.detach())


def test_balanced_weights():
    cfg = SpeculatorConfig(n_predict=3, emb_dim=8, inner_dim=8, vocab_size=5, target_vocab_size=5)
    assert cfg.state_weight**6 == pytest.approx(0.5)  # the state's share after n heads: 1/2
    assert cfg.state_weight**2 + cfg.emb_weight**2 == pytest.approx(1.0)


def test_tied_heads_share_parameters(target):
    spec = build_speculator(target, n_predict=3, reuse_target=False, tie_weights=True)
    assert spec.emb[0] is spec.emb[2] and spec.head[0] is spec.head[1] and spec.ln[0] is spec.ln[2]
    assert spec.proj[1] is spec.proj[2] and spec.proj[0] is not spec.proj[1]


def test_reused_tables_are_frozen_and_not_saved(target, tmp_path):
    spec = build_speculator(target, n_predict=2)
    assert all("target" not in name for name, _ in spec.named_parameters())
    spec.save(tmp_path)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert names == {
        f"{t}.{i}.{w}"
        for t in ("proj", "adapter", "ln")
        for i in range(2)
        for w in ("weight", "bias")
        if t == "ln" or w == "weight"
    }
    with pytest.raises(Exception, match="pass the target"):
        load_speculator(tmp_path)


def test_missing_files(target, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_speculator(tmp_path, target)
    build_speculator(target).save(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="no model.safetensors"):
        load_speculator(tmp_path, target)


def test_truncated_and_corrupt_files(target, tmp_path):
    build_speculator(target, reuse_target=False).save(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelIntegrityError, match="corrupt or truncated"):
        load_speculator(tmp_path, target)
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelIntegrityError, match="corrupt or truncated"):
        load_speculator(tmp_path, target)


def test_tensors_that_contradict_the_config(target, tmp_path):
    build_speculator(target, n_predict=2).save(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    tensors["proj.1.weight"] = torch.zeros(64, 32)
    save_file(tensors, weights)
    with pytest.raises(ModelIntegrityError, match=r"proj.1.weight has shape \(64, 32\)"):
        load_speculator(tmp_path, target)
    del tensors["proj.1.weight"]
    save_file(tensors, weights)
    with pytest.raises(ModelIntegrityError, match="missing: proj.1.weight"):
        load_speculator(tmp_path, target)


def test_speculator_for_another_target(target, tmp_path):
    build_speculator(target).save(tmp_path)
    wider = native_from_hf(hf_tiny("qwen2", hidden_size=32))
    with pytest.raises(IncompatibleDraftError, match="hidden size is 32"):
        load_speculator(tmp_path, wider)
    bigger_vocab = native_from_hf(hf_tiny("qwen2", vocab_size=128))
    with pytest.raises(IncompatibleDraftError, match="target's is 128"):
        load_speculator(tmp_path, bigger_vocab)


def test_drafter_rows_follow_the_engine(target):
    spec = _random_init(build_speculator(target, n_predict=3))
    drafter = SpeculatorDrafter(spec, max_batch=4)
    drafter.admit([[1, 2, 3], [4, 5]])
    hidden = torch.randn(2, 64)
    drafter.observe(hidden)
    drafter.admit([[7]])
    drafter.observe(hidden[:1] * 2, first_row=2)
    draft = drafter.propose(5, [None] * 3, [None] * 3)  # k > n: the chain is n long
    assert draft.tokens.shape == (3, 3) and draft.probs is None
    assert draft.lengths.tolist() == [3, 3, 3]
    expected = spec.propose_greedy(torch.cat([hidden, hidden[:1] * 2]), torch.tensor([3, 5, 7]), 3)
    assert torch.equal(draft.tokens, expected)
    drafter.commit(torch.tensor([1, 0, 3]), torch.tensor([11, 12, 13]))
    drafter.move_row(2, 0)
    drafter.reset_row(1)  # the engine frees the last row
    assert drafter.rows == 1 and drafter.last[0] == 13
    assert torch.equal(drafter.hidden[0], hidden[0] * 2)
    assert drafter.propose(0, [None], [None]).k == 0


@pytest.mark.parametrize("mode", ["target tables", "own tables, draft vocab"])
def test_propose_tree_enumerates_and_scores_every_path(target, mode):
    spec = _random_init(build_speculator(target, n_predict=3, **MODES[mode]))
    hidden, last = torch.randn(2, 64), torch.tensor([4, 20])
    paths, scores = spec.propose_tree(hidden, last, (3, 2, 2))
    assert paths.shape == (2, 12, 3) and scores.shape == (2, 12)
    assert len({tuple(p) for p in paths[0].tolist()}) == 12
    # The top-1 path of every head is the greedy chain.
    greedy = spec.propose_greedy(hidden, last, 3)
    assert torch.equal(spec.propose_tree(hidden, last, (1, 1, 1))[0][:, 0], greedy)
    # Each score is the teacher-forced log-probability of its path.
    to_draft = spec.to_draft if spec.config.reduced_vocab else None
    for b in range(2):
        for p in (0, 5, 11):
            path = paths[b, p]
            tokens = torch.cat([last[b : b + 1], path[:2]])[None, None]  # [1, 1, 3]
            with torch.no_grad():
                logits = spec(hidden[b][None, None], tokens)
            want = 0.0
            for i, head in enumerate(logits):
                ids = path[i] if to_draft is None else to_draft[path[i]]
                want += float(torch.log_softmax(head[0, 0].float(), -1)[ids])
            assert abs(float(scores[b, p]) - want) < 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_drafting_form_proposes_what_the_heads_propose(target, mode):
    """`for_drafting("none")` only moves the products onto measured-kernel layers: the
    same chains and trees (fp32), ties kept; "int4" drafts valid ids from int4 layers."""
    import copy

    from specdec.kernels.linear import Linear
    from specdec.kernels.quant import Int4Linear

    spec = _random_init(build_speculator(target, n_predict=3, **MODES[mode]))
    hidden, last = torch.randn(3, 64), torch.tensor([4, 20, 33])
    chain = spec.propose_greedy(hidden, last, 3)
    paths, scores = spec.propose_tree(hidden, last, (2, 2, 1))
    drafting = copy.deepcopy(spec).for_drafting("none")
    layers = [*drafting.proj, *(drafting.adapter or []), *(drafting.head or [])]
    assert all(type(layer) is Linear for layer in layers)
    assert (drafting.vocab_head is None) == (not spec.config.reuse_target)
    assert torch.equal(drafting.propose_greedy(hidden, last, 3), chain)
    tree = drafting.propose_tree(hidden, last, (2, 2, 1))
    assert torch.equal(tree[0], paths)
    torch.testing.assert_close(tree[1], scores)
    if spec.config.tie_weights:
        assert drafting.proj[1] is drafting.proj[2] and drafting.head[0] is drafting.head[2]
    int4 = copy.deepcopy(spec).for_drafting("int4")  # where the shape takes it: K % 64 == 0
    assert isinstance(int4.proj[0], Int4Linear)
    assert all(isinstance(p, Int4Linear) == (p.in_features % 64 == 0) for p in int4.proj)
    drafted = int4.propose_greedy(hidden, last, 3)
    assert drafted.shape == (3, 3) and bool((drafted < 97).all())
    with pytest.raises(Exception, match="quantization must be one of"):
        copy.deepcopy(spec).for_drafting("int3")
