"""The MLP speculator: n small heads that read the target's last hidden state and the tokens
already sampled, and predict the next n tokens (IBM's "combined token/embedding
speculator", Wertheimer et al. 2024, arXiv:2404.19124; fms-extras' MLPSpeculator).

Head i (i = 0..n-1), given the state s_i and the token x_{i} sampled just before:

    s_0     = h_t                                     # target's final-normed state [B, E]
    u       = proj_i(s_i)                             # [B, D]   (E -> D for i = 0, D -> D after)
    s_{i+1} = GELU(LN_i(w_s * u + w_e * emb_i(x_i)))   # [B, D]   weighted sum, norm, GELU
    logits  = head_i(s_{i+1})                         # [B, N]   N = draft vocabulary

with w_s = 0.5 ** (0.5 / n) and w_e = sqrt(1 - w_s ** 2): the state's share shrinks
geometrically along the chain so that after n heads it is one half (paper, section 3).
Head 0 predicts token t+2 from h_t (the target's own state that predicts t+1) and token
t+1; head i predicts token t+i+2 from the chain and token t+i+1.

Options:
- `tie_weights`: one embedding, head and norm for all heads, one projection for heads 1..
  (head 0's projection reads E wide states) — fms-extras' convention.
- `reuse_target`: the embeddings and the vocabulary head are the target's frozen
  `embed_tokens` and `lm_head` (D = E). The state after GELU is nearly non-negative, which
  the target's head was never trained to read, so each head first maps it through a learned
  adapter (E x E, zero at init, so training starts from uniform predictions):
  logits = lm_head(adapter_i(s_{i+1})). A head then costs two E x E matmuls plus
  the vocabulary projection; only projections, norms and adapters are trained.
- `draft_vocab` (vocab_size < the target's): heads score only the N most frequent target
  ids (`vocab_map [N]` maps draft ids back to target ids). With `reuse_target` the head is
  the target's lm_head rows for those ids, so a head costs N / V of the target's head.

Files: `config.json` + `model.safetensors` in the MLPSpeculator layout that vLLM
(`vllm/model_executor/models/mlp_speculator.py`) and IBM's fms-extras read: config fields
model_type "mlp_speculator", n_predict, emb_dim, inner_dim (0 = emb_dim), vocab_size,
tie_weights, scale_input, top_k_tokens_per_head (one per head), n_candidates; tensors
emb.{i}.weight [N, D], proj.{i}.weight [D, E or D], head.{i}.weight [N, D], ln.{i}.weight
and ln.{i}.bias [D]. ln0 (scale_input) has no weights in any of the three. Loading also
takes names with the `speculator.` prefix of IBM's Hugging Face checkpoints, and tied files
that hold only the canonical index of a tied tensor (emb.0, head.0, ln.0, proj.1).

The math is the same function in all three, written three ways:
- state/embedding weights: we compute w_s * proj(s) + w_e * emb(x) (the paper's
  sqrt(1 - w_s^2)); fms-extras multiplies the embedding by w_e * sqrt(D / 2), vLLM adds
  emb * (w_e * sqrt(D / 2) / w_s) to proj(s). The norm that follows removes the common
  factor w_s (up to its eps), so the file stores emb / sqrt(D / 2) and every loader
  computes our function; `emb_scale` (only for the target's reused table) is never stored.
- norm: x / sqrt(mean(x^2) + 1e-6) * weight + bias, no mean subtraction, in all three
  (fms-extras' LayerNormParameterized defaults; vLLM's MLPSpeculatorLayerNorm).
- activation: exact (erf) GELU in all three; ln0 then / sqrt(2) when scale_input.
- tie_weights: one emb, head and ln for every head and one proj for heads 1.. here and in
  fms-extras; vLLM since 2025 keeps the heads untied under tie_weights, so every index is
  written (equal copies; safetensors refuses shared storage) and a tied file whose
  head.{i} differ is refused rather than silently tied.

Files only specdec can load are marked so that other loaders refuse them instead of
computing something else: heads that reuse the target's tables (`adapter.{i}.weight`
[E, E], no emb/head tensors) or score a reduced vocabulary (`vocab_map` [N]; own
embeddings then have N + 1 rows, the last for every id outside it) name the architecture
`SpecdecMLPSpeculator`, which vLLM does not know, and record the difference in
config.json under "specdec". Own-table heads at the full vocabulary are portable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from specdec.errors import (
    IncompatibleDraftError,
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
)
from specdec.models.transformer import on_meta

MODEL_TYPE = "mlp_speculator"
ARCHITECTURE = "MLPSpeculatorPreTrainedModel"  # vLLM's registry name for the layout
SPECDEC_ARCHITECTURE = "SpecdecMLPSpeculator"  # our extensions: no other loader knows it
HF_PREFIX = "speculator."  # tensor names in IBM's Hugging Face checkpoints
WEIGHTS = "model.safetensors"
NORM_EPS = 1e-6


@dataclass(frozen=True)
class SpeculatorConfig:
    n_predict: int  # heads = tokens proposed per step
    emb_dim: int  # E, the target's hidden size
    inner_dim: int  # D, the heads' state width (== E when reusing the target's tables)
    vocab_size: int  # N, tokens each head scores (the draft vocabulary)
    target_vocab_size: int  # V, the target's vocabulary (ids the engine sees)
    tie_weights: bool = False
    scale_input: bool = True  # normalise h_t (RMS 1/sqrt(2)) before head 0, as fms-extras
    reuse_target: bool = False  # emb/head are the target's frozen embed_tokens/lm_head
    emb_scale: float = 1.0  # multiplies the target's reused embeddings (1/RMS of its table)
    # Carried for other stacks' candidate trees (vLLM, fms-extras); None: one per head.
    top_k_tokens_per_head: tuple[int, ...] | None = None
    n_candidates: int | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidParameterError(f"speculator config: {message}")

        check(self.n_predict >= 1, f"n_predict must be >= 1, got {self.n_predict}")
        check(self.emb_dim >= 1 and self.inner_dim >= 1, "emb_dim and inner_dim must be >= 1")
        check(
            1 <= self.vocab_size <= self.target_vocab_size,
            f"vocab_size must be in [1, target_vocab_size={self.target_vocab_size}], "
            f"got {self.vocab_size}",
        )
        check(
            not self.reuse_target or self.inner_dim == self.emb_dim,
            f"reusing the target's tables needs inner_dim == emb_dim ({self.emb_dim}), "
            f"got {self.inner_dim}",
        )
        check(not self.tie_weights or self.n_predict > 1, "tie_weights needs n_predict > 1")
        check(
            self.reuse_target or self.emb_scale == 1.0,
            f"own embedding tables learn their scale: emb_scale must be 1, got {self.emb_scale}",
        )
        if self.top_k_tokens_per_head is None:  # normalised, so a file round-trips equal
            object.__setattr__(self, "top_k_tokens_per_head", (1,) * self.n_predict)
        if self.n_candidates is None:
            object.__setattr__(self, "n_candidates", 1)
        top_k = self.top_k_tokens_per_head
        check(
            top_k is None or (len(top_k) == self.n_predict and min(top_k) >= 1),
            f"top_k_tokens_per_head needs {self.n_predict} sizes >= 1, got {top_k}",
        )

    @property
    def portable(self) -> bool:
        """True when vLLM and fms-extras load the file as this same function."""
        return not self.reuse_target and not self.reduced_vocab

    @property
    def reduced_vocab(self) -> bool:
        return self.vocab_size < self.target_vocab_size

    @property
    def state_weight(self) -> float:
        return 0.5 ** (0.5 / self.n_predict)

    @property
    def emb_weight(self) -> float:
        return math.sqrt(1 - self.state_weight**2)

    def to_json(self) -> dict:
        """config.json: the MLPSpeculator fields, plus our own under "specdec"."""
        return {
            "architectures": [ARCHITECTURE if self.portable else SPECDEC_ARCHITECTURE],
            "model_type": MODEL_TYPE,
            "n_predict": self.n_predict,
            "emb_dim": self.emb_dim,
            "inner_dim": self.inner_dim,
            "vocab_size": self.vocab_size,
            "tie_weights": self.tie_weights,
            "scale_input": self.scale_input,
            "top_k_tokens_per_head": list(self.top_k_tokens_per_head),
            "n_candidates": self.n_candidates,
            "specdec": {
                "target_vocab_size": self.target_vocab_size,
                "reuse_target": self.reuse_target,
                "emb_scale": self.emb_scale,
                "emb_stored_scale": "fms",  # emb tensors divided by sqrt(inner_dim / 2)
            },
        }

    @classmethod
    def from_json(cls, data: dict) -> SpeculatorConfig:
        ours = data.get("specdec", {})
        try:
            return cls(
                n_predict=int(data["n_predict"]),
                emb_dim=int(data["emb_dim"]),
                inner_dim=int(data.get("inner_dim") or data["emb_dim"]),
                vocab_size=int(data["vocab_size"]),
                target_vocab_size=int(ours.get("target_vocab_size", data["vocab_size"])),
                tie_weights=bool(data.get("tie_weights", False)),
                scale_input=bool(data.get("scale_input", False)),
                reuse_target=bool(ours.get("reuse_target", False)),
                emb_scale=float(ours.get("emb_scale", 1.0)),
                top_k_tokens_per_head=(
                    tuple(int(t) for t in data["top_k_tokens_per_head"])
                    if data.get("top_k_tokens_per_head")
                    else None
                ),
                n_candidates=int(data["n_candidates"]) if data.get("n_candidates") else None,
            )
        except KeyError as err:
            raise ModelIntegrityError(f"speculator config.json lacks the field {err}") from None


class Norm(nn.Module):
    """fms-extras' LayerNormParameterized as the MLPSpeculator uses it: x / RMS(x), then an
    elementwise scale and shift (no mean subtraction)."""

    def __init__(self, dim: int, affine: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)).to(x.dtype)
        return x if self.weight is None else x * self.weight + self.bias


class MLPSpeculator(nn.Module):
    """n chained heads; `forward` trains (teacher-forced), `propose_greedy` drafts."""

    def __init__(
        self,
        cfg: SpeculatorConfig,
        target_embed: torch.Tensor | None = None,  # [V, E] the target's embed_tokens.weight
        target_head: torch.Tensor | None = None,  # [V, E] the target's lm_head.weight
        vocab_map: torch.Tensor | None = None,  # [N] target ids of the draft vocabulary
    ) -> None:
        super().__init__()
        self.config = cfg
        n, E, D, N, V = (
            cfg.n_predict,
            cfg.emb_dim,
            cfg.inner_dim,
            cfg.vocab_size,
            cfg.target_vocab_size,
        )
        if cfg.reduced_vocab:
            if vocab_map is None or vocab_map.shape != (N,):
                raise InvalidParameterError(f"a reduced vocabulary needs vocab_map [{N}]")
            vocab_map = vocab_map.long()
        else:
            vocab_map = torch.arange(V)
        self.register_buffer("vocab_map", vocab_map)  # [N] draft id -> target id
        to_draft = torch.full((V,), N, dtype=torch.long)  # [V] target id -> draft id (N = none)
        to_draft[vocab_map] = torch.arange(N)
        self.register_buffer("to_draft", to_draft, persistent=False)

        self.proj = nn.ModuleList(nn.Linear(E if i == 0 else D, D, bias=False) for i in range(n))
        self.ln = nn.ModuleList(Norm(D) for _ in range(n))
        self.ln0 = Norm(E, affine=False) if cfg.scale_input else None
        if cfg.reuse_target:
            if target_embed is None or target_head is None:
                raise InvalidParameterError("reuse_target needs the target's embed and head")
            _check_shape("target embed_tokens", target_embed, (V, E))
            _check_shape("target lm_head", target_head, (V, E))
            self.adapter = nn.ModuleList(nn.Linear(D, E, bias=False) for _ in range(n))
            # Frozen, not saved: they belong to the target.
            self.register_buffer("target_embed", target_embed.detach(), persistent=False)
            head = target_head.detach() if not cfg.reduced_vocab else target_head[vocab_map]
            self.register_buffer("target_head", head, persistent=False)  # [N, E]
            self.emb = self.head = None
        else:
            self.adapter = None
            rows = N + 1 if cfg.reduced_vocab else N  # + one row for ids outside the vocab
            self.emb = nn.ModuleList(nn.Embedding(rows, D) for _ in range(n))
            self.head = nn.ModuleList(nn.Linear(D, N, bias=False) for _ in range(n))
        self.vocab_head = None  # the target's rows as a layer (`for_drafting`)
        if cfg.tie_weights:
            for i in range(1, n):
                self.ln[i] = self.ln[0]
                if i >= 2:
                    self.proj[i] = self.proj[1]
                if self.emb is not None:
                    self.emb[i] = self.emb[0]
                    self.head[i] = self.head[0]
                else:
                    self.adapter[i] = self.adapter[0]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections keep the state's scale (std 1/sqrt(fan_in)); own embeddings are unit
        variance (the paper's weights then balance like with like); heads std 1/sqrt(D);
        adapters start at zero."""
        for proj in self.proj:
            nn.init.normal_(proj.weight, 0.0, 1 / math.sqrt(proj.in_features))
        if self.adapter is not None:
            for adapter in self.adapter:
                nn.init.zeros_(adapter.weight)
        if self.emb is not None:
            for emb, head in zip(self.emb, self.head, strict=True):
                nn.init.normal_(emb.weight, 0.0, 1.0)
                nn.init.normal_(head.weight, 0.0, 1 / math.sqrt(self.config.inner_dim))

    @property
    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _embed(self, i: int, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding of target ids `[...]` -> `[..., D]`."""
        if self.emb is None:
            z = F.embedding(tokens, self.target_embed)
        else:
            z = self.emb[i](self.to_draft[tokens] if self.config.reduced_vocab else tokens)
        return z * self.config.emb_scale

    def _logits(self, i: int, state: torch.Tensor) -> torch.Tensor:
        """`[..., D]` -> `[..., N]` draft-vocabulary logits."""
        if self.vocab_head is not None:
            return self.vocab_head(self.adapter[i](state))
        if self.head is None:
            return F.linear(self.adapter[i](state), self.target_head)
        return self.head[i](state)

    def for_drafting(self, quant: str = "none") -> MLPSpeculator:
        """These heads made cheap to draft with, in place, for inference only: every
        projection, and the target's vocabulary rows where they are reused, as a
        `specdec.kernels.linear.Linear`, whose kernel `tuning` measures (run it over
        them afterwards; `LLM` does), and with `quant` "int4" / "int8" in that format on
        the CPU (`specdec.kernels.quant`: the heads then draft with those weights, which
        changes what they propose, never what the target emits). Tied heads stay tied.

        Why: as `nn.Linear` in bf16 the three products of one head took 15 ms at batch 4
        on a Zen 3 (aten's bf16 matmul, without bf16 instructions there, streams ~1 GB/s),
        a sixth of the int4 1.5B target's step for one drafted token."""
        from specdec.kernels.linear import Linear
        from specdec.kernels.quant import QUANTS, _quantized

        if quant not in QUANTS:
            raise InvalidParameterError(f"quantization must be one of {', '.join(QUANTS)}")
        made: dict[int, nn.Module] = {}

        def drafting(weight: torch.Tensor) -> nn.Module:
            if id(weight) not in made:  # one layer per distinct weight: ties stay ties
                layer = Linear.over(weight)
                on_cpu = quant != "none" and weight.device.type == "cpu"
                made[id(weight)] = _quantized(layer, quant) if on_cpu else layer
            return made[id(weight)]

        for name in ("proj", "adapter", "head"):
            layers = getattr(self, name)
            if layers is not None:
                setattr(self, name, nn.ModuleList(drafting(m.weight) for m in layers))
        if self.head is None:
            self.vocab_head = drafting(self.target_head)
        return self.eval().requires_grad_(False)

    def head_step(self, i: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Head i's new state `[..., D]` from its input state `[..., E or D]` and the target
        ids `[...]` sampled just before."""
        cfg = self.config
        if i == 0 and self.ln0 is not None:
            state = self.ln0(state) / math.sqrt(2)
        mixed = cfg.state_weight * self.proj[i](state) + cfg.emb_weight * self._embed(i, tokens)
        return F.gelu(self.ln[i](mixed))

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced logits per head.

        hidden [B, L, E]: the target's states h_t; tokens [B, L, n]: for head i the target
        id at t+i+1. Returns n tensors [B, L, N]: head i's scores for token t+i+2.
        """
        state, out = hidden, []
        for i in range(self.config.n_predict):
            state = self.head_step(i, state, tokens[..., i])
            out.append(self._logits(i, state))
        return out

    @torch.inference_mode()
    def propose_greedy(self, hidden: torch.Tensor, last: torch.Tensor, n: int) -> torch.Tensor:
        """A chain of n <= n_predict greedy drafts, target ids `[B, n]`, from h `[B, E]` at
        the last position in the target's cache and the token sampled from it `[B]`."""
        state, token, out = hidden.to(self.proj[0].weight.dtype), last, []
        for i in range(n):
            state = self.head_step(i, state, token)
            token = self.vocab_map[self._logits(i, state).argmax(-1)]  # [B]
            out.append(token)
        return torch.stack(out, 1) if out else last.new_zeros(len(last), 0)

    @torch.inference_mode()
    def propose_tree(
        self, hidden: torch.Tensor, last: torch.Tensor, topk: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every combination of the top `topk[i]` tokens of head i (len(topk) <= n_predict),
        each head conditioned on its path's previous token: target ids `[B, P, n]` with
        P = prod(topk), and their summed log-probabilities `[B, P]` (float32)."""
        dtype = self.proj[0].weight.dtype
        B = len(last)
        state = hidden.to(dtype)[:, None]  # [B, P, E] with P = 1
        prev = last[:, None]  # [B, P]
        paths = last.new_zeros(B, 1, 0)  # [B, P, i]
        scores = torch.zeros(B, 1, device=hidden.device)
        for i, k in enumerate(topk):
            state = self.head_step(i, state, prev)  # [B, P, D]
            logp = torch.log_softmax(self._logits(i, state).float(), -1)  # [B, P, N]
            top, index = logp.topk(k, dim=-1)  # [B, P, k]
            ids = self.vocab_map[index]
            P = paths.shape[1]
            paths = torch.cat([paths[:, :, None].expand(-1, -1, k, -1), ids[..., None]], -1)
            paths = paths.reshape(B, P * k, i + 1)
            scores = (scores[:, :, None] + top).reshape(B, P * k)
            state = state[:, :, None].expand(-1, -1, k, -1).reshape(B, P * k, -1)
            prev = ids.reshape(B, P * k)
        return paths, scores

    # --- files ---

    def save(self, path: str | Path) -> Path:
        """config.json + model.safetensors (fp32) in `path`; see the module docstring."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = self.config
        tensors: dict[str, torch.Tensor] = {}
        stored = 1 / math.sqrt(cfg.inner_dim / 2)
        for i in range(cfg.n_predict):
            tensors[f"proj.{i}.weight"] = self.proj[i].weight
            tensors[f"ln.{i}.weight"] = self.ln[i].weight
            tensors[f"ln.{i}.bias"] = self.ln[i].bias
            if self.emb is not None:
                tensors[f"emb.{i}.weight"] = self.emb[i].weight * stored
                tensors[f"head.{i}.weight"] = self.head[i].weight
            else:
                tensors[f"adapter.{i}.weight"] = self.adapter[i].weight
        if cfg.reduced_vocab:
            tensors["vocab_map"] = self.vocab_map
        tensors = {k: v.detach().float().cpu().contiguous().clone() for k, v in tensors.items()}
        save_file(tensors, str(path / WEIGHTS), metadata={"format": "pt"})
        (path / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
        return path


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise IncompatibleDraftError(
            f"{name} has shape {tuple(tensor.shape)}, the speculator needs {tuple(shape)}"
        )


def read_config(path: str | Path) -> dict:
    """A directory's config.json, or {} where there is none or it is not readable JSON
    (for telling what kind of draft a directory holds; the loaders report what is wrong)."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_speculator_dir(path: str | Path) -> bool:
    """True for a directory whose config.json describes an MLP speculator."""
    data = read_config(path)
    return data.get("model_type") == MODEL_TYPE or ARCHITECTURE in data.get("architectures", [])


def load_speculator(
    path: str | Path,
    target=None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> MLPSpeculator:
    """Load a speculator directory; `target` (a native Transformer) is checked against it,
    and required when the speculator reuses the target's tables."""
    path = Path(path).expanduser()
    config_file, weights = path / "config.json", path / WEIGHTS
    if not config_file.is_file():
        raise ModelNotFoundError(f"{path}: no config.json (not a speculator directory)")
    if not weights.is_file():
        raise ModelNotFoundError(f"{path}: no {WEIGHTS} weight file")
    try:
        cfg = SpeculatorConfig.from_json(json.loads(config_file.read_text()))
    except ValueError as err:
        raise ModelIntegrityError(f"{config_file}: unreadable speculator config ({err})") from err
    tensors = _untie(_read(weights), cfg, weights)
    if target is not None:
        tcfg = target.config
        if tcfg.hidden_size != cfg.emb_dim:
            raise IncompatibleDraftError(
                f"the speculator in {path} reads hidden states of size {cfg.emb_dim}, but the "
                f"target's hidden size is {tcfg.hidden_size}: it was trained for another model"
            )
        if tcfg.vocab_size != cfg.target_vocab_size:
            raise IncompatibleDraftError(
                f"the speculator in {path} drafts ids of a {cfg.target_vocab_size}-token "
                f"vocabulary, but the target's is {tcfg.vocab_size}"
            )
    elif cfg.reuse_target:
        raise InvalidParameterError(f"{path} reuses the target's tables: pass the target")
    vocab_map = tensors.pop("vocab_map", None) if cfg.reduced_vocab else None
    if cfg.reduced_vocab and vocab_map is None:
        raise ModelIntegrityError(f"{weights}: a reduced vocabulary needs a vocab_map tensor")
    if vocab_map is not None and (
        vocab_map.shape != (cfg.vocab_size,) or int(vocab_map.max()) >= cfg.target_vocab_size
    ):
        raise ModelIntegrityError(f"{weights}: vocab_map does not fit the config")
    embed = head = None
    if cfg.reuse_target:
        embed, head = target_tables(target)
    with on_meta():
        model = MLPSpeculator(cfg, _meta(embed), _meta(head), _meta(vocab_map))
    expected = _expected_shapes(model)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ModelIntegrityError(
            f"{weights}: tensors do not match config.json "
            f"(missing: {', '.join(missing[:5]) or 'none'}; unexpected: "
            f"{', '.join(extra[:5]) or 'none'})"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ModelIntegrityError(
                f"{weights}: {name} has shape {tuple(tensors[name].shape)}, config.json "
                f"implies {shape}"
            )
    model = MLPSpeculator(
        cfg,
        None if embed is None else embed.to(device, dtype),
        None if head is None else head.to(device, dtype),
        vocab_map,
    )
    stored = 1 / math.sqrt(cfg.inner_dim / 2)
    with torch.no_grad():
        for i in range(cfg.n_predict):
            model.proj[i].weight.copy_(tensors[f"proj.{i}.weight"])
            model.ln[i].weight.copy_(tensors[f"ln.{i}.weight"])
            model.ln[i].bias.copy_(tensors[f"ln.{i}.bias"])
            if model.emb is not None:
                model.emb[i].weight.copy_(tensors[f"emb.{i}.weight"] / stored)
                model.head[i].weight.copy_(tensors[f"head.{i}.weight"])
            else:
                model.adapter[i].weight.copy_(tensors[f"adapter.{i}.weight"])
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def target_tables(target) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's whole embedding and vocabulary head, `[V, E]` each.

    A tensor-parallel shard of the target (`specdec.distributed.sharding`) replicates the
    embedding but holds only a slice of the head's rows: heads that reuse the head must
    score the whole vocabulary, so it is gathered from every rank (`full_weight`, a
    collective: every rank loads the speculator, in the same order)."""
    head = target.lm_head
    weight = head.full_weight() if hasattr(head, "full_weight") else head.weight
    return target.embed_tokens.weight, weight


def _meta(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def _expected_shapes(model: MLPSpeculator) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for i in range(model.config.n_predict):
        shapes[f"proj.{i}.weight"] = tuple(model.proj[i].weight.shape)
        shapes[f"ln.{i}.weight"] = tuple(model.ln[i].weight.shape)
        shapes[f"ln.{i}.bias"] = tuple(model.ln[i].bias.shape)
        if model.emb is not None:
            shapes[f"emb.{i}.weight"] = tuple(model.emb[i].weight.shape)
            shapes[f"head.{i}.weight"] = tuple(model.head[i].weight.shape)
        else:
            shapes[f"adapter.{i}.weight"] = tuple(model.adapter[i].weight.shape)
    return shapes


def _tied_to(name: str, cfg: SpeculatorConfig) -> str:
    """The canonical name of a tensor under tie_weights (itself when untied)."""
    kind, _, rest = name.partition(".")
    index, _, leaf = rest.partition(".")
    if not cfg.tie_weights or not index.isdigit():
        return name
    i = int(index)
    if kind in ("emb", "head", "ln", "adapter"):
        i = 0
    elif kind == "proj":
        i = min(i, 1)
    return f"{kind}.{i}.{leaf}"


def _untie(
    tensors: dict[str, torch.Tensor], cfg: SpeculatorConfig, file: Path
) -> dict[str, torch.Tensor]:
    """Names as this module writes them: the `speculator.` prefix of IBM's Hugging Face
    files dropped, and under tie_weights every index present (a file may hold only the
    canonical one). A tied tensor whose copies differ is refused: this model would tie
    what the file keeps apart (vLLM's newer MLPSpeculator unties the heads)."""
    tensors = {k.removeprefix(HF_PREFIX): v for k, v in tensors.items()}
    if not cfg.tie_weights:
        return tensors
    for name in list(tensors):
        canonical = _tied_to(name, cfg)
        if canonical != name and canonical in tensors:
            if not torch.equal(tensors[name], tensors[canonical]):
                raise ModelIntegrityError(
                    f"{file}: tie_weights is set but {name} differs from {canonical}; "
                    "heads untied under tie_weights are not supported"
                )
    for i in range(cfg.n_predict):
        for kind, leaves in (
            ("emb", "weight"),
            ("head", "weight"),
            ("proj", "weight"),
            ("ln", "weight bias"),
            ("adapter", "weight"),
        ):
            for leaf in leaves.split():
                name = f"{kind}.{i}.{leaf}"
                canonical = _tied_to(name, cfg)
                if name not in tensors and canonical in tensors:
                    tensors[name] = tensors[canonical]
    return tensors


def _read(file: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(file, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ModelIntegrityError(f"{file}: corrupt or truncated safetensors file ({err})") from err


def build_speculator(
    target,
    n_predict: int = 3,
    inner_dim: int | None = None,
    tie_weights: bool = False,
    reuse_target: bool = True,
    draft_vocab: torch.Tensor | None = None,  # [N] target ids, e.g. the most frequent
    scale_input: bool = True,
) -> MLPSpeculator:
    """A fresh (fp32) speculator for a native target Transformer."""
    tcfg = target.config
    E, V = tcfg.hidden_size, tcfg.vocab_size
    embed = head = None
    emb_scale = 1.0
    if reuse_target:
        embed = target.embed_tokens.weight.detach().float()
        head = target.lm_head.weight.detach().float()
        emb_scale = float(1 / embed.pow(2).mean().sqrt().clamp_min(1e-12))
    cfg = SpeculatorConfig(
        n_predict=n_predict,
        emb_dim=E,
        inner_dim=inner_dim or E,
        vocab_size=V if draft_vocab is None else len(draft_vocab),
        target_vocab_size=V,
        tie_weights=tie_weights,
        scale_input=scale_input,
        reuse_target=reuse_target,
        emb_scale=emb_scale,
    )
    return MLPSpeculator(cfg, embed, head, draft_vocab)


__all__ = [
    "MLPSpeculator",
    "SpeculatorConfig",
    "build_speculator",
    "is_speculator_dir",
    "load_speculator",
]
