"""The Python API: load a model by name or path, generate from text prompts.

>>> from specdec import LLM, SamplingParams          # doctest: +SKIP
>>> llm = LLM("qwen2.5-coder-1.5b-instruct")          # doctest: +SKIP
>>> llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=32))[0].text
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.config import SamplingParams
from specdec.engine import Completion, Engine
from specdec.models.loading import load_transformer
from specdec.tokenization import encode_prompt, eos_token_ids, load_tokenizer


class LLM:
    """A loaded model plus its tokenizer, ready to generate."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "bf16",
        device: str = "cpu",
        max_batch: int = 8,
    ) -> None:
        from specdec.models.registry import resolve

        path = resolve(model, dtype)
        self.name = model
        self.path = path
        self.tokenizer = load_tokenizer(path)
        self.model = load_transformer(path, dtype, torch.device(device))
        self.engine = Engine(
            self.model, self.tokenizer, eos_token_ids(path, self.tokenizer), max_batch
        )

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def generate(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool = False,
    ) -> list[Completion]:
        """Complete each prompt (wrapped in the chat template when `chat`)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = [self.encode(p, chat) for p in prompts]
        return self.engine.generate(ids, params or SamplingParams())
