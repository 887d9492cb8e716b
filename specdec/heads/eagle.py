"""A feature-level draft head: one decoder layer over the target's own states (EAGLE, Li et
al. 2024, arXiv:2401.15077), for where the MLP heads (`specdec.heads.mlp`) plateau.

The MLP heads see one state, the target's at the last committed position, and must guess
every later token from it. This head reads the target's states at *every* committed
position through attention, and drafts by predicting the target's next state, which the
target's own vocabulary head then scores:

    in_j   = fc([embed(x_{j+1}), f_j])               # [E]: the token after j, j's state
    h_j    = in_j + Attn(norm1(in_j) | in_0..in_j)   # causal, RoPE at position j
    f^_{j+1} = norm(h_j + MLP(norm2(h_j)))            # predicts f_{j+1}
    logits = head_rows @ f^_{j+1}                    # the target's lm_head, draft vocab

f is the target's final-normed state (what the engine's passes hand drafters, `PassStates`),
x the committed tokens, E the hidden size. `embed` and `head_rows` are the target's frozen
tables (the rows of the `N` draft-vocabulary ids, `vocab_map [N]`); the layer has the
target's attention shape (heads, kv heads, head dim, RoPE base) and its own MLP width.

Drafting: a row's committed positions enter with the target's true states (`f_j`); the
first draft token comes from the newest of them; each later draft step feeds back the
head's own prediction as the state (`f^`) and the token it drafted. Training
(`teacher_forced`, `unrolled`) does the same in parallel over whole sequences.

Files: `config.json` (architectures ["SpecdecEagleHead"], model_type "specdec_eagle"; no
other stack reads it) and `model.safetensors` with the layer's tensors and `vocab_map`;
the target's tables are taken from the target at load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
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
from specdec.heads.mlp import _read, read_config, target_tables
from specdec.kernels.linear import Linear
from specdec.models.transformer import on_meta

MODEL_TYPE = "specdec_eagle"
ARCHITECTURE = "SpecdecEagleHead"
WEIGHTS = "model.safetensors"


def check_layer_config(kind: str, c) -> None:
    """What an eagle or EAGLE-3 head's one decoder layer needs of its config (`c`): sizes of
    at least 1, query heads that share the key/value heads evenly, a chain of at least one."""
    if min(c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim) < 1:
        raise InvalidParameterError(f"{kind} head config: sizes must be >= 1")
    if c.num_kv_heads < 1 or c.num_heads % c.num_kv_heads:
        raise InvalidParameterError(
            f"{kind} head config: {c.num_heads} heads do not share "
            f"{c.num_kv_heads} key/value heads evenly"
        )
    if c.n_predict < 1:
        raise InvalidParameterError(f"{kind} head config: n_predict must be >= 1")


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int  # E, the target's
    intermediate_size: int  # the head's MLP width
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # N, draft-vocabulary ids the head scores
    target_vocab_size: int  # V
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    n_predict: int = 5  # the longest chain it drafts (the engine's window is capped there)

    def __post_init__(self) -> None:
        check_layer_config("eagle", self)
        if not 1 <= self.vocab_size <= self.target_vocab_size:
            raise InvalidParameterError(
                f"eagle head config: vocab_size must be in [1, {self.target_vocab_size}]"
            )

    def to_json(self) -> dict:
        return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> EagleConfig:
        fields = set(cls.__dataclass_fields__)
        missing = sorted(
            f for f in fields - {"rope_theta", "rms_norm_eps", "n_predict"} if f not in data
        )
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in fields})


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[..., D]` (fp32) for integer positions (the HF non-interleaved halves)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions[..., None].float() * inv
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def _rope_tables(positions: torch.Tensor, c, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[B, T, 1, D]` for `positions [B, T]`, in `dtype`."""
    cos, sin = rope(positions, c.head_dim, c.rope_theta)
    return cos[:, :, None].to(dtype), sin[:, :, None].to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class EagleHead(nn.Module):
    def __init__(
        self,
        config: EagleConfig,
        embed: torch.Tensor,  # [V, E] the target's embedding (frozen, not stored)
        head_rows: torch.Tensor,  # [N, E] the target's lm_head rows of vocab_map
        vocab_map: torch.Tensor,  # [N] target ids
    ) -> None:
        super().__init__()
        c = config
        E = c.hidden_size
        self.config = c
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("head_rows", head_rows, persistent=False)
        self.register_buffer("vocab_map", vocab_map.long())
        to_draft = torch.full((c.target_vocab_size,), c.vocab_size, dtype=torch.long)
        to_draft[vocab_map.long()] = torch.arange(c.vocab_size)
        # target id -> draft id (N for ids outside the draft vocabulary), for training
        self.register_buffer("to_draft", to_draft, persistent=False)
        # `Linear`s: F.linear until `tuning` gives them a plan (`for_drafting`)
        self.fc = Linear(2 * E, E)
        self.norm1 = nn.RMSNorm(E, eps=c.rms_norm_eps)
        self.q = Linear(E, c.num_heads * c.head_dim)
        self.k = Linear(E, c.num_kv_heads * c.head_dim)
        self.v = Linear(E, c.num_kv_heads * c.head_dim)
        self.o = Linear(c.num_heads * c.head_dim, E, bias=False)
        self.norm2 = nn.RMSNorm(E, eps=c.rms_norm_eps)
        self.gate_up = Linear(E, 2 * c.intermediate_size, bias=False)
        self.down = Linear(c.intermediate_size, E, bias=False)
        self.norm = nn.RMSNorm(E, eps=c.rms_norm_eps)
        # Set by `for_drafting`: q, k and v as one product, k and v as another (a
        # catch-up's earlier entries need no query), the vocabulary head as a layer.
        self.qkv_proj: Linear | None = None
        self.kv_proj: Linear | None = None
        self.vocab_head: Linear | None = None

    @property
    def trainable(self) -> list[nn.Parameter]:
        """What training updates: everything but the target's tables (buffers)."""
        return list(self.parameters())

    # the pieces ----------------------------------------------------------------------

    def inputs(self, tokens_next: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """`[..., E]` layer inputs from the next tokens `[...]` and the states `[..., E]`."""
        e = self.embed[tokens_next].to(feats.dtype)
        return self.fc(torch.cat([e, feats], -1))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x `[B, T, E]`, positions `[B, T]` -> q `[B, H, T, D]`, k, v `[B, Hkv, T, D]`."""
        c = self.config
        B, T, _ = x.shape
        x = self.norm1(x)
        cos, sin = _rope_tables(positions, c, x.dtype)
        if self.qkv_proj is not None:
            kv = c.num_kv_heads * c.head_dim
            q, k, v = self.qkv_proj(x).split((c.num_heads * c.head_dim, kv, kv), -1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = _rotate(q.view(B, T, c.num_heads, c.head_dim), cos, sin)
        return (q.transpose(1, 2), *self._heads(k, v, cos, sin))

    def kv(self, x: torch.Tensor, positions: torch.Tensor):
        """`qkv` without the queries: k, v `[B, Hkv, T, D]`. A drafter's catch-up needs
        the query of each row's newest entry alone, and q is three quarters of the fused
        product's columns (the Qwen 1.5B's head, 4 x 1025 prompt entries: 33 ms for `qkv`,
        16.5 for this)."""
        x = self.norm1(x)
        cos, sin = _rope_tables(positions, self.config, x.dtype)
        if self.kv_proj is not None:
            k, v = self.kv_proj(x).chunk(2, -1)
        else:
            k, v = self.k(x), self.v(x)
        return self._heads(k, v, cos, sin)

    def _heads(self, k, v, cos, sin):
        """Projected keys and values `[B, T, Hkv * D]` -> rotated keys, values
        `[B, Hkv, T, D]`."""
        c = self.config
        B, T, _ = k.shape
        k = _rotate(k.view(B, T, c.num_kv_heads, c.head_dim), cos, sin)
        v = v.view(B, T, c.num_kv_heads, c.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q, k, v, mask: torch.Tensor | None = None, causal: bool = False):
        """`[B, T, E]`: the attention block's output (before the residual)."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        B, _, T, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(B, T, -1))

    def entries(self, tokens_next: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """Layer inputs of true positions from what a target pass hands over (the final
        states; an EAGLE-3 head combines three states here)."""
        return self.inputs(tokens_next, feats)

    @property
    def feature_size(self) -> int:
        """Width of what a target pass hands the head per position."""
        return self.config.hidden_size

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual and `finish`: entries and the attention output -> f^."""
        return self.finish(x + attn)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The MLP block and the final norm: the residual stream `[.., E]` -> f^."""
        gate, up = self.gate_up(self.norm2(h)).chunk(2, -1)
        return self.norm(h + self.down(F.silu(gate) * up))

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """`[..., N]` draft-vocabulary logits of states `[..., E]`."""
        if self.vocab_head is not None:
            return self.vocab_head(f)
        # As rows: a strided [B, T, E] slice would go through a batched product that copies
        # the 16K x E table once per sequence (measured: 58% of a bf16 learner step).
        rows = f.reshape(-1, f.shape[-1])  # [B*T, E]
        out = F.linear(rows, self.head_rows.to(f.dtype))  # [B*T, N]
        return out.view(*f.shape[:-1], out.shape[-1])

    @torch.no_grad()
    def for_drafting(self, quant: str = "none", vocab_head: Linear | None = None) -> EagleHead:
        """This head made cheap to draft with, in place, for inference only: q, k and v
        fused into one product (the target's own shape, so its measured kernel plan is
        shared), the vocabulary head as a layer, and with `quant` "int4" / "int8" every
        projection in that format (`specdec.kernels.quant`; the head then drafts with those
        weights, which changes what it proposes, never what the target emits). Run
        `tuning` over it afterwards (`LLM` does).

        `vocab_head`: the layer an earlier drafting form of a head on the same target
        tables made (its `vocab_head`, in the same `quant`), taken as it is. The table never
        trains, so a learner publishing every few steps need not quantize its 16K x E rows
        again (a third of the 1.0-1.1 s a publish took on the Qwen 1.5B's head)."""
        from specdec.kernels.quant import QUANTS, _quantized

        if quant not in QUANTS:
            raise InvalidParameterError(f"quantization must be one of {', '.join(QUANTS)}")
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        bias = torch.cat([self.q.bias, self.k.bias, self.v.bias])
        qkv = Linear.over(weight, bias)
        queries = self.q.weight.shape[0]
        kv = Linear.over(weight[queries:].clone(), bias[queries:].clone())
        projections = ["fc", "qkv_proj", "kv_proj", "o", "gate_up", "down"]
        if vocab_head is None:  # (a lent layer comes in its format already)
            vocab_head = Linear.over(self.head_rows.to(weight.dtype))  # [N, E]
            projections.append("vocab_head")
        self.qkv_proj, self.kv_proj, self.vocab_head = qkv, kv, vocab_head
        del self.q, self.k, self.v  # the fused copy replaces them
        self.q = self.k = self.v = None
        if quant != "none" and weight.device.type == "cpu":
            for name in projections:
                setattr(self, name, _quantized(getattr(self, name), quant))
        return self.eval().requires_grad_(False)

    # whole sequences (training, evaluation) ------------------------------------------

    def teacher_forced(self, tokens_next, feats, positions) -> torch.Tensor:
        """`[B, T, E]` f^: at every position the first draft step from true states."""
        return self.unrolled(tokens_next, feats, positions, 1)[0]

    def unrolled(self, tokens_next, feats, positions, steps: int) -> list[torch.Tensor]:
        """Draft steps 1..steps at every position of `[B, T]` sequences, each `[B, T, E]`
        (a training-time test, as HASS and EAGLE-3 do, so later steps learn from the
        head's own predicted states rather than only the target's).

        Step s at position p reads step s-1's prediction made at p-1 and the true next
        token (the case that counts: the earlier drafts were right). It attends to the
        true entries at positions <= p-s+1 and to the entries steps 2..s made on its own
        chain (step i's at position p-(s-i)): exactly what drafting s steps from a row
        whose newest true position is p-s+1 sees."""
        return unroll(self, self.entries(tokens_next, feats), tokens_next, positions, steps)

    # files -----------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        path = Path(path).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS))
        (path / "config.json").write_text(json.dumps(self.config.to_json(), indent=2) + "\n")


def build_eagle(
    target,
    vocab_map: torch.Tensor | None = None,
    intermediate_size: int | None = None,
    n_predict: int = 5,
) -> EagleHead:
    """A fresh (fp32) head for a native target Transformer. It starts as the identity on
    the state (fc passes f_j through, the blocks' outputs are small): its first drafts
    repeat the target's last choice, a start near the states it must learn to predict."""
    tcfg = target.config
    V = tcfg.vocab_size
    vocab_map = torch.arange(V) if vocab_map is None else vocab_map.long()
    cfg = EagleConfig(
        hidden_size=tcfg.hidden_size,
        intermediate_size=intermediate_size or tcfg.intermediate_size,
        num_heads=tcfg.num_heads,
        num_kv_heads=tcfg.num_kv_heads,
        head_dim=tcfg.head_dim,
        vocab_size=len(vocab_map),
        target_vocab_size=V,
        rope_theta=tcfg.rope_theta,
        rms_norm_eps=tcfg.rms_norm_eps,
        n_predict=n_predict,
    )
    embed, rows = _tables(target, vocab_map)
    head = EagleHead(cfg, embed, rows.float(), vocab_map)  # embed is only indexed
    E = cfg.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, E:] = torch.eye(E)
        head.fc.bias.zero_()
        head.o.weight.mul_(0.1)
        head.down.weight.mul_(0.1)
        head.norm.weight.copy_(target.norm.weight.float())
    return head


def _tables(target, vocab_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    embed, head = target_tables(target)
    return embed.detach(), head.detach()[vocab_map.to(head.device)]


def is_eagle_dir(path: str | Path) -> bool:
    """True for a directory whose config.json describes an eagle head."""
    return read_config(path).get("model_type") == MODEL_TYPE


def load_eagle(
    path: str | Path,
    target,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> EagleHead:
    """Load an eagle head directory for `target` (whose tables it reads)."""
    path = Path(path).expanduser()
    config_file, weights = path / "config.json", path / WEIGHTS
    if not config_file.is_file():
        raise ModelNotFoundError(f"{path}: no config.json (not an eagle head directory)")
    if not weights.is_file():
        raise ModelNotFoundError(f"{path}: no {WEIGHTS} weight file")
    try:
        cfg = EagleConfig.from_json(json.loads(config_file.read_text()))
    except (ValueError, TypeError) as err:
        raise ModelIntegrityError(f"{config_file}: unreadable eagle head config ({err})") from err
    tcfg = target.config
    shape = (tcfg.hidden_size, tcfg.num_heads, tcfg.num_kv_heads, tcfg.head_dim, tcfg.vocab_size)
    if shape != (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.target_vocab_size,
    ):
        raise IncompatibleDraftError(
            f"the eagle head in {path} was built for another model (hidden {cfg.hidden_size}, "
            f"{cfg.num_heads}/{cfg.num_kv_heads} heads of {cfg.head_dim}, vocabulary "
            f"{cfg.target_vocab_size}); the target has hidden {tcfg.hidden_size}, "
            f"{tcfg.num_heads}/{tcfg.num_kv_heads} heads of {tcfg.head_dim}, vocabulary "
            f"{tcfg.vocab_size}"
        )
    tensors = _read(weights)  # a corrupt or truncated file: ModelIntegrityError
    vocab_map = tensors.get("vocab_map")
    if vocab_map is None or tuple(vocab_map.shape) != (cfg.vocab_size,):
        raise ModelIntegrityError(f"{weights}: needs a vocab_map of {cfg.vocab_size} ids")
    if int(vocab_map.min()) < 0 or int(vocab_map.max()) >= cfg.target_vocab_size:
        raise ModelIntegrityError(f"{weights}: vocab_map holds ids outside the vocabulary")
    embed, rows = _tables(target, vocab_map.long())
    with on_meta():
        model = EagleHead(cfg, embed.to("meta"), rows.to("meta"), vocab_map.to("meta"))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    wrong = [k for k in expected if k in tensors and tuple(tensors[k].shape) != expected[k]]
    if missing or extra or wrong:
        raise ModelIntegrityError(
            f"{weights}: tensors do not match config.json (missing: "
            f"{', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(extra[:5]) or 'none'}; "
            f"wrong shape: {', '.join(wrong[:5]) or 'none'})"
        )
    model = EagleHead(cfg, embed.to(device, dtype), rows.to(device, dtype), vocab_map)
    model.load_state_dict(tensors)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.embed = embed.to(device)  # only indexed: it keeps the target's dtype
    return model


__all__ = ["EagleConfig", "EagleHead", "build_eagle", "is_eagle_dir", "load_eagle"]


def unroll(head, x: torch.Tensor, tokens_next, positions, steps: int) -> list[torch.Tensor]:
    """Draft steps 1..steps from the true positions' entries `x [B, T, .]` of an eagle or
    EAGLE-3 head (`head.unrolled`'s docstring says what each step sees); each later step
    enters the state its previous step made one position earlier."""
    q, k, v = head.qkv(x, positions)
    preds = [head.after_attention(x, head.attend(q, k, v, causal=True))]
    T = x.shape[1]
    p = torch.arange(T, device=x.device)
    keys, values = [k], [v]
    for s in range(2, steps + 1):
        prev = torch.cat([preds[-1][:, :1], preds[-1][:, :-1]], 1)  # step s-1 at p-1
        xs = head.inputs(tokens_next, prev)
        qs, ks, vs = head.qkv(xs, positions)
        keys.append(ks)
        values.append(vs)
        blocks = [p[None, :] <= p[:, None] - s + 1]
        blocks += [p[None, :] == p[:, None] - (s - i) for i in range(2, s + 1)]
        mask = torch.cat(blocks, 1)  # [T, T * s]; a row always sees itself
        att = head.attend(qs, torch.cat(keys, 2), torch.cat(values, 2), mask=mask)
        preds.append(head.after_attention(xs, att))
    return preds
