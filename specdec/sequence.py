"""A request inside the engine (`LiveSequence`) and what it returns (`Completion`), with
the row bookkeeping the engine does for them: tokens left, clocks, packing finished rows."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specdec.logprobs import TokenLogprob
from specdec.params import SamplingParams
from specdec.processors import RequestProcessor
from specdec.stats import SpecStats
from specdec.tokenization import StopChecker


@dataclass
class Completion:
    """One request's result and timings."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "abort"
    stats: SpecStats  # steps, drafted/accepted tokens, timings
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for

    @property
    def elapsed_s(self) -> float:
        """From the request's arrival until it finished."""
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


@dataclass(eq=False)  # identity: two requests are never "equal"
class LiveSequence:
    """Decoding state of one request while it is live."""

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    stop: StopChecker
    request_id: str | None = None
    # The clock looked up at each call, not bound at import: a test may patch it.
    arrived_at: float = field(default_factory=lambda: time.perf_counter())
    output_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=lambda: SpecStats(requests=1))
    finish_reason: str | None = None
    # One (drafted, kept, emitted) per decode step: tokens output_ids[1:] came from these
    # steps in order, the first `kept` of each step's `emitted` being accepted draft
    # tokens and the rest the target's own (output_ids[0] is the prefill's).
    trace: list[tuple[int, int, int]] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    # Logits processing (penalties, logit_bias, a grammar), following the output.
    processor: RequestProcessor | None = None
    # The emitted tokens' log probabilities, when asked for; a pass queues its tokens'
    # entries in `offered` (`specdec.logprobs.offer_logprobs`) and `append` takes them.
    logprobs: list[TokenLogprob] | None = None
    offered: deque[TokenLogprob] = field(default_factory=deque)

    def append(self, token: int, eos_ids: frozenset[int], now: float) -> None:
        """Add one generated token and decide whether the sequence is finished."""
        self.output_ids.append(token)
        if self.processor is not None:
            self.processor.accept(token)
        if self.logprobs is not None:
            self.logprobs.append(self.offered.popleft())
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


def postpone(seqs: list[LiveSequence], seconds: float) -> None:
    """Move the requests' clocks on by `seconds` their engine did not run (a caller's time
    between `generate_steps`' nexts), so that their TTFT and elapsed time are its own."""
    for seq in seqs:
        seq.arrived_at += seconds
        if seq.first_token_at is not None:
            seq.first_token_at += seconds


def tokens_left(seq: LiveSequence) -> int:
    """The most tokens `seq` may still generate."""
    return seq.params.max_tokens - len(seq.output_ids)


def drop_finished(live: list[LiveSequence], holders: list, start: int = 0) -> None:
    """Remove finished sequences (from index `start` on), moving the last live row into
    each freed slot of every row holder (the target's cache, the drafter)."""
    i = start
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
