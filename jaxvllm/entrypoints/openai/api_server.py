"""The OpenAI-compatible HTTP server (`jaxvllm serve`): FastAPI routes over one AsyncLLM.

Bodies are parsed here rather than by FastAPI so that every way a body can be wrong
(not UTF-8, not JSON, wrong types, too large) gets the same OpenAI-shaped 400 naming
the field. Non-streaming handlers are cancelled when the client disconnects (streams are
cancelled by Starlette), and cancelling aborts the engine requests.
"""
from __future__ import annotations

import asyncio
import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import jaxvllm
from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.entrypoints.openai.errors import APIError, error_response, from_validation_error
from jaxvllm.entrypoints.openai.middleware import ServerMiddleware
from jaxvllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                 DetokenizeRequest, TokenizeRequest)
from jaxvllm.entrypoints.openai.serving_chat import OpenAIServingChat
from jaxvllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing
from jaxvllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from jaxvllm.metrics.prometheus import PrometheusStatLogger

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 << 20


async def parse_body(raw: Request, model: type[BaseModel]):
    body = await raw.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"The request body is not valid UTF-8 (invalid byte at offset {e.start}).") from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(f"The request body is not valid JSON: {e.msg} (line {e.lineno}, "
                       f"column {e.colno}).") from e
    if not isinstance(obj, dict):
        raise APIError(f"The request body must be a JSON object, got {type(obj).__name__}.")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e, model.field_hints) from e


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(raw: Request, coro):
    """Run a handler (its body already read) and cancel it if the client goes away first."""
    handler = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not handler.done():
        handler.cancel()
        logger.info("Client disconnected; request cancelled.")
        return Response(status_code=499)
    return handler.result()


def build_app(engine, model_name: str, api_key: str | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    metrics = PrometheusStatLogger(model_name)
    engine.add_stat_logger(metrics)
    completion = OpenAIServingCompletion(engine, model_name, metrics)
    chat = OpenAIServingChat(engine, model_name, metrics)
    tokenization = OpenAIServingTokenization(engine, model_name, metrics)

    app = FastAPI(title="jaxvllm OpenAI-compatible server", version=jaxvllm.__version__)
    app.add_middleware(ServerMiddleware, api_key=api_key, max_request_bytes=max_request_bytes)

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return error_response(e.message, e.status, e.param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e: StarletteHTTPException):
        return error_response(str(e.detail), e.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_, e: Exception):
        logger.exception("Unhandled error")
        return error_response(f"{type(e).__name__}: {e}", 500)

    @app.get("/health")
    async def health():
        try:
            await engine.check_health()
        except EngineDeadError as e:
            return error_response(str(e), 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": jaxvllm.__version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": OpenAIServing.created(),
            "owned_by": "jaxvllm", "root": engine.model_name, "parent": None,
            "max_model_len": completion.max_model_len}]}

    @app.get("/metrics")
    async def prometheus_metrics():
        if not engine.errored:  # a fresh snapshot, so gauges are right even when idle
            try:
                metrics.update_scheduler(await asyncio.wait_for(engine.get_stats(), 5))
            except (EngineDeadError, asyncio.TimeoutError):
                pass
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def create_completion(raw: Request):
        request = await parse_body(raw, CompletionRequest)
        rid = OpenAIServing.request_id(raw, "cmpl")
        return await cancel_on_disconnect(raw, completion.create_completion(request, rid))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request):
        request = await parse_body(raw, ChatCompletionRequest)
        rid = OpenAIServing.request_id(raw, "chatcmpl")
        return await cancel_on_disconnect(raw, chat.create_chat_completion(request, rid))

    @app.post("/tokenize")
    async def tokenize(raw: Request):
        return tokenization.tokenize(await parse_body(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize(raw: Request):
        return tokenization.detokenize(await parse_body(raw, DetokenizeRequest))

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return JSONResponse(tokenization.tokenizer_info())

    if engine.vllm_config.profile_dir:  # as in vLLM: only when a profile directory is given
        @app.post("/start_profile")
        async def start_profile():
            try:
                return {"profile_dir": await engine.start_profile()}
            except RuntimeError as e:  # e.g. already capturing
                raise APIError(str(e).split(": ", 1)[-1]) from e

        @app.post("/stop_profile")
        async def stop_profile():
            try:
                await engine.stop_profile()
            except RuntimeError as e:
                raise APIError(str(e).split(": ", 1)[-1]) from e
            return Response(status_code=200)

    return app


async def serve(engine_args, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                served_model_name: str | None = None,
                max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, log_level: str = "info") -> None:
    import uvicorn

    from jaxvllm.engine.async_llm import AsyncLLM
    from jaxvllm.models.loader import DEFAULT_MODEL

    engine = AsyncLLM.from_engine_args(engine_args)
    try:
        name = served_model_name or engine_args.model or DEFAULT_MODEL
        app = build_app(engine, name, api_key, max_request_bytes)
        logger.info("Serving %s on http://%s:%d (engine core pid %s)", name, host, port,
                    engine.engine_core_pid)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=5)
        await uvicorn.Server(config).serve()
    finally:
        engine.shutdown()
