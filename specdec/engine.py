"""The decoding engine: requests in, completions out.

`Engine` runs batches of token-id requests on a native `Transformer`. Live sequences are
kept packed in the first rows of the KV cache; a sequence that finishes hands its row to
the last live one, so the model never computes a finished row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.config import SamplingParams
from specdec.errors import ContextLengthError, InvalidParameterError
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Transformer
from specdec.sampling import make_generator, param_tensors, probs_from_logits, sample
from specdec.tokenization import StopChecker


@dataclass
class Completion:
    """One request's result and timings."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    elapsed_s: float  # from the start of the batch until this request finished
    ttft_s: float  # time to first token

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_tokens": self.prompt_tokens,
            "num_generated": self.num_generated,
            "finish_reason": self.finish_reason,
            "elapsed_s": round(self.elapsed_s, 4),
            "ttft_s": round(self.ttft_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
        }


@dataclass
class LiveSequence:
    """Decoding state of one request while it is live."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    stop: StopChecker
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    first_token_at: float | None = None
    finished_at: float | None = None

    def append(self, token: int, eos_ids: frozenset[int], now: float) -> None:
        """Add one generated token and decide whether the sequence is finished."""
        self.output_ids.append(token)
        if self.first_token_at is None:
            self.first_token_at = now
        if token in eos_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
        elif self.stop.hit(self.output_ids):
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.finished_at = now

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine:
    """Plain (non-speculative) decoding over a native transformer."""

    def __init__(
        self,
        model: Transformer,
        tokenizer,
        eos_ids: frozenset[int],
        max_batch: int = 8,
    ) -> None:
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_batch = max_batch

    @property
    def context_length(self) -> int:
        return self.model.config.max_position_embeddings

    def check_fits(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse, before any work, a request that cannot fit the model's context."""
        n, ctx = len(prompt_ids), self.context_length
        if n == 0:
            raise InvalidParameterError("the prompt is empty (it must have at least one token)")
        if n >= ctx:
            raise ContextLengthError(
                f"the prompt has {n} tokens but the model's context is {ctx} tokens"
            )
        if n + params.max_tokens > ctx:
            raise ContextLengthError(
                f"the prompt has {n} tokens and max_tokens is {params.max_tokens}: "
                f"{n + params.max_tokens} exceeds the model's context of {ctx} tokens"
            )

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
    ) -> list[Completion]:
        """Generate for each prompt (token ids); batches of up to `max_batch` at a time."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidParameterError("give one SamplingParams, or one per prompt")
        for ids, p in zip(prompts, params, strict=True):
            self.check_fits(ids, p)
        results: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch):
            chunk = slice(start, start + self.max_batch)
            results.extend(self._generate_batch(prompts[chunk], params[chunk]))
        return results

    def _generate_batch(self, prompts, params) -> list[Completion]:
        device = self.model.device
        seqs = [
            LiveSequence(
                list(ids), p, make_generator(p.seed, device), StopChecker(self.tokenizer, p.stop)
            )
            for ids, p in zip(prompts, params, strict=True)
        ]
        max_len = max(len(s.prompt_ids) + s.params.max_tokens for s in seqs)
        cache = self.model.new_cache(len(seqs), max_len)
        started = time.perf_counter()
        live = list(seqs)  # live[i] owns cache row i
        logits = self._prefill(live, cache)
        while live:
            tokens = self._sample(logits, live).tolist()  # the one host sync per step
            now = time.perf_counter()
            for seq, token in zip(live, tokens, strict=True):
                seq.append(token, self.eos_ids, now)
            _drop_finished(live, cache)
            if not live:
                break
            last = torch.tensor([[s.output_ids[-1]] for s in live], device=device)
            logits = self.model(last, cache).logits[:, -1]
        return [self._completion(s, started) for s in seqs]

    def _prefill(self, live: list[LiveSequence], cache: KVCache) -> torch.Tensor:
        """Run all prompts at once (right-padded); logits `[B, V]` at each prompt's end."""
        lengths = torch.tensor([len(s.prompt_ids) for s in live])
        tokens = torch.zeros(len(live), int(lengths.max()), dtype=torch.long)
        for i, s in enumerate(live):
            tokens[i, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids)
        out = self.model(
            tokens.to(self.model.device), cache, num_new=lengths, logits_at=(lengths - 1)[:, None]
        )
        return out.logits[:, 0]

    def _sample(self, logits: torch.Tensor, live: list[LiveSequence]) -> torch.Tensor:
        params = [s.params for s in live]
        probs = probs_from_logits(logits, *param_tensors(params, logits.device))
        return sample(probs, [s.generator for s in live], [p.greedy for p in params])

    def _completion(self, seq: LiveSequence, started: float) -> Completion:
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        return Completion(
            text=seq.stop.cut(text),
            token_ids=seq.output_ids,
            prompt_tokens=len(seq.prompt_ids),
            finish_reason=seq.finish_reason or "length",
            elapsed_s=(seq.finished_at or time.perf_counter()) - started,
            ttft_s=(seq.first_token_at or started) - started,
        )


def _drop_finished(live: list[LiveSequence], cache: KVCache) -> None:
    """Remove finished sequences, moving the last live row into each freed slot."""
    i = 0
    while i < len(live):
        if not live[i].finished:
            i += 1
            continue
        last = len(live) - 1
        if i != last:
            cache.move_row(last, i)
            live[i] = live[last]
        else:
            cache.reset_row(i)
        live.pop()
