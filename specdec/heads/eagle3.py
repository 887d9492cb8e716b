"""An EAGLE-3 draft head (Li et al. 2025, arXiv:2503.01840) in vLLM's `llama_eagle3` layout,
so a head trained here serves in vLLM (`speculative_config={"method": "eagle3", ...}`) and
a head made for vLLM drafts here.

EAGLE-1 (`specdec.heads.eagle`) reads the target's final state and predicts the next
state. EAGLE-3 reads three of the target's layers (low, middle, high: the inputs of layers
`aux_layer_ids`, by default (2, L // 2, L - 3) of L; vLLM's "auxiliary hidden states", id 0
being the embedding) and predicts tokens directly over a reduced draft vocabulary:

    g_j   = fc([a_j, b_j, c_j])                         # [H] from the three states [3H]
    x_j   = [input_layernorm(embed(x_{j+1})), hidden_norm(g_j)]   # [2H]
    r_j   = g_j + o(Attn(qkv(x_j) | x_0..x_j))           # causal, RoPE at position j
    s_j   = r_j + mlp(post_attention_layernorm(r_j))     # the head's state ("prenorm")
    logits = lm_head(norm(s_j))                          # [N] draft ids; target = id + d2t[id]

Drafting: a row's committed positions enter with the target's auxiliary states; the first
draft token comes from the newest; each later step enters the head's own state `s` in place
of `g` with the token it drafted (training-time test: `unrolled` trains exactly that).

Files (what vLLM 0.32's `Eagle3LlamaForCausalLM` reads): `config.json` (architectures
["LlamaForCausalLMEagle3"], model_type "llama", num_hidden_layers 1, vocab_size = the
target's, draft_vocab_size, eagle_aux_hidden_state_layer_ids) and `model.safetensors` with
`fc.weight [H, 3H]`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`midlayer.self_attn.{q,k,v}_proj.weight [*, 2H]`, `midlayer.self_attn.o_proj.weight`,
`midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight [N, H]`,
`d2t [N]` (int64 offsets: target id = draft id + d2t) and `t2d [V]` (bool: in the draft
vocabulary). The token embedding is the target's (vLLM shares it when the file has none;
an `embed_tokens.weight` in the file is used where present).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from specdec.errors import (
    IncompatibleDraftError,
    InvalidParameterError,
    ModelIntegrityError,
    ModelNotFoundError,
)
from specdec.heads.eagle import _rope_tables, _rotate, check_layer_config, unroll
from specdec.heads.mlp import _read, read_config, target_tables
from specdec.models.transformer import RMSNorm, on_meta  # RMSNorm: vLLM's / HF's (`weight`)

ARCHITECTURE = "LlamaForCausalLMEagle3"
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")  # both name vLLM's class
MODEL_TYPE = "llama"
WEIGHTS = "model.safetensors"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's default auxiliary layers for a target of `num_layers` layers, in the increasing
    order vLLM hands their states over (which differs from the list's below six layers)."""
    return tuple(sorted((2, num_layers // 2, num_layers - 3)))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int  # H, the target's (vLLM's draft may differ; this one does not)
    intermediate_size: int  # the layer's MLP width
    num_heads: int
    num_kv_heads: int
    head_dim: int
    draft_vocab_size: int  # N
    target_vocab_size: int  # V (vLLM's `vocab_size`)
    aux_layer_ids: tuple[int, ...]  # the target layers whose inputs the head reads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    norm_before_residual: bool = False  # vLLM's flag: the residual is hidden_norm(g)
    n_predict: int = 5  # the longest chain it drafts (ours; vLLM takes it from its config)

    def __post_init__(self) -> None:
        check_layer_config("eagle3", self)
        if not 1 <= self.draft_vocab_size <= self.target_vocab_size:
            raise InvalidParameterError(
                f"eagle3 head config: draft_vocab_size {self.draft_vocab_size} must be in "
                f"[1, vocab_size {self.target_vocab_size}]"
            )
        if len(self.aux_layer_ids) != 3:
            raise InvalidParameterError(
                f"eagle3 head config: eagle_aux_hidden_state_layer_ids must name 3 layers, "
                f"got {list(self.aux_layer_ids)}"
            )
        check_distinct_layers(self.aux_layer_ids)

    # what the eagle drafter reads (`specdec.drafters.eagle`)
    @property
    def vocab_size(self) -> int:
        return self.draft_vocab_size

    def to_json(self, dtype: torch.dtype = torch.float32) -> dict:
        """vLLM's draft config (a Llama config with EAGLE-3's fields)."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": MODEL_TYPE,
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "vocab_size": self.target_vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,  # transformers 4's spelling, and 5's:
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "norm_before_residual": self.norm_before_residual,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": str(dtype).removeprefix("torch."),
            "dtype": str(dtype).removeprefix("torch."),
            "specdec_n_predict": self.n_predict,
        }

    @classmethod
    def from_json(cls, data: dict, target_layers: int) -> Eagle3Config:
        """From vLLM's fields; raises ValueError naming what is missing or unsupported.
        `target_layers` resolves the default auxiliary layers where none are given."""
        archs = data.get("architectures") or []
        if not any(a in ARCHITECTURES for a in archs):
            raise ValueError(f"architectures {archs} is not {ARCHITECTURE}")
        missing = [
            k
            for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
            if k not in data
        ]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if data.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"num_hidden_layers {data['num_hidden_layers']} (only 1 is served)")
        H, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
        if int(data.get("target_hidden_size") or H) != H:
            raise ValueError(
                f"target_hidden_size {data['target_hidden_size']} differs from hidden_size {H}"
            )
        if data.get("attention_bias") or data.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias heads are not supported")
        aux = data.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(target_layers)
        # vLLM hands the states over in increasing layer order whatever the list's order
        # (`_set_aux_hidden_state_layers` sorts), so fc's column blocks follow that order.
        check_distinct_layers(tuple(aux))  # before sorting: the message shows the file's list
        aux = sorted(aux)
        return cls(
            hidden_size=H,
            intermediate_size=int(data["intermediate_size"]),
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or H // heads),
            draft_vocab_size=int(data.get("draft_vocab_size") or data["vocab_size"]),
            target_vocab_size=int(data["vocab_size"]),
            aux_layer_ids=tuple(int(i) for i in aux),
            rope_theta=float(
                data.get("rope_theta")
                or (data.get("rope_parameters") or {}).get("rope_theta")
                or 10000.0
            ),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(data.get("max_position_embeddings", 32768)),
            norm_before_residual=bool(data.get("norm_before_residual", False)),
            n_predict=int(data.get("specdec_n_predict", 5)),
        )


def _linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.q_proj = _linear(2 * H, c.num_heads * D)
        self.k_proj = _linear(2 * H, c.num_kv_heads * D)
        self.v_proj = _linear(2 * H, c.num_kv_heads * D)
        self.o_proj = _linear(c.num_heads * D, H)


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size)


class _MidLayer(nn.Module):
    """The one decoder layer, under vLLM's names (`midlayer.*`)."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        H, eps = c.hidden_size, c.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)
        self.hidden_norm = RMSNorm(H, eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = _MLP(c)


class Eagle3Head(nn.Module):
    """The head; it offers the eagle drafter's interface (`inputs`, `qkv`, `kv`, `attend`,
    `after_attention`, `logits`, `vocab_map`), where an entry `x` is packed as
    `[residual, input_layernorm(embed), hidden_norm(g)]` `[.., 3H]` and a state is `s`."""

    def __init__(self, config: Eagle3Config, embed: torch.Tensor, vocab_map: torch.Tensor):
        super().__init__()
        c = config
        H, N, V = c.hidden_size, c.draft_vocab_size, c.target_vocab_size
        self.config = c
        self.register_buffer("embed", embed, persistent=False)  # [V, H] the target's, frozen
        vocab_map = vocab_map.long()
        self.register_buffer("d2t", vocab_map - torch.arange(N, device=vocab_map.device))
        t2d = torch.zeros(V, dtype=torch.bool, device=vocab_map.device)
        t2d[vocab_map] = True
        self.register_buffer("t2d", t2d)
        # draft id -> target id, and target id -> draft id (N outside), for drafting/training
        self.register_buffer("vocab_map", vocab_map, persistent=False)
        to_draft = torch.full((V,), N, dtype=torch.long, device=vocab_map.device)
        to_draft[vocab_map] = torch.arange(N, device=vocab_map.device)
        self.register_buffer("to_draft", to_draft, persistent=False)
        self.fc = _linear(3 * H, H)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = _linear(H, N)

    @property
    def trainable(self) -> list[nn.Parameter]:
        return list(self.parameters())

    @property
    def feature_size(self) -> int:
        """Width of what a target pass hands the head per position (three states)."""
        return 3 * self.config.hidden_size

    # the pieces ----------------------------------------------------------------------

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """`[.., 3H]` auxiliary states -> g `[.., H]`."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def inputs(self, tokens_next: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Packed entries `[.., 3H]` from the next tokens `[..]` and g or s `[.., H]`."""
        layer = self.midlayer
        e = layer.input_layernorm(self.embed[tokens_next].to(hidden.dtype))
        h = layer.hidden_norm(hidden)
        residual = h if self.config.norm_before_residual else hidden
        return torch.cat([residual, e, h], -1)

    def entries(self, tokens_next: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """Packed entries of true positions from their auxiliary states `[.., 3H]`."""
        return self.inputs(tokens_next, self.combine(aux))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x `[B, T, 3H]`, positions `[B, T]` -> q `[B, Hq, T, D]`, k, v `[B, Hkv, T, D]`."""
        c, attn = self.config, self.midlayer.self_attn
        B, T, _ = x.shape
        cos, sin = _rope_tables(positions, c, x.dtype)
        q = attn.q_proj(x[..., c.hidden_size :])
        q = _rotate(q.view(B, T, c.num_heads, c.head_dim), cos, sin).transpose(1, 2)
        return (q, *self._kv(x, cos, sin))

    def kv(self, x: torch.Tensor, positions: torch.Tensor):
        """`qkv` without the queries (a catch-up's earlier entries need none)."""
        cos, sin = _rope_tables(positions, self.config, x.dtype)
        return self._kv(x, cos, sin)

    def _kv(self, x, cos, sin):
        c, attn = self.config, self.midlayer.self_attn
        B, T, _ = x.shape
        inp = x[..., c.hidden_size :]  # [B, T, 2H]
        k = attn.k_proj(inp).view(B, T, c.num_kv_heads, c.head_dim)
        v = attn.v_proj(inp).view(B, T, c.num_kv_heads, c.head_dim)
        return _rotate(k, cos, sin).transpose(1, 2), v.transpose(1, 2)

    def attend(self, q, k, v, mask: torch.Tensor | None = None, causal: bool = False):
        """`[B, T, H]`: the attention block's output (o_proj, before the residual)."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        B, _, T, _ = out.shape
        return self.midlayer.self_attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual, the MLP block: entries `[.., 3H]` and attention `[.., H]` -> s."""
        layer = self.midlayer
        r = x[..., : self.config.hidden_size] + attn
        m = layer.mlp
        h = layer.post_attention_layernorm(r)
        return r + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """`[.., N]` draft-vocabulary logits of states s `[.., H]`."""
        return self.lm_head(self.norm(state))

    @torch.no_grad()
    def for_drafting(self, quant: str = "none") -> Eagle3Head:
        """This head made cheap to draft with, in place, for inference only: with `quant`
        "int4" / "int8" every projection whose shape takes the format in it, as the eagle
        head's (`specdec.kernels.quant`; it then proposes from those weights, which changes
        what it drafts, never what the target emits). On the Qwen 1.5B its fp32 vocabulary
        head alone streams 196 MB per drafted token, a fifth of what the int4 target reads
        a step. Run `tuning` over it afterwards (`LLM` does); save before, not after (the
        files are vLLM's dense layout)."""
        from specdec.kernels.quant import QUANTS, _quantized

        if quant not in QUANTS:
            raise InvalidParameterError(f"quantization must be one of {', '.join(QUANTS)}")
        if quant != "none" and self.fc.weight.device.type == "cpu":
            layer = self.midlayer
            for owner, names in (
                (self, ("fc", "lm_head")),
                (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
            ):
                for name in names:
                    setattr(owner, name, _quantized(getattr(owner, name), quant))
        return self.eval().requires_grad_(False)

    # whole sequences (training, evaluation) ------------------------------------------

    def unrolled(self, tokens_next, aux, positions, steps: int) -> list[torch.Tensor]:
        """Draft steps 1..steps at every position of `[B, T]` sequences (states s, each
        `[B, T, H]`): the training-time test. Step s at position p enters step s-1's state
        made at p-1 with the true next token and attends to the true entries at positions
        <= p-s+1 and to the entries steps 2..s made on its own chain: what drafting s steps
        from a row whose newest true position is p-s+1 sees."""
        return unroll(self, self.entries(tokens_next, aux), tokens_next, positions, steps)

    # files -----------------------------------------------------------------------------

    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """vLLM's layout; `dtype` (default: the weights') for the float tensors."""
        path = Path(path).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        dtype = dtype or self.fc.weight.dtype
        state = {}
        for k, v in self.state_dict().items():
            v = v.detach().cpu()
            state[k] = (v.to(dtype) if v.is_floating_point() else v).contiguous()
        save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
        config = self.config.to_json(dtype)
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def build_eagle3(
    target,
    vocab_map: torch.Tensor | None = None,
    intermediate_size: int | None = None,
    n_predict: int = 5,
    aux_layer_ids: tuple[int, ...] | None = None,
) -> Eagle3Head:
    """A fresh (fp32) head for a native target Transformer: random layer, unit norms and
    the rows of the target's vocabulary head for the draft ids (sorted, so that `d2t` is a
    run of non-decreasing offsets as vLLM's tools write it). The final norm starts at unit
    weight, not the target's (~4.6 on the Qwen 1.5B): through the target's rows a random
    state would then score confidently wrong (16 nats a token against 10.4 uniform over
    32,000 ids), and the first steps would go to unlearning that."""
    tcfg = target.config
    V = tcfg.vocab_size
    vocab_map = torch.arange(V) if vocab_map is None else torch.sort(vocab_map.long().cpu())[0]
    aux = tuple(aux_layer_ids or default_aux_layers(tcfg.num_layers))
    check_aux_layers(aux, tcfg.num_layers)
    cfg = Eagle3Config(
        hidden_size=tcfg.hidden_size,
        intermediate_size=intermediate_size or tcfg.intermediate_size,
        num_heads=tcfg.num_heads,
        num_kv_heads=tcfg.num_kv_heads,
        head_dim=tcfg.head_dim,
        draft_vocab_size=len(vocab_map),
        target_vocab_size=V,
        aux_layer_ids=aux,
        rope_theta=tcfg.rope_theta,
        rms_norm_eps=tcfg.rms_norm_eps,
        max_position_embeddings=tcfg.max_position_embeddings,
        n_predict=n_predict,
    )
    embed, head = target_tables(target)
    model = Eagle3Head(cfg, embed.detach(), vocab_map.to(embed.device))
    with torch.no_grad():
        std = 0.02
        for name, p in model.named_parameters():
            if p.dim() == 2 and name != "lm_head.weight":
                p.normal_(0.0, std)
        model.lm_head.weight.copy_(head.detach()[vocab_map.to(head.device)].float())
    return model.float()


def check_distinct_layers(ids: tuple[int, ...]) -> None:
    """Auxiliary layer ids must be distinct: vLLM collects the states of a set of layers, so
    a head that lists a layer twice would be handed fewer states there than its fc reads."""
    # vLLM 0.32 keeps tuple(sorted(set(layers))) (interfaces.py _set_aux_hidden_state_layers)
    twice = sorted({i for i in ids if list(ids).count(i) > 1})
    if twice:
        raise InvalidParameterError(
            f"eagle3 head: eagle_aux_hidden_state_layer_ids {list(ids)} repeat layer "
            f"{', '.join(map(str, twice))}: vLLM hands over each layer's state once, so it "
            f"would feed {len(set(ids))} states to an fc that reads {len(ids)}; name "
            f"{len(ids)} distinct layers"
        )


def check_aux_layers(ids: tuple[int, ...], num_layers: int) -> None:
    """Auxiliary layer ids must name distinct layers of the target (0 .. L-1), in increasing
    order: vLLM concatenates the states in that order, so a head built on another order would
    draft differently there than here."""
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise IncompatibleDraftError(
            f"eagle3 head: eagle_aux_hidden_state_layer_ids {list(ids)} name layers outside "
            f"the target's 0..{num_layers - 1} ({num_layers} layers)"
        )
    check_distinct_layers(ids)
    if list(ids) != sorted(ids):
        raise IncompatibleDraftError(
            f"eagle3 head: eagle_aux_hidden_state_layer_ids {list(ids)} must be in increasing "
            f"order ({sorted(ids)}): vLLM reads the layers' states in that order"
        )


def is_eagle3_dir(path: str | Path) -> bool:
    """True for a directory whose config.json describes an EAGLE-3 head."""
    archs = read_config(path).get("architectures") or []
    return any(a in ARCHITECTURES for a in archs)


def load_eagle3(
    path: str | Path,
    target,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Eagle3Head:
    """Load an EAGLE-3 head directory (vLLM's layout) for `target`; anything that does not
    fit the target or the config is refused with a message naming it."""
    path = Path(path).expanduser()
    config_file, weights = path / "config.json", path / WEIGHTS
    if not config_file.is_file():
        raise ModelNotFoundError(f"{path}: no config.json (not an eagle3 head directory)")
    if not weights.is_file():
        raise ModelNotFoundError(f"{path}: no {WEIGHTS} weight file")
    tcfg = target.config
    try:
        cfg = Eagle3Config.from_json(json.loads(config_file.read_text()), tcfg.num_layers)
    except (ValueError, TypeError) as err:
        raise ModelIntegrityError(f"{config_file}: unusable eagle3 head config ({err})") from err
    except InvalidParameterError as err:
        raise ModelIntegrityError(f"{config_file}: {err}") from err
    theirs = {
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.target_vocab_size,
    }
    ours = {
        "hidden_size": tcfg.hidden_size,
        "num_attention_heads": tcfg.num_heads,
        "num_key_value_heads": tcfg.num_kv_heads,
        "head_dim": tcfg.head_dim,
        "vocab_size": tcfg.vocab_size,
    }
    differ = [f"{k} {theirs[k]} (target: {ours[k]})" for k in theirs if theirs[k] != ours[k]]
    if differ:
        raise IncompatibleDraftError(
            f"the eagle3 head in {path} was made for another target: {'; '.join(differ)}"
        )
    check_aux_layers(cfg.aux_layer_ids, tcfg.num_layers)
    tensors = _read(weights)  # a corrupt or truncated file: ModelIntegrityError
    vocab_map = _vocab_map(tensors, cfg, weights)
    embed, _ = target_tables(target)
    own_embed = tensors.pop("embed_tokens.weight", None)
    if own_embed is not None and tuple(own_embed.shape) != tuple(embed.shape):
        raise ModelIntegrityError(
            f"{weights}: embed_tokens.weight is {list(own_embed.shape)}, the target's "
            f"embedding {list(embed.shape)}"
        )
    with on_meta():
        model = Eagle3Head(cfg, torch.empty(embed.shape), torch.arange(cfg.draft_vocab_size))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    wrong = [
        f"{k} {list(tensors[k].shape)} (expected {list(expected[k])})"
        for k in expected
        if k in tensors and tuple(tensors[k].shape) != expected[k]
    ]
    if missing or extra or wrong:
        raise ModelIntegrityError(
            f"{weights}: tensors do not match config.json (missing: "
            f"{', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(extra[:5]) or 'none'}; "
            f"wrong shape: {', '.join(wrong[:5]) or 'none'})"
        )
    table = (embed if own_embed is None else own_embed).detach()
    model = Eagle3Head(cfg, table.to(device), vocab_map.to(device))
    model.load_state_dict(tensors)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.embed = table.to(device)  # only indexed: it keeps its dtype
    return model


def _vocab_map(tensors: dict, cfg: Eagle3Config, weights: Path) -> torch.Tensor:
    """Draft id -> target id from `d2t` (checked: in range, distinct, and `t2d` agreeing)."""
    N, V = cfg.draft_vocab_size, cfg.target_vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None:
        if N != V:
            raise ModelIntegrityError(
                f"{weights}: no d2t map for a draft vocabulary of {N} of {V} ids"
            )
        d2t = torch.zeros(N, dtype=torch.long)
    if tuple(d2t.shape) != (N,) or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise ModelIntegrityError(
            f"{weights}: d2t must hold {N} integer offsets, got {d2t.dtype} {list(d2t.shape)}"
        )
    vocab_map = torch.arange(N) + d2t.long()
    if int(vocab_map.min()) < 0 or int(vocab_map.max()) >= V:
        bad = int(((vocab_map < 0) | (vocab_map >= V)).nonzero()[0, 0])
        raise ModelIntegrityError(
            f"{weights}: d2t maps draft id {bad} to target id {int(vocab_map[bad])}, outside "
            f"the target's vocabulary of {V}"
        )
    if len(torch.unique(vocab_map)) != N:
        raise ModelIntegrityError(f"{weights}: d2t maps two draft ids to one target id")
    if t2d is not None:
        if tuple(t2d.shape) != (V,):
            raise ModelIntegrityError(
                f"{weights}: t2d must have the target's {V} entries, got {list(t2d.shape)}"
            )
        mask = torch.zeros(V, dtype=torch.bool)
        mask[vocab_map] = True
        if not torch.equal(t2d.bool(), mask):
            raise ModelIntegrityError(f"{weights}: t2d does not mark the ids d2t maps to")
    tensors["d2t"] = vocab_map - torch.arange(N)
    tensors["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, vocab_map, True)
    return vocab_map


__all__ = [
    "Eagle3Config",
    "Eagle3Head",
    "build_eagle3",
    "default_aux_layers",
    "is_eagle3_dir",
    "load_eagle3",
]
