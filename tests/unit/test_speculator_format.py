"""Heads in the MLPSpeculator layout, checked against other stacks' reading of it.

vLLM cannot be installed beside the project (it pins its own torch and transformers), so
`VllmMLPSpeculator` below re-implements, in plain torch, what vLLM's
`vllm/model_executor/models/mlp_speculator.py` and its `MLPSpeculatorConfig` do with a
directory: parse config.json, build the modules (tied ones shared, so `named_parameters`
lists only the canonical names, as vLLM's loader sees them), load the safetensors by name
(dropping the `speculator.` prefix) and propose greedily, with vLLM's formula
(proj(s) + emb(x) * w_e * sqrt(D / 2) / w_s, then the norm). Files saved here must give
the same proposals there, and IBM-style files written from it must give the same here.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specdec.errors import ModelIntegrityError
from specdec.heads import build_speculator, load_speculator

from tiny import hf_tiny, native_from_hf

VLLM_ARCHITECTURES = {"MLPSpeculatorPreTrainedModel"}  # vLLM's registry entry for the layout


class VllmNorm(nn.Module):
    def __init__(self, dim: int, affine: bool = True) -> None:
        super().__init__()
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.empty(dim))
            self.bias = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * self.weight + self.bias if self.affine else x


class VllmMLPSpeculator(nn.Module):
    """vLLM's reading of an MLPSpeculator directory (see the module docstring).
    `untied_heads`: vLLM's current layout keeps one head per index under tie_weights; its
    2024 layout tied them too."""

    def __init__(self, config: dict, untied_heads: bool = True) -> None:
        super().__init__()
        if not VLLM_ARCHITECTURES & set(config.get("architectures", [])):
            raise ValueError(f"Model architectures {config.get('architectures')} not supported")
        assert config["model_type"] == "mlp_speculator"
        n, E, V = config["n_predict"], config["emb_dim"], config["vocab_size"]
        assert len(config["top_k_tokens_per_head"]) == n  # MLPSpeculatorConfig's own check
        D = config.get("inner_dim", 0) or E
        self.n, self.scale_input = n, config.get("scale_input", False)
        if config.get("tie_weights", False):
            emb, ln, head = nn.Embedding(V, D), VllmNorm(D), nn.Linear(D, V, bias=False)
            first, tied = nn.Linear(E, D, bias=False), nn.Linear(D, D, bias=False)
            self.emb = nn.ModuleList([emb] * n)
            self.proj = nn.ModuleList([first] + [tied] * (n - 1))
            self.ln = nn.ModuleList([ln] * n)
            heads = [nn.Linear(D, V, bias=False) for _ in range(n)] if untied_heads else [head] * n
            self.head = nn.ModuleList(heads)
        else:
            self.emb = nn.ModuleList(nn.Embedding(V, D) for _ in range(n))
            self.proj = nn.ModuleList(
                nn.Linear(E if i == 0 else D, D, bias=False) for i in range(n)
            )
            self.ln = nn.ModuleList(VllmNorm(D) for _ in range(n))
            self.head = nn.ModuleList(nn.Linear(D, V, bias=False) for _ in range(n))
        self.ln0 = VllmNorm(E, affine=False) if self.scale_input else None
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * (D / 2))

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> set[str]:
        params, loaded = dict(self.named_parameters()), set()
        for name, tensor in tensors.items():
            name = name.replace("speculator.", "")
            if name in params:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded

    @torch.no_grad()
    def propose(self, hidden: torch.Tensor, last: torch.Tensor, k: int):
        """Greedy proposals `[B, k]` and each head's logits, from h `[B, E]` and tokens `[B]`."""
        state = hidden[:, None]  # [B, 1, E]
        if self.ln0 is not None:
            state = self.ln0(state) / 2**0.5
        tokens, out, logits = last[:, None], [], []
        for i in range(k):
            z = self.emb[i](tokens)  # [B, 1, D]
            state = self.proj[i](state) + z * (self.emb_weight / self.state_weight)
            state = F.gelu(self.ln[i](state))
            scores = self.head[i](state.flatten(0, 1))  # [B, V]
            tokens = scores.argmax(-1, keepdim=True)
            out.append(tokens[:, 0])
            logits.append(scores)
        return torch.stack(out, 1), logits


def vllm_load(path, **kwargs) -> VllmMLPSpeculator:
    model = VllmMLPSpeculator(json.loads((path / "config.json").read_text()), **kwargs)
    loaded = model.load_weights(load_file(path / "model.safetensors"))
    assert loaded == {name for name, _ in model.named_parameters()}, "weights left unloaded"
    return model


@pytest.fixture(scope="module")
def target():
    return native_from_hf(hf_tiny("qwen2"))


def _perturbed(module):
    torch.manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # norms too, so their weights and biases count
    return module


PORTABLE = {
    "untied": dict(n_predict=3, inner_dim=32),
    "untied, no input scaling": dict(n_predict=4, scale_input=False),
    "tied": dict(n_predict=3, tie_weights=True, inner_dim=48),
}


@pytest.mark.parametrize("untied_heads", [True, False], ids=["vllm-now", "vllm-2024"])
@pytest.mark.parametrize("mode", PORTABLE)
def test_heads_saved_here_propose_the_same_in_vllm(target, tmp_path, mode, untied_heads):
    spec = _perturbed(build_speculator(target, reuse_target=False, **PORTABLE[mode]))
    spec.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["MLPSpeculatorPreTrainedModel"]
    theirs = vllm_load(tmp_path, untied_heads=untied_heads)
    torch.manual_seed(0)
    hidden, last = torch.randn(6, 64) * 3, torch.randint(0, 97, (6,))  # [B, E], [B]
    n = spec.config.n_predict
    tokens, logits = theirs.propose(hidden, last, n)
    assert torch.equal(tokens, spec.propose_greedy(hidden, last, n))
    # Same logits, head by head, given the same previous tokens.
    inputs = torch.cat([last[:, None], tokens[:, :-1]], 1)[:, None]  # [B, 1, n]
    with torch.no_grad():
        ours = spec(hidden[:, None], inputs)
    for i in range(n):
        torch.testing.assert_close(ours[i][:, 0], logits[i], rtol=1e-4, atol=1e-4)


def _ibm_checkpoint(path, tie: bool) -> VllmMLPSpeculator:
    """An IBM-style Hugging Face checkpoint: fp16, `speculator.`-prefixed names, inner_dim
    0, its own candidate tree, and under tie_weights only the canonical tensors (what a
    deduplicating `named_parameters` gives)."""
    config = {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "emb_dim": 64,
        "inner_dim": 0,
        "n_predict": 3,
        "vocab_size": 97,
        "top_k_tokens_per_head": [4, 3, 2],
        "n_candidates": 5,
        "tie_weights": tie,
        "scale_input": tie,
        "torch_dtype": "float16",
    }
    ref = VllmMLPSpeculator(config, untied_heads=False)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            std = 1.0 if "ln" in name else 1 / math.sqrt(64)
            p.copy_(
                (torch.randn_like(p) * std + (1.0 if name.endswith("ln.0.weight") else 0))
                .half()
                .float()
            )
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {f"speculator.{k}": v.detach().half() for k, v in ref.named_parameters()}
    save_file(tensors, path / "model.safetensors")
    return ref


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_ibm_style_checkpoint_loads_here_and_goes_back(target, tmp_path, tie):
    ref = _ibm_checkpoint(tmp_path / "ibm", tie)
    spec = load_speculator(tmp_path / "ibm", target)
    cfg = spec.config
    assert (cfg.inner_dim, cfg.tie_weights, cfg.scale_input) == (64, tie, tie)
    assert cfg.top_k_tokens_per_head == (4, 3, 2) and cfg.n_candidates == 5
    torch.manual_seed(1)
    hidden, last = torch.randn(8, 64) * 2, torch.randint(0, 97, (8,))
    tokens, _ = ref.propose(hidden, last, 3)
    assert torch.equal(spec.propose_greedy(hidden, last, 3), tokens)
    # ... and saved again, vLLM reads the same heads (and the same tree settings).
    spec.save(tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["top_k_tokens_per_head"] == [4, 3, 2] and config["n_candidates"] == 5
    assert torch.equal(vllm_load(tmp_path / "back").propose(hidden, last, 3)[0], tokens)


@pytest.mark.parametrize(
    "options",
    [dict(), dict(reuse_target=False, draft_vocab=torch.arange(10, 50))],
    ids=["target tables", "reduced vocabulary"],
)
def test_files_only_specdec_reads_are_refused_elsewhere(target, tmp_path, options):
    """Not the same function in vLLM's model: its loader must stop, not guess."""
    spec = build_speculator(target, n_predict=2, **options)
    spec.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator"
    assert config["architectures"] == ["SpecdecMLPSpeculator"]
    with pytest.raises(ValueError, match="not supported"):
        vllm_load(tmp_path)
    assert load_speculator(tmp_path, target).config == spec.config  # still ours to load


def test_tied_file_with_distinct_heads_is_refused(target, tmp_path):
    spec = _perturbed(build_speculator(target, reuse_target=False, n_predict=3, tie_weights=True))
    spec.save(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["head.2.weight"] = tensors["head.2.weight"] + 1  # vLLM's untied heads
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ModelIntegrityError, match="head.2.weight differs from head.0.weight"):
        load_speculator(tmp_path, target)


def test_config_fields_vllm_reads(target, tmp_path):
    build_speculator(target, reuse_target=False, n_predict=3, tie_weights=True).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in (
        "emb_dim",
        "inner_dim",
        "n_predict",
        "top_k_tokens_per_head",
        "n_candidates",
        "vocab_size",
        "tie_weights",
        "scale_input",
    ):
        assert key in config, key
    names = set(load_file(tmp_path / "model.safetensors"))
    # Every index is written (vLLM's untied heads read head.{i}); ln0 has no weights.
    assert {f"head.{i}.weight" for i in range(3)} <= names
    assert not any(name.startswith("ln0") for name in names)
