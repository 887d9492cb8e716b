"""The decoding engine: requests in, completions out, speculatively when given a drafter.

`Engine` runs batches of token-id requests on a native `Transformer`. Live sequences are
kept packed in the first rows of the KV cache (and of the drafter's state); a sequence that
finishes hands its row to the last live one, so no model computes a finished row.

Plain decoding is the k = 0 case of the speculative step: one step per token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.acceptors import Draft, RejectionSampler, TokenAcceptor
from specdec.config import SamplingParams
from specdec.cost_model import AdaptiveWindow, FixedWindow
from specdec.drafters.base import Drafter
from specdec.errors import ContextLengthError, InvalidParameterError
from specdec.metrics import SpecStats
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Transformer, right_pad
from specdec.sampling import make_generator, param_tensors, probs_from_logits
from specdec.tokenization import StopChecker


@dataclass
class Completion:
    """One request's result and timings."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    stats: SpecStats  # steps, drafted/accepted tokens, timings

    @property
    def elapsed_s(self) -> float:
        """From the start of the batch until this request finished."""
        return self.stats.elapsed_s

    @property
    def ttft_s(self) -> float:
        return self.stats.ttft_s

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
            "spec": self.stats.to_dict(),
        }


@dataclass
class LiveSequence:
    """Decoding state of one request while it is live."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    stop: StopChecker
    output_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=lambda: SpecStats(requests=1))
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
    """Decoding over a native transformer; speculative when given a drafter.

    Each step follows Algorithm 1 of Leviathan et al.: the drafter proposes k tokens per
    row, the target scores all k+1 positions in one pass, the acceptor keeps a prefix plus
    one token, and both caches roll back to what was kept. `window` chooses k per step.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer,
        eos_ids: frozenset[int],
        max_batch: int = 8,
        drafter_factory=None,
        acceptor: TokenAcceptor | None = None,
        window: FixedWindow | AdaptiveWindow | None = None,
    ) -> None:
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_batch = max_batch
        # drafter_factory(max_batch, max_len) -> Drafter: drafters size their state per batch.
        self.drafter_factory = drafter_factory
        self.acceptor = acceptor or RejectionSampler()
        self.window = window or FixedWindow(0)
        if drafter_factory is None and self.window.k_max:
            raise InvalidParameterError("speculation needs a drafter (--draft MODEL|ngram)")
        if not isinstance(self.acceptor, TokenAcceptor):
            raise InvalidParameterError(
                f"{type(self.acceptor).__name__} is not a TokenAcceptor: it needs a "
                "`lossless` attribute and __call__(draft, target_probs, generators)"
            )

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
        # Headroom: a verify pass writes k+1 positions before rolling back.
        max_len = max(len(s.prompt_ids) + s.params.max_tokens for s in seqs)
        max_len += self.window.k_max + 2
        cache = self.model.new_cache(len(seqs), max_len)
        drafter = self.drafter_factory(len(seqs), max_len) if self.drafter_factory else None
        started = time.perf_counter()
        live = list(seqs)  # live[i] owns cache row i (and drafter row i)
        first = self._prefill(live, cache)
        now = time.perf_counter()
        for seq, token in zip(live, first.tolist(), strict=True):
            seq.append(token, self.eos_ids, now)
        _drop_finished(live, [cache])
        if drafter is not None and live:
            drafter.admit([s.prompt_ids + s.output_ids for s in live])
        holders = [cache] if drafter is None else [cache, drafter]
        while live:
            self._step(live, cache, drafter)
            _drop_finished(live, holders)
        return [self._completion(s, started) for s in seqs]

    def _step(self, live: list[LiveSequence], cache: KVCache, drafter: Drafter | None) -> None:
        """Propose -> verify -> accept -> roll back, for every live row."""
        B, device = len(live), self.model.device
        params = [s.params for s in live]
        generators = [s.generator for s in live]
        k = self.window.choose(B)
        t0 = time.perf_counter()
        if drafter is None:
            draft = Draft.empty(B, device)
        else:  # at k = 0 a drafter proposes nothing but may keep its state in step
            draft = drafter.propose(k, params, generators)  # tokens [B, k], q [B, k, V]
        t1 = time.perf_counter()
        # Verify: the last committed token and the draft, k+1 positions in one target pass.
        last = torch.tensor([[s.output_ids[-1]] for s in live], device=device)
        start = cache.lengths[:B].clone()
        logits = self.model(
            torch.cat([last, draft.tokens.to(device)], 1), cache, num_new=1 + draft.lengths
        ).logits  # [B, k+1, V]
        target_probs = self._probs(logits, params)  # [B, k+1, V]
        verdict = self.acceptor(draft, target_probs, generators)
        accepted = verdict.num_accepted.cpu()
        # Roll back: keep the last committed token and the accepted drafts.
        cache.truncate(start + 1 + accepted)
        next_tokens = verdict.tokens.gather(1, verdict.num_accepted[:, None])[:, 0]
        if drafter is not None:
            drafter.commit(verdict.num_accepted, next_tokens)
        emitted = verdict.tokens.tolist()  # the one host sync of the step
        now = time.perf_counter()
        lengths = draft.lengths.tolist()
        for seq, row, n, drafted in zip(live, emitted, accepted.tolist(), lengths, strict=True):
            seq.stats.record_step(drafted, n)
            for token in row[: n + 1]:
                seq.append(token, self.eos_ids, now)
                if seq.finished:
                    break
        self.window.observe(B, k, now - t1, t1 - t0, *_conditional_counts(accepted, draft))

    def _prefill(self, live: list[LiveSequence], cache: KVCache) -> torch.Tensor:
        """Run all prompts at once (right-padded); sample each row's first token `[B]`."""
        tokens, lengths = right_pad([s.prompt_ids for s in live], self.model.device)
        out = self.model(tokens, cache, num_new=lengths, logits_at=(lengths - 1)[:, None])
        probs = self._probs(out.logits, [s.params for s in live])
        draft = Draft.empty(len(live), self.model.device)
        verdict = self.acceptor(draft, probs, [s.generator for s in live])
        return verdict.tokens[:, 0]

    @staticmethod
    def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """The request's transform applied at every position: `[B, T, V]` -> `[B, T, V]`."""
        B, T, V = logits.shape
        temperature, top_k, top_p = param_tensors(params, logits.device)
        flat = probs_from_logits(
            logits.reshape(B * T, V),
            temperature.repeat_interleave(T),
            top_k.repeat_interleave(T),
            top_p.repeat_interleave(T),
        )
        return flat.view(B, T, V)

    def _completion(self, seq: LiveSequence, started: float) -> Completion:
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        stats = seq.stats
        stats.generated = len(seq.output_ids)
        stats.elapsed_s = (seq.finished_at or time.perf_counter()) - started
        stats.ttft_s = (seq.first_token_at or started) - started
        return Completion(
            text=seq.stop.cut(text),
            token_ids=seq.output_ids,
            prompt_tokens=len(seq.prompt_ids),
            finish_reason=seq.finish_reason or "length",
            stats=stats,
        )


def _conditional_counts(accepted: torch.Tensor, draft: Draft) -> tuple[list[int], list[int]]:
    """Per draft position i: rows that tested it (all earlier drafts kept, i < length) and
    rows that kept it; their ratio is the conditional acceptance the window plans with."""
    positions = torch.arange(draft.k)[None, :]
    reached = (accepted[:, None] >= positions) & (positions < draft.lengths[:, None])
    kept = accepted[:, None] > positions
    return reached.sum(0).tolist(), kept.sum(0).tolist()


def _drop_finished(live: list[LiveSequence], holders: list) -> None:
    """Remove finished sequences, moving the last live row into each freed slot of every
    row holder (the target's cache, the drafter)."""
    i = 0
    while i < len(live):
        if not live[i].finished:
            i += 1
            continue
        last = len(live) - 1
        for holder in holders:
            if i != last:
                holder.move_row(last, i)
            else:
                holder.reset_row(i)
        if i != last:
            live[i] = live[last]
        live.pop()
