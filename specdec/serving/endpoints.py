"""The generation endpoints (/v1/completions, /v1/chat/completions) over one engine, and
the checks every request passes before the engine sees it."""

from __future__ import annotations

import secrets

from fastapi import Request

from specdec.engine import Engine
from specdec.errors import ContextLengthError, SpecdecError
from specdec.serving.async_engine import AsyncEngine, QueueFullError
from specdec.serving.logprobs import LogprobFormatter
from specdec.serving.metrics import ServerMetrics
from specdec.serving.protocol import ChatCompletionRequest, CompletionRequest, new_id, now
from specdec.serving.responses import (
    APIError,
    collect,
    envelope,
    finish_reason,
    sse,
    stream,
    total_usage,
)
from specdec.serving.tool_stream import ToolCallParser, merged_calls
from specdec.tokenization import encode_chat


class Service:
    """What the routes of `build_app` call: one engine behind its `AsyncEngine`, the id
    clients must ask for, the API key if any, and the learner whose figures usage reports."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        *,
        api_key=None,
        max_queue=256,
        sync=None,
        learner=None,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key
        self.learner = learner
        self.metrics = ServerMetrics()
        self.runner = AsyncEngine(engine, self.metrics, max_queue, sync)
        self.tokenizer = engine.tokenizer
        self.vocab_size = len(self.tokenizer)
        self.can_speculate = engine.drafter_factory is not None
        self.formatter = LogprobFormatter(engine)

    def heads(self) -> dict | None:
        return None if self.learner is None else self.learner.metrics()

    # ---- checks shared by the endpoints ---------------------------------------------------

    async def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), self.api_key):
            raise APIError(401, "invalid API key", code="invalid_api_key")

    def check_request(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        if req.model != self.model_name:
            raise APIError(
                404,
                f"the model '{req.model}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )
        if bad := req.unsupported():
            raise APIError(400, f"{bad} is not supported by this server", param=bad)
        if req.speculate and not self.can_speculate:
            raise APIError(
                400,
                "speculate: this server has no drafter (start it with --draft)",
                param="speculate",
            )
        if req.include_speculation and not req.stream:
            raise APIError(
                400,
                "stream_options.include_speculation needs stream: true",
                param="stream_options",
            )

    def limit_for(self, prompt_ids: list[int]) -> int:
        """Most new tokens a prompt leaves room for."""
        engine = self.engine
        ctx = engine.context_length
        if engine.max_len is not None:
            ctx = min(ctx, engine.max_len - engine.headroom)
        return ctx - len(prompt_ids)

    def plan(self, req, prompts: list[list[int]], max_tokens: int | None):
        """(prompt ids, SamplingParams) per choice; choice i of prompt j has index j*n + i."""
        items = []
        for ids in prompts:
            if any(t >= self.vocab_size for t in ids):
                raise APIError(400, f"prompt token ids must be < {self.vocab_size}", param="prompt")
            wanted = max_tokens if max_tokens is not None else max(self.limit_for(ids), 1)
            for i in range(req.n):
                try:
                    items.append((ids, req.sampling_params(wanted, i)))
                except SpecdecError as err:
                    raise APIError(400, str(err)) from err
        return items

    def submit(self, items, request_id: str):
        try:
            return self.runner.submit(items, request_id)
        except ContextLengthError as err:
            raise APIError(400, str(err), code="context_length_exceeded") from err
        except SpecdecError as err:
            raise APIError(400, str(err)) from err
        except QueueFullError as err:
            raise APIError(429, str(err), code="queue_full") from err

    def model_card(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": now(), "owned_by": "specdec"}
        card["max_model_len"] = self.limit_for([])
        card["speculation"] = {"drafter": self.can_speculate, "k_max": self.engine.window.k_max}
        return card

    def _streamed(self, handles, events, chunk, req, prompts, echo=None, **options):
        """A request's choices as server-sent events (`responses.stream`)."""
        body = stream(
            self.runner,
            handles,
            events,
            self.tokenizer,
            chunk,
            req,
            prompts,
            echo,
            heads=self.heads,
            **options,
        )
        return sse(body)

    # ---- the endpoints -------------------------------------------------------------------

    async def completions(self, req: CompletionRequest, request: Request):
        self.check_request(req)
        tokenizer, formatter, model_name = self.tokenizer, self.formatter, self.model_name
        prompts = _completion_prompts(req.prompt, tokenizer)
        items = self.plan(req, prompts, req.max_tokens)
        handles, events = self.submit(items, new_id("cmpl"))
        rid, created = handles[0].request_id, now()
        prompt_texts = [tokenizer.decode(ids) for ids in prompts] if req.echo else None

        def chunk(index: int, text: str, finish: str | None) -> dict:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            return envelope(rid, "text_completion", created, model_name, [choice])

        def start(i: int) -> int:  # where choice i's completion starts in its text
            return len(prompt_texts[i // req.n]) if req.echo else 0

        if req.stream:
            prefix = (lambda i: prompt_texts[i // req.n]) if req.echo else None
            logprobs = None
            if req.logprobs is not None:
                offsets = {i: start(i) for i in range(len(handles))}

                def logprobs(i: int, entries) -> dict:
                    body, offsets[i] = formatter.completion(entries, offsets[i])
                    return body

            return self._streamed(
                handles, events, chunk, req, prompts, echo=prefix, logprobs=logprobs
            )
        done = await collect(self.runner, handles, events, request)
        choices = [
            {
                "index": i,
                "text": (prompt_texts[i // req.n] if req.echo else "") + c.text,
                "logprobs": None
                if c.logprobs is None
                else formatter.completion(c.logprobs, start(i))[0],
                "finish_reason": finish_reason(c),
            }
            for i, c in enumerate(done)
        ]
        body = envelope(rid, "text_completion", created, model_name, choices)
        body["usage"] = total_usage(prompts, req.n, done, self.heads())
        return body

    async def chat_completions(self, req: ChatCompletionRequest, request: Request):
        self.check_request(req)
        tokenizer, formatter, model_name = self.tokenizer, self.formatter, self.model_name
        functions = req.functions
        messages = [m.for_template() for m in req.messages]
        try:
            prompt = encode_chat(tokenizer, messages, [_tool(f) for f in functions] or None)
        except SpecdecError as err:
            raise APIError(400, str(err), param="messages") from err
        items = self.plan(req, [prompt], req.requested_max_tokens)
        handles, events = self.submit(items, new_id("chatcmpl"))
        rid, created = handles[0].request_id, now()

        names = {f["name"] for f in functions}
        parsers = [ToolCallParser(names, req.forced_tool) for _ in handles] if names else None

        def chunk(index: int, text: str, finish: str | None) -> dict | None:
            if parsers is None:
                delta = {"content": text} if text or finish is None else {}
            else:  # tool calls read out as the text comes: None while nothing is decided
                parser = parsers[index]
                delta = parser.feed(text)
                if finish is not None:
                    delta = _joined(delta, parser.finish())
                    finish = "tool_calls" if parser.called else finish
                elif not delta:
                    return None
            return with_delta(index, delta, finish)

        def with_delta(index: int, delta: dict, finish: str | None) -> dict:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            return envelope(rid, "chat.completion.chunk", created, model_name, [choice])

        if req.stream:

            def opening(i):  # the role comes first, in its own chunk
                return with_delta(i, {"role": "assistant", "content": ""}, None)

            chat_logprobs = (lambda i, entries: formatter.chat(entries)) if req.logprobs else None
            return self._streamed(
                handles, events, chunk, req, [prompt], opening=opening, logprobs=chat_logprobs
            )
        done = await collect(self.runner, handles, events, request)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None if c.logprobs is None else formatter.chat(c.logprobs),
                "finish_reason": finish_reason(c),
            }
            for i, c in enumerate(done)
        ]
        for choice, c in zip(choices, done, strict=True):
            if not names:
                continue
            content, calls = merged_calls(ToolCallParser(names, req.forced_tool), c.text)
            choice["message"]["content"] = content if calls is None else content or None
            if calls is not None:
                choice["message"]["tool_calls"] = calls
                choice["finish_reason"] = "tool_calls"
        body = envelope(rid, "chat.completion", created, model_name, choices)
        body["usage"] = total_usage([prompt], req.n, done, self.heads())
        return body


def _tool(function: dict) -> dict:
    """A function definition as chat templates take tools."""
    return {"type": "function", "function": function}


def _joined(first: dict, second: dict) -> dict:
    """Two chat deltas as one (content added up, tool-call fragments side by side)."""
    out = dict(first)
    if "content" in second:
        out["content"] = out.get("content", "") + second["content"]
    if "tool_calls" in second:
        out["tool_calls"] = out.get("tool_calls", []) + second["tool_calls"]
    return out


def _completion_prompts(prompt, tokenizer) -> list[list[int]]:
    """OpenAI's four prompt shapes -> token ids per prompt."""
    if isinstance(prompt, str):
        return [tokenizer(prompt)["input_ids"]]
    if not prompt:
        raise APIError(400, "prompt must not be an empty list", param="prompt")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    if isinstance(prompt[0], str):
        return [tokenizer(p)["input_ids"] for p in prompt]
    return [list(p) for p in prompt]
