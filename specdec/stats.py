"""SpecStats: the one definition of speculation metrics used by the CLI, the benchmarks and
the server, per request and in aggregate (stats add up with `+`).

Definitions (docs/design/glossary.md):
- acceptance rate = accepted / drafted draft tokens.
- mean accepted length = tokens emitted per target pass = 1 + accepted / steps, counting
  the recovered-or-bonus token; 1.0 for plain decoding.
- acceptance at position i = P(draft token i accepted | it was drafted).
- time per output token (TPOT) = (elapsed - time to first token) / (generated - 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    steps: int = 0  # target decode passes (the prefill is not a step)
    drafts: int = 0  # steps that verified at least one draft token
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens kept
    generated: int = 0  # tokens emitted (the first, from the prefill, included)
    drafted_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    elapsed_s: float = 0.0
    requests: int = 0
    cached_tokens: int = 0  # prompt positions copied from the prefix cache, not computed

    def record_step(self, drafted: int, accepted: int) -> None:
        """One target pass in which this row verified `drafted` tokens and kept `accepted`."""
        self.steps += 1
        self.drafts += drafted > 0
        self.drafted += drafted
        self.accepted += accepted
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1 + self.accepted / self.steps if self.steps else 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (per request; an average in aggregate)."""
        return (self.elapsed_s - self.ttft_s) / (self.generated - 1) if self.generated > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def __add__(self, other: SpecStats) -> SpecStats:
        """Aggregate: counts add up; times are summed too (so `tpot_s` stays a per-token
        average and `tokens_per_s` is per request-second, not wall throughput)."""
        width = max(len(self.drafted_at), len(other.drafted_at))

        def add(xs: list[int], ys: list[int]) -> list[int]:
            xs, ys = xs + [0] * (width - len(xs)), ys + [0] * (width - len(ys))
            return [x + y for x, y in zip(xs, ys, strict=True)]

        return SpecStats(
            steps=self.steps + other.steps,
            drafts=self.drafts + other.drafts,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            generated=self.generated + other.generated,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            drafted_at=add(self.drafted_at, other.drafted_at),
            accepted_at=add(self.accepted_at, other.accepted_at),
            ttft_s=self.ttft_s + other.ttft_s,
            elapsed_s=self.elapsed_s + other.elapsed_s,
            requests=self.requests + other.requests,
        )

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "drafts": self.drafts,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "cached_prompt_tokens": self.cached_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_per_position": [round(a, 4) for a in self.acceptance_per_position],
            "time_per_output_token_s": round(self.tpot_s, 5),
            "time_to_first_token_s": round(self.ttft_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
        }
