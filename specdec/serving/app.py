"""The OpenAI-compatible HTTP server: FastAPI routes over a `Service` (the endpoints,
`serving/endpoints.py`) and its `AsyncEngine`, and the errors in OpenAI's schema.

Every failure reaches the client as an OpenAI error body with the right status; nothing a
client sends can take the server down. A streaming client that disconnects cancels its
request, and its batch row is freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine import Engine
from specdec.serving.endpoints import Service
from specdec.serving.protocol import (
    ERROR_TYPES,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
)
from specdec.serving.responses import APIError

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
    service = Service(
        engine, model_name, api_key=api_key, max_queue=max_queue, sync=sync, learner=learner
    )
    metrics, runner = service.metrics, service.runner

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
            metrics.learning(service.heads())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    authorized = [Depends(service.authorize)]

    @app.get("/v1/models", dependencies=authorized)
    async def models():
        return {"object": "list", "data": [service.model_card()]}

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(req: CompletionRequest, request: Request):
        return await service.completions(req, request)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await service.chat_completions(req, request)

    return app


def _build_token_table(engine: Engine) -> None:
    """`engine.grammars.tokenizer`, built ahead of need; a failure is left to the request
    that needs it, which reports it in words."""
    try:
        engine.grammars.tokenizer  # noqa: B018 (built on first access)
    except Exception:  # noqa: BLE001
        log.debug("specdec: the grammar token table was not built ahead", exc_info=True)
