"""User-facing configuration: frozen, validated dataclasses shared by CLI, server and API."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidParameterError


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidParameterError(message)
