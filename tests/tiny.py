"""Tiny randomly initialised transformers models shared by the tests (no downloads)."""

from __future__ import annotations

import torch
import transformers

from specdec.models.config import ModelConfig
from specdec.models.loading import build_transformer

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def hf_tiny(kind: str = "llama", seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A random fp32 transformers model of the given family."""
    config_cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[kind]
    model_cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[kind]
    config = config_cls(**{**TINY, **overrides})
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # random biases too, so the qkv-bias path is really exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def native_from_hf(hf_model, dtype=torch.float32):
    cfg = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    return build_transformer(cfg, hf_model.state_dict(), dtype)


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII + <unk> + <eos>: 97 ids, like TINY."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>"
    )


def staggered(engine, prompts, params):
    """Run `engine` with requests arriving one per step: each joins a batch already
    mid-generation, and finished ones leave (their rows repacked). Returns the sequences
    in arrival order."""
    seqs, pending = [], list(zip(prompts, params, strict=True))
    while pending or engine.has_work:
        if pending:
            seqs.append(engine.add_request(*pending.pop(0)))
        engine.step()
    return seqs


def plain_greedy_references(tokenizer, prompts, max_tokens: int, kind: str = "qwen2"):
    """(target, greedy outputs of `prompts`, their SamplingParams) on a fresh tiny fp32
    target: the references the speculative equivalence tests compare against."""
    from specdec.engine import Engine
    from specdec.params import SamplingParams

    target = native_from_hf(hf_tiny(kind))
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    refs = [c.token_ids for c in Engine(target, tokenizer, frozenset()).generate(prompts, params)]
    return target, refs, params
