"""What the endpoints send back: OpenAI's error and response envelopes, a request's choices
awaited whole, or streamed as server-sent events as the engine produces them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from specdec.engine import Completion
from specdec.serving.async_engine import AsyncEngine, Event, RequestHandle
from specdec.serving.detokenizer import IncrementalDetokenizer
from specdec.serving.protocol import error_body, usage
from specdec.serving.provenance import ProvenanceTracker
from specdec.stats import SpecStats


class APIError(Exception):
    """A request refused or failed: its status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def envelope(rid: str, obj: str, created: int, model: str, choices: list) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}


def finish_reason(c: Completion) -> str:
    return "length" if c.finish_reason == "length" else "stop"


def total_usage(
    prompts: list[list[int]], n: int, done: list[Completion], heads: dict | None = None
) -> dict:
    stats = sum((c.stats for c in done), SpecStats())
    completion_tokens = sum(c.num_generated for c in done)
    return usage(sum(len(p) for p in prompts), completion_tokens, stats, heads)


async def collect(
    runner: AsyncEngine, handles: list[RequestHandle], events: asyncio.Queue, request: Request
) -> list[Completion]:
    """Wait for every choice; abort them if the client disconnects meanwhile."""
    done: dict[int, Completion] = {}
    try:
        while len(done) < len(handles):
            try:
                event: Event = await asyncio.wait_for(events.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    raise APIError(499, "client disconnected") from None
                continue
            if event.error:
                raise APIError(500, event.error)
            if event.completion is not None:
                done[event.index] = event.completion
                handles[event.index].done = True
    finally:
        runner.abort(handles)
    return [done[i] for i in range(len(handles))]


async def stream(
    runner: AsyncEngine,
    handles: list[RequestHandle],
    events: asyncio.Queue,
    tokenizer,
    chunk: Callable[[int, str, str | None], dict | None],
    req,
    prompts: list[list[int]],
    echo: Callable[[int], str] | None,
    opening: Callable[[int], dict] | None = None,
    heads: Callable[[], dict | None] = lambda: None,
    logprobs: Callable[[int, list], dict] | None = None,
) -> AsyncIterator[str]:
    """Server-sent events: text deltas per choice as the engine produces them, a final chunk
    with the finish reason, the usage chunk when asked, then [DONE]. Leaving early (the
    client went away) aborts whatever is unfinished. With `logprobs` (choice, entries) ->
    the choice's logprobs object, each text chunk carries the entries of the tokens
    generated since the previous one (the last chunk those left)."""
    detoks = [IncrementalDetokenizer(tokenizer, h.params.stop) for h in handles]
    traces = [ProvenanceTracker(tokenizer) for _ in handles] if req.include_speculation else None
    unsent: list[list] = [[] for _ in handles]  # logprob entries not yet in a chunk
    held = ["" for _ in handles]  # text whose chunk `chunk` held back (None), per choice

    def with_tokens(body: dict, index: int, text: str, final: bool = False) -> dict:
        """The chunk with its tokens' provenance and logprobs, when asked for."""
        text, held[index] = held[index] + text, ""
        if traces is not None:
            records = traces[index].records(text, final)
            body["choices"][0]["speculation"] = {"tokens": records}
        if logprobs is not None:
            body["choices"][0]["logprobs"] = logprobs(index, unsent[index])
            unsent[index] = []
        return body

    finished: dict[int, Completion] = {}
    try:
        for i in range(len(handles)):
            if opening is not None:
                yield event_data(opening(i))
            if echo is not None:
                yield event_data(chunk(i, echo(i), None))
        while len(finished) < len(handles):
            event: Event = await events.get()
            if event.error:
                yield event_data(error_body(event.error, "server_error"))
                break
            i, detok = event.index, detoks[event.index]
            if traces is not None:
                traces[i].update(event.token_ids, event.trace)
            unsent[i].extend(event.logprobs or ())
            if event.completion is None:
                text = detok.delta(event.token_ids)
                if text and (body := chunk(i, text, None)) is not None:
                    yield event_data(with_tokens(body, i, text))
                elif text:
                    held[i] += text
                continue
            finished[i] = event.completion
            handles[i].done = True
            text, finish = detok.finish(event.token_ids), finish_reason(event.completion)
            if text and (body := chunk(i, text, None)) is not None:
                yield event_data(with_tokens(body, i, text, final=True))
                yield event_data(chunk(i, "", finish))
            else:  # text held back, or tokens with no text left (EOS, a cut stop string),
                held[i] += text  # ride on the last chunk
                yield event_data(with_tokens(chunk(i, "", finish), i, "", True))
        else:
            if req.include_usage:
                done = [finished[i] for i in range(len(handles))]
                body = chunk(0, "", None)
                body["choices"] = []
                body["usage"] = total_usage(prompts, req.n, done, heads())
                yield event_data(body)
        yield "data: [DONE]\n\n"
    finally:
        runner.abort(handles)


def event_data(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
