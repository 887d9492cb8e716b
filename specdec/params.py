"""User-facing configuration: frozen, validated dataclasses shared by CLI, server and API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specdec.errors import InvalidParameterError

MAX_TOP_LOGPROBS = 20  # alternatives per position, as OpenAI allows
GRAMMAR_KINDS = ("json_object", "json_schema", "lark", "regex")


@dataclass(frozen=True)
class Grammar:
    """A constraint on the output: `kind` "json_object" (any JSON object; `text` unused),
    "json_schema" (`text` a JSON schema), "lark" or "regex" (`text` the grammar). The
    engine compiles it with its grammar engine (`specdec.grammar`)."""

    kind: Literal["json_object", "json_schema", "lark", "regex"]
    text: str = ""

    def __post_init__(self) -> None:
        _check(self.kind in GRAMMAR_KINDS, f"grammar kind must be one of {GRAMMAR_KINDS}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    The transform order is temperature -> top-k -> top-p (top-p on the renormalised top-k
    distribution), the same for the target and any drafter.
    """

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    seed: int | None = None
    """Seed of this request's own random generator; None draws a fresh one."""
    max_tokens: int = 128
    """Most tokens to generate."""
    stop: tuple[str, ...] = ()
    """Strings that end the generation; the text is cut before the first one."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence tokens (benchmarks want fixed lengths)."""
    speculate: bool = True
    """Let the engine's drafter work for this request; False verifies no draft tokens for
    it (the same output, plain decoding's pace), so one server can show both side by side."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated (OpenAI's; in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Times the token's count so far, subtracted from its logit (OpenAI's; in [-2, 2])."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias in [-100, 100]) pairs added to the logits; a dict is accepted."""
    logprobs: int | None = None
    """Report each generated token's log probability and this many alternatives (0-20)
    under the distribution it was sampled from; None reports none."""
    grammar: Grammar | None = None
    """Constrain the output (JSON, a schema, a grammar); see `Grammar`."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(all(s for s in self.stop), "stop strings must be non-empty")
        if self.seed is not None:
            _check(0 <= self.seed < 2**63, f"seed must be in [0, 2**63), got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, f"{name} must be in [-2, 2], got {value}")
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else bias
        pairs = tuple(sorted((int(t), float(b)) for t, b in pairs))
        object.__setattr__(self, "logit_bias", pairs)
        for token, b in pairs:
            _check(token >= 0, f"logit_bias: token ids must be >= 0, got {token}")
            _check(-100 <= b <= 100, f"logit_bias: values must be in [-100, 100], got {b}")
        if self.logprobs is not None:
            _check(
                0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}",
            )

    @property
    def processed(self) -> bool:
        """Whether the logits go through a processor (`specdec.processors`) first."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.logit_bias or self.grammar
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidParameterError(message)
