"""The OpenAI wire format: request bodies (validated by pydantic), response bodies, errors.

Field names, defaults and ranges follow the OpenAI API so that its official client and the
tools built on it work unchanged. Extensions are few and named as such: `top_k`,
`ignore_eos`, `speculate` (this request may use the drafter, or not),
`stream_options.include_speculation` (per-token provenance in the stream, see
`provenance.py`), and the `speculation` object inside `usage`. The new booleans are strict
(`"yes"` or `1` is a 400, not a guess).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from specdec.params import MAX_TOP_LOGPROBS, Grammar, SamplingParams
from specdec.serving.tools import template_message, tool_grammar
from specdec.stats import SpecStats

MAX_N = 16  # choices per request
MAX_STOP = 4  # stop strings per request, as OpenAI allows


class StreamOptions(BaseModel):
    include_usage: bool = False
    include_speculation: StrictBool = False  # extension: per-token provenance


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON under a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a response_format of type json_schema needs its json_schema")
        return self

    def grammar(self) -> Grammar | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Grammar("json_object")
        return Grammar("json_schema", json.dumps(self.json_schema.schema_))


Penalty = Annotated[float, Field(ge=-2, le=2)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]


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
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.strip().isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
        return value

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
        return None

    @property
    def top_logprobs_count(self) -> int | None:
        """Alternatives per token, or None for no logprobs (each endpoint's own field)."""
        return None

    def grammar(self) -> Grammar | None:
        """The constraint on the answer, if any."""
        return None if self.response_format is None else self.response_format.grammar()

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
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            logprobs=self.top_logprobs_count,
            grammar=self.grammar(),
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
    logprobs: TopLogprobs | None = None  # the legacy API's: alternatives per token

    @property
    def top_logprobs_count(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return template_message(out)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    logprobs: StrictBool = False
    top_logprobs: TopLogprobs | None = None

    @property
    def top_logprobs_count(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError("tools: function names must be distinct")
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names {self.tool_choice.function.name!r}, not a tool"
                )
        fmt = self.response_format
        if self.forced_tool and fmt is not None and fmt.type != "text":
            raise ValueError("response_format and a required tool call cannot both constrain")
        return self

    @property
    def functions(self) -> list[dict[str, Any]]:
        """The tools' function definitions (none when tool_choice is "none")."""
        if self.tool_choice == "none":
            return []
        return [t.function.model_dump(exclude_none=True) for t in self.tools or []]

    @property
    def forced_tool(self) -> bool:
        """Whether the answer must be a tool call (tool_choice "required" or named)."""
        return bool(self.tools) and self.tool_choice not in (None, "none", "auto")

    def grammar(self) -> Grammar | None:
        if self.forced_tool:
            choice = self.tool_choice
            return tool_grammar(
                self.functions, choice if choice == "required" else choice.model_dump()
            )
        return super().grammar()

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
