"""The OpenAI wire format: request bodies (validated by pydantic), response bodies, errors.

Field names, defaults and ranges follow the OpenAI API so that its official client and the
tools built on it work unchanged. Extensions are few and named as such: `top_k`,
`ignore_eos`, `speculate` (this request may use the drafter, or not),
`stream_options.include_speculation` (per-token provenance in the stream, see
`provenance.py`), and the `speculation` object inside `usage`. The new booleans are strict
(`"yes"` or `1` is a 400, not a guess).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from specdec.params import SamplingParams
from specdec.stats import SpecStats

MAX_N = 16  # choices per request
MAX_STOP = 4  # stop strings per request, as OpenAI allows


class StreamOptions(BaseModel):
    include_usage: bool = False
    include_speculation: StrictBool = False  # extension: per-token provenance


class _SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0  # extension; 0 or -1 disable it
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension, for benchmarks
    speculate: StrictBool | None = None  # extension: None follows the server
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def unsupported(self) -> str | None:
        """The first parameter set to something this server does not implement."""
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty" if self.presence_penalty else "frequency_penalty"
        if self.logprobs not in (None, False, 0):
            return "logprobs"
        if self.logit_bias:
            return "logit_bias"
        return None

    def sampling_params(self, max_tokens: int, index: int = 0) -> SamplingParams:
        """Choice `index` of n: seeded requests give choice i the seed `seed + i`."""
        seed = None if self.seed is None else (self.seed + index) % 2**63
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            seed=seed,
            max_tokens=max_tokens,
            stop=tuple(self.stop or ()),
            ignore_eos=self.ignore_eos,
            speculate=self.speculate is not False,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def include_speculation(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_speculation)


class CompletionRequest(_SamplingFields):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    echo: bool = False
    suffix: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: Any = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# ---- responses ---------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(
    prompt_tokens: int, completion_tokens: int, stats: SpecStats | None, heads: dict | None = None
) -> dict:
    """OpenAI's usage object plus a `speculation` extension with the request's figures
    (and, when the heads learn while serving, the learner's under `heads`)."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if stats is not None:  # OpenAI's field: prompt tokens served from the prefix cache
        body["prompt_tokens_details"] = {"cached_tokens": stats.cached_tokens}
        body["speculation"] = {
            "target_passes": stats.steps,
            "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted,
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "mean_accepted_length": round(stats.mean_accepted_length, 4),
            "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position],
        }
        if heads is not None:
            body["speculation"]["heads"] = heads
    return body


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None):
    """The OpenAI error schema."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}
