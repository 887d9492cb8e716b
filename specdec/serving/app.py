"""The OpenAI-compatible HTTP server: FastAPI routes over an `AsyncEngine`.

Every failure reaches the client as an OpenAI error body with the right status; nothing a
client sends can take the server down. A streaming client that disconnects cancels its
request, and its batch row is freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine import Completion, Engine
from specdec.errors import ContextLengthError, SpecdecError
from specdec.serving.async_engine import AsyncEngine, Event, QueueFullError, RequestHandle
from specdec.serving.detokenizer import IncrementalDetokenizer
from specdec.serving.logprobs import LogprobFormatter
from specdec.serving.metrics import ServerMetrics
from specdec.serving.protocol import (
    ERROR_TYPES,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    now,
    usage,
)
from specdec.serving.provenance import ProvenanceTracker
from specdec.serving.tool_stream import ToolCallParser, merged_calls
from specdec.stats import SpecStats
from specdec.tokenization import encode_chat

log = logging.getLogger("specdec.serve")

STATIC = Path(__file__).parent / "static"  # the playground (package data)
# The page may load only its own files and talk only to this server: nothing from a CDN,
# so it works offline, and nothing injected runs.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class EngineFailed(Exception):
    pass


def _error_response(status: int, message: str, param=None, code=None) -> JSONResponse:
    type_ = ERROR_TYPES.get(status, "invalid_request_error")
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


def build_app(
    engine: Engine,
    model_name: str,
    *,
    api_key: str | None = None,
    max_queue: int = 256,
    sync: Callable[[list | None], list] | None = None,
    learner=None,
) -> FastAPI:
    """The server for one engine; `model_name` is the id clients must ask for. `sync`
    shares each step's commands with the other ranks under tensor parallelism. `learner`
    (heads learning while serving) adds its figures to /metrics and usage.speculation."""
    metrics = ServerMetrics()

    def heads() -> dict | None:
        return None if learner is None else learner.metrics()

    runner = AsyncEngine(engine, metrics, max_queue, sync)
    tokenizer = engine.tokenizer
    vocab_size = len(tokenizer)
    can_speculate = engine.drafter_factory is not None
    formatter = LogprobFormatter(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runner.start(asyncio.get_running_loop())
        # llguidance's token table (logprobs' token bytes, JSON mode) holds the GIL ~2.5 s
        # to build: built on a quiet server now, not stalling the first such request's steps.
        threading.Thread(target=_build_token_table, args=(engine,), daemon=True).start()
        yield
        runner.stop()

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.runner = runner

    # ---- errors --------------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        metrics.rejected.labels(str(err.status)).inc()
        return _error_response(err.status, err.message, err.param, err.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        metrics.rejected.labels("400").inc()
        first = err.errors()[0] if err.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return _error_response(400, f"the body is not valid JSON: {first.get('msg')}")
        where = ".".join(loc) or "body"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return _error_response(400, message, param=loc[0] if loc else None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        metrics.rejected.labels(str(err.status_code)).inc()
        return _error_response(err.status_code, str(err.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.exception("unexpected error")
        metrics.rejected.labels("500").inc()
        return _error_response(500, f"internal error: {type(err).__name__}")

    # ---- checks shared by the endpoints ---------------------------------------------------

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise APIError(401, "invalid API key", code="invalid_api_key")

    def check_request(req: CompletionRequest | ChatCompletionRequest) -> None:
        if req.model != model_name:
            raise APIError(
                404,
                f"the model '{req.model}' does not exist; this server serves '{model_name}'",
                param="model",
                code="model_not_found",
            )
        if bad := req.unsupported():
            raise APIError(400, f"{bad} is not supported by this server", param=bad)
        if req.speculate and not can_speculate:
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

    def limit_for(prompt_ids: list[int]) -> int:
        """Most new tokens a prompt leaves room for."""
        ctx = engine.context_length
        if engine.max_len is not None:
            ctx = min(ctx, engine.max_len - engine.headroom)
        return ctx - len(prompt_ids)

    def plan(req, prompts: list[list[int]], max_tokens: int | None):
        """(prompt ids, SamplingParams) per choice; choice i of prompt j has index j*n + i."""
        items = []
        for ids in prompts:
            if any(t >= vocab_size for t in ids):
                raise APIError(400, f"prompt token ids must be < {vocab_size}", param="prompt")
            wanted = max_tokens if max_tokens is not None else max(limit_for(ids), 1)
            for i in range(req.n):
                try:
                    items.append((ids, req.sampling_params(wanted, i)))
                except SpecdecError as err:
                    raise APIError(400, str(err)) from err
        return items

    def submit(items, request_id: str):
        try:
            return runner.submit(items, request_id)
        except ContextLengthError as err:
            raise APIError(400, str(err), code="context_length_exceeded") from err
        except SpecdecError as err:
            raise APIError(400, str(err)) from err
        except QueueFullError as err:
            raise APIError(429, str(err), code="queue_full") from err

    # ---- routes --------------------------------------------------------------------------

    # The playground: static files, public like any page that holds no data. Everything it
    # does goes through the API below, which asks the page for --api-key like any client.
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def playground():
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    @app.get("/health")
    async def health():
        if not runner.alive:
            return _error_response(503, "the engine thread is not running")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        if learner is not None:
            metrics.learning(heads())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models():
        card = {"id": model_name, "object": "model", "created": now(), "owned_by": "specdec"}
        card["max_model_len"] = limit_for([])
        card["speculation"] = {"drafter": can_speculate, "k_max": engine.window.k_max}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(req: CompletionRequest, request: Request):
        check_request(req)
        prompts = _completion_prompts(req.prompt, tokenizer)
        items = plan(req, prompts, req.max_tokens)
        handles, events = submit(items, new_id("cmpl"))
        rid, created = handles[0].request_id, now()
        prompt_texts = [tokenizer.decode(ids) for ids in prompts] if req.echo else None

        def chunk(index: int, text: str, finish: str | None) -> dict:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            return _envelope(rid, "text_completion", created, model_name, [choice])

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

            body = _stream(
                runner,
                handles,
                events,
                tokenizer,
                chunk,
                req,
                prompts,
                prefix,
                heads=heads,
                logprobs=logprobs,
            )
            return _sse(body)
        done = await _collect(runner, handles, events, request)
        choices = [
            {
                "index": i,
                "text": (prompt_texts[i // req.n] if req.echo else "") + c.text,
                "logprobs": None
                if c.logprobs is None
                else formatter.completion(c.logprobs, start(i))[0],
                "finish_reason": _finish(c),
            }
            for i, c in enumerate(done)
        ]
        body = _envelope(rid, "text_completion", created, model_name, choices)
        body["usage"] = _usage(prompts, req.n, done, heads())
        return body

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        check_request(req)
        functions = req.functions
        messages = [m.for_template() for m in req.messages]
        try:
            prompt = encode_chat(tokenizer, messages, [_tool(f) for f in functions] or None)
        except SpecdecError as err:
            raise APIError(400, str(err), param="messages") from err
        items = plan(req, [prompt], req.requested_max_tokens)
        handles, events = submit(items, new_id("chatcmpl"))
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
            return _envelope(rid, "chat.completion.chunk", created, model_name, [choice])

        if req.stream:

            def opening(i):  # the role comes first, in its own chunk
                return with_delta(i, {"role": "assistant", "content": ""}, None)

            chat_logprobs = (lambda i, entries: formatter.chat(entries)) if req.logprobs else None
            body = _stream(
                runner,
                handles,
                events,
                tokenizer,
                chunk,
                req,
                [prompt],
                None,
                opening,
                heads,
                chat_logprobs,
            )
            return _sse(body)
        done = await _collect(runner, handles, events, request)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None if c.logprobs is None else formatter.chat(c.logprobs),
                "finish_reason": _finish(c),
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
        body = _envelope(rid, "chat.completion", created, model_name, choices)
        body["usage"] = _usage([prompt], req.n, done, heads())
        return body

    return app


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


def _envelope(rid: str, obj: str, created: int, model: str, choices: list) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}


def _finish(c: Completion) -> str:
    return "length" if c.finish_reason == "length" else "stop"


def _usage(
    prompts: list[list[int]], n: int, done: list[Completion], heads: dict | None = None
) -> dict:
    stats = sum((c.stats for c in done), SpecStats())
    completion_tokens = sum(c.num_generated for c in done)
    return usage(sum(len(p) for p in prompts), completion_tokens, stats, heads)


async def _collect(
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


async def _stream(
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
                yield _data(opening(i))
            if echo is not None:
                yield _data(chunk(i, echo(i), None))
        while len(finished) < len(handles):
            event: Event = await events.get()
            if event.error:
                yield _data(error_body(event.error, "server_error"))
                break
            i, detok = event.index, detoks[event.index]
            if traces is not None:
                traces[i].update(event.token_ids, event.trace)
            unsent[i].extend(event.logprobs or ())
            if event.completion is None:
                text = detok.delta(event.token_ids)
                if text and (body := chunk(i, text, None)) is not None:
                    yield _data(with_tokens(body, i, text))
                elif text:
                    held[i] += text
                continue
            finished[i] = event.completion
            handles[i].done = True
            text = detok.finish(event.token_ids)
            if text and (body := chunk(i, text, None)) is not None:
                yield _data(with_tokens(body, i, text, final=True))
                yield _data(chunk(i, "", _finish(event.completion)))
            elif text:
                held[i] += text
                yield _data(with_tokens(chunk(i, "", _finish(event.completion)), i, "", True))
            else:  # tokens with no text left (EOS, a cut stop string) ride on the last chunk
                yield _data(with_tokens(chunk(i, "", _finish(event.completion)), i, "", True))
        else:
            if req.include_usage:
                done = [finished[i] for i in range(len(handles))]
                body = chunk(0, "", None)
                body["choices"] = []
                body["usage"] = _usage(prompts, req.n, done, heads())
                yield _data(body)
        yield "data: [DONE]\n\n"
    finally:
        runner.abort(handles)


def _data(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def _sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _build_token_table(engine: Engine) -> None:
    """`engine.grammars.tokenizer`, built ahead of need; a failure is left to the request
    that needs it, which reports it in words."""
    try:
        engine.grammars.tokenizer  # noqa: B018 (built on first access)
    except Exception:  # noqa: BLE001
        log.debug("specdec: the grammar token table was not built ahead", exc_info=True)
