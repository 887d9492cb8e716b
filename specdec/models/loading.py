"""Load a native `Transformer` from a Hugging Face directory (config.json + safetensors).

Hugging Face names are mapped onto the native modules here, and q/k/v and gate/up are
fused, so the model file stays free of checkpoint-format concerns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specdec.errors import InvalidParameterError, ModelIntegrityError, ModelNotFoundError
from specdec.kernels import mapped
from specdec.models.config import ModelConfig
from specdec.models.transformer import Transformer, on_meta

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidParameterError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def native_state_dict(hf: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Llama-family state dict to native names, fusing projections."""
    return dict(native_tensors(hf, cfg))


def native_tensors(
    hf: Mapping[str, torch.Tensor], cfg: ModelConfig, wanted: Callable[[str], bool] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(native name, tensor) of a Hugging Face Llama-family state dict, projections fused,
    one at a time: a tensor of `hf` is read only when its native name is `wanted` (all by
    default), so a lazy `hf` (`LazySafetensors`) is read one tensor at a time. Missing
    tensors are checked first, before any is read."""
    wanted = wanted or (lambda name: True)
    plain = list(_plain_names(cfg))
    fused = [
        (f"layers.{i}.{name}.{suffix}", [f"model.layers.{i}.{p}.{suffix}" for p in parts])
        for i in range(cfg.num_layers)
        for name, parts in _FUSED.items()
        for suffix in ("weight", "bias")
        if suffix == "weight" or _has_bias(name, cfg)
    ]
    missing = [h for _, h in plain if h not in hf]
    missing += [h for _, hs in fused for h in hs if h not in hf]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelIntegrityError(f"checkpoint is missing {len(missing)} tensors: {shown}")
    for native, hf_name in plain:
        if wanted(native):
            yield native, hf[hf_name]
    for native, parts in fused:
        if wanted(native):
            tensors = [hf[h] for h in parts]
            fused_tensor = torch.cat(tensors, dim=0)
            mapped.release(tensors)  # the copy is what is read from now on
            yield native, fused_tensor


class LazySafetensors(Mapping):
    """The tensors of a model directory's safetensors files, each read when asked for
    (and not kept): what a quantizing load streams through. Corrupt files are named."""

    def __init__(self, path: Path) -> None:
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ModelNotFoundError(f"{path}: no *.safetensors weight files")
        self._where: dict[str, Path] = {}
        self._open: dict[Path, object] = {}
        for file in files:
            handle = self._handle(file)
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                self._where[name] = file

    def _handle(self, file: Path):
        if file not in self._open:
            try:
                self._open[file] = safe_open(file, framework="pt")
            except (SafetensorError, OSError, RuntimeError) as err:
                raise ModelIntegrityError(
                    f"{file}: corrupt or truncated safetensors file ({err})"
                ) from err
        return self._open[file]

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._where[name]
        try:
            return self._handle(file).get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ModelIntegrityError(
                f"{file}: corrupt or truncated safetensors file ({err})"
            ) from err

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where


def _has_bias(fused: str, cfg: ModelConfig) -> bool:
    return cfg.qkv_bias if fused.startswith("self_attn") else cfg.mlp_bias


def _plain_names(cfg: ModelConfig) -> Iterator[tuple[str, str]]:
    yield "embed_tokens.weight", "model.embed_tokens.weight"
    yield "norm.weight", "model.norm.weight"
    yield (
        "lm_head.weight",
        ("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"),
    )
    for i in range(cfg.num_layers):
        prefix = f"model.layers.{i}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            yield f"layers.{i}.{name}", prefix + name
        yield f"layers.{i}.self_attn.o_proj.weight", prefix + "self_attn.o_proj.weight"
        if cfg.o_bias:
            yield f"layers.{i}.self_attn.o_proj.bias", prefix + "self_attn.o_proj.bias"
        yield f"layers.{i}.mlp.down_proj.weight", prefix + "mlp.down_proj.weight"
        if cfg.mlp_bias:
            yield f"layers.{i}.mlp.down_proj.bias", prefix + "mlp.down_proj.bias"


def build_transformer(
    cfg: ModelConfig,
    hf_state: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> Transformer:
    """Instantiate without allocating random weights, then adopt the checkpoint's tensors."""
    with on_meta():
        model = Transformer(cfg)
    state = {
        k: v.to(device=device, dtype=dtype) for k, v in native_state_dict(hf_state, cfg).items()
    }
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = torch.tensor(cfg.inv_freq(), dtype=torch.float32, device=device)
    return model.eval().requires_grad_(False)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a model directory; corrupt or truncated files are named in the error."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path}: no *.safetensors weight files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    tensors[name] = f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ModelIntegrityError(
                f"{file}: corrupt or truncated safetensors file ({err})"
            ) from err
    return tensors


def load_transformer(
    path: str | Path, dtype: str = "bf16", device: torch.device | str = "cpu"
) -> Transformer:
    """Load the native model from a Hugging Face directory (a tensor-parallel shard:
    `specdec.distributed.sharding.load_shard`)."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"model path {path} does not exist")
    cfg = ModelConfig.from_dir(path)
    return build_transformer(cfg, read_safetensors(path), torch_dtype(dtype), device)
