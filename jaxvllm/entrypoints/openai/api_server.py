"""The OpenAI-compatible HTTP server (`jaxvllm serve`): FastAPI routes over one AsyncLLM.

Bodies are parsed by request_body.py rather than by FastAPI so that every way a body can
be wrong gets the same OpenAI-shaped 400 naming the field. Non-streaming handlers are
cancelled when the client disconnects (streams are cancelled by Starlette), and
cancelling aborts the engine requests. When the engine process dies the server fails
what is in flight and exits non-zero, so that its supervisor restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.entrypoints import cli_args
from jaxvllm.entrypoints.openai.chat_template_sandbox import ChatTemplateSandbox
from jaxvllm.entrypoints.openai.chat_utils import ChatRenderer, load_chat_template
from jaxvllm.entrypoints.openai.connection_limits import install_accept_error_handler, protocol_class, raise_fd_limit
from jaxvllm.entrypoints.openai.disconnect import cancel_on_disconnect
from jaxvllm.entrypoints.openai.errors import APIError, error_response
from jaxvllm.entrypoints.openai.graceful_shutdown import GracefulServer
from jaxvllm.entrypoints.openai.middleware import ServerMiddleware
from jaxvllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from jaxvllm.entrypoints.openai.protocol_pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from jaxvllm.entrypoints.openai.protocol_replies import ModelCard, ModelList
from jaxvllm.entrypoints.openai.request_body import parse_body
from jaxvllm.entrypoints.openai.server_args import ServerArgs
from jaxvllm.entrypoints.openai.serving_chat import OpenAIServingChat
from jaxvllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing
from jaxvllm.entrypoints.openai.serving_models import OpenAIServingModels, add_lora_routes
from jaxvllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from jaxvllm.entrypoints.openai.serving_responses import add_responses_routes
from jaxvllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from jaxvllm.entrypoints.openai.sleep_routes import add_sleep_routes
from jaxvllm.lora.peft_helper import read_adapter
from jaxvllm.metrics.prometheus import PrometheusStatLogger
from jaxvllm.version import __version__

logger = logging.getLogger(__name__)


def build_app(engine, model_name: str, server_args: ServerArgs) -> FastAPI:
    metrics = PrometheusStatLogger(model_name, engine.vllm_config.parallel.data_parallel_size,
                                   engine.vllm_config)
    engine.add_stat_logger(metrics)
    sandbox = (ChatTemplateSandbox(server_args.chat_template_timeout_s, server_args.max_request_bytes)
               if server_args.trust_request_chat_template else None)
    renderer = ChatRenderer(engine.get_tokenizer(), sandbox, load_chat_template(server_args.chat_template))
    served = OpenAIServingModels(model_name, server_args)  # shared: adapters load at run time
    completion = OpenAIServingCompletion(engine, model_name, server_args, metrics, models=served)
    chat = OpenAIServingChat(engine, model_name, server_args, metrics, renderer, models=served)
    tokenization = OpenAIServingTokenization(engine, model_name, server_args, metrics, renderer, models=served)
    pooling = OpenAIServingPooling(engine, model_name, server_args, metrics, renderer, models=served)
    pooling_runner = engine.vllm_config.model.runner == "pooling"

    def check_generate() -> None:
        if pooling_runner:
            raise APIError("This server runs a pooling model (--runner pooling): it embeds, classifies "
                           "and scores (/v1/embeddings, /pooling, /classify, /score, /rerank) and does "
                           "not generate.", 400)

    docs = {} if not server_args.disable_fastapi_docs else dict(docs_url=None, redoc_url=None,
                                                                 openapi_url=None)
    app = FastAPI(title="jaxvllm OpenAI-compatible server", version=__version__, **docs)
    app.state.draining = False  # set on SIGINT/SIGTERM (graceful_shutdown.py)
    app.add_middleware(ServerMiddleware, api_key=server_args.api_key,
                       max_request_bytes=server_args.max_request_bytes)
    if sandbox is not None:
        app.router.on_shutdown.append(sandbox.close)

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return error_response(e.message, e.status, e.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_, e: RequestValidationError):  # FastAPI's 422, OpenAI-shaped
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(f"Invalid request field '{param}': {first.get('msg', 'invalid')}.",
                              400, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e: StarletteHTTPException):
        return error_response(str(e.detail), e.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_, e: Exception):  # the client gets no Python internals
        logger.exception("Unhandled error")
        return error_response("The server failed to complete this request; see its log.", 500)

    @app.get("/health")
    async def health():
        try:
            await engine.check_health()
        except EngineDeadError as e:
            return error_response(str(e), 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/v1/models")
    async def models():
        created = OpenAIServing.created()
        return ModelList(data=[ModelCard(
            id=model_name, created=created, owned_by="jaxvllm", root=model_name,
            parent=None, max_model_len=completion.max_model_len)] + [ModelCard(
            id=name, created=created, owned_by="jaxvllm", root=lora.lora_path, parent=model_name,
            max_model_len=completion.max_model_len) for name, lora in served.lora_requests.items()]).dump()

    @app.get("/metrics")
    async def prometheus_metrics():
        if not engine.errored:  # a fresh snapshot, so gauges are right even when idle
            try:
                for index, stats in (await asyncio.wait_for(engine.get_stats_by_engine(), 5)).items():
                    metrics.update_scheduler(stats, index)
            except (EngineDeadError, asyncio.TimeoutError):
                pass
        for index in engine.dead_engines:
            metrics.drop_engine(index)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def create_completion(raw: Request):
        check_generate()
        request = await parse_body(raw, CompletionRequest)
        rid = OpenAIServing.request_id(raw, "cmpl")
        return await cancel_on_disconnect(raw, completion.create_completion(request, rid))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request):
        check_generate()
        request = await parse_body(raw, ChatCompletionRequest)
        rid = OpenAIServing.request_id(raw, "chatcmpl")
        return await cancel_on_disconnect(raw, chat.create_chat_completion(request, rid))

    async def pooled(raw: Request, body, prefix: str, handler):
        request = await parse_body(raw, body)
        return await cancel_on_disconnect(raw, handler(request, OpenAIServing.request_id(raw, prefix)))

    @app.post("/v1/embeddings")
    async def create_embedding(raw: Request):
        return await pooled(raw, EmbeddingRequest, "embd", pooling.create_embedding)

    @app.post("/pooling")
    async def create_pooling(raw: Request):
        return await pooled(raw, PoolingRequest, "pool",
                            lambda r, rid: pooling.create_embedding(r, rid, pooling=True))

    @app.post("/classify")
    async def create_classify(raw: Request):
        return await pooled(raw, ClassificationRequest, "classify", pooling.create_classify)

    async def create_score(raw: Request):
        return await pooled(raw, ScoreRequest, "score", pooling.create_score)

    async def create_rerank(raw: Request):  # Jina's (v1) and Cohere's (v2) clients
        return await pooled(raw, RerankRequest, "rerank", pooling.create_rerank)

    for path in ("/score", "/v1/score"):
        app.post(path)(create_score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path)(create_rerank)

    @app.post("/tokenize")
    async def tokenize(raw: Request):
        return await tokenization.tokenize(await parse_body(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize(raw: Request):
        return await tokenization.detokenize(await parse_body(raw, DetokenizeRequest))

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

    if server_args.enable_sleep_mode:
        add_sleep_routes(app, engine)
    add_responses_routes(app, engine, model_name, server_args, metrics, renderer, served)
    if server_args.allow_runtime_lora_updating:
        add_lora_routes(app, served, engine)
    return app


def run_server(ns: argparse.Namespace) -> int:
    """`jaxvllm serve` with its parsed arguments (cli_args.add_serve_args): 0 once stopped, 1
    if the engine died, 2 for a bad argument or model."""
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    try:
        server_args = ServerArgs.from_cli_args(ns)
        args = cli_args.engine_args(ns)
        if ns.seed is not None:
            args = dataclasses.replace(args, seed=ns.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.node_rank > 0:  # multi-host: replay node_rank 0's schedule; no HTTP server here
        from jaxvllm.executor.multihost import run_follower
        run_follower(args)
        return 0
    # Until the server takes over its signals, both stop start-up at once (asyncio.run's
    # own Ctrl-C handler would only cancel the task, and start-up does not yield to it).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return asyncio.run(serve(args, server_args, host=ns.host, port=ns.port,
                                 served_model_name=ns.served_model_name,
                                 log_level=ns.uvicorn_log_level))
    except (ValueError, FileNotFoundError) as e:  # a bad model or argument, found at start-up
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # stopped during start-up: the engine process is gone already
        return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


async def serve(engine_args, server_args: ServerArgs, host: str = "127.0.0.1", port: int = 8000,
                served_model_name: str | None = None, log_level: str = "info") -> int:
    """Serve until stopped (0) or until the engine process dies (1)."""
    import uvicorn

    from jaxvllm.engine.async_llm import AsyncLLM

    for lora in server_args.lora_requests().values():  # a bad adapter fails the start, by name
        if not engine_args.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora.")
        read_adapter(lora.lora_path, engine_args.max_lora_rank, lora.lora_name)
    fd_limit = raise_fd_limit()
    install_accept_error_handler(asyncio.get_running_loop())
    sock = bind_server_socket(host, port)  # a busy port fails now, not after the engine loads
    try:
        engine = AsyncLLM.from_engine_args(engine_args)
    except BaseException:
        sock.close()
        raise
    try:
        name = served_model_name or default_served_name(engine_args.model)
        app = build_app(engine, name, server_args)
        logger.info("Serving %s on http://%s:%d (engine core pid %s)", name, host, port,
                    engine.engine_core_pid)
        # Connections beyond the descriptors left get 503 instead of failing accept().
        limit = min(server_args.max_concurrent_connections, max(fd_limit - 64, 16))
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=5, limit_concurrency=limit,
                                timeout_keep_alive=server_args.keep_alive_timeout_s,
                                http=protocol_class(server_args.header_timeout_s))
        server = GracefulServer(config, engine, server_args.shutdown_timeout_s)
        watchdog = asyncio.create_task(_stop_when_engine_dies(engine, server))
        await server.serve(sockets=[sock])
        watchdog.cancel()
        return 1 if engine.errored else 0
    finally:
        engine.shutdown()


def bind_server_socket(host: str, port: int) -> socket.socket:
    """The listening address, bound before anything slow starts (vLLM binds first too).
    ValueError (the CLI's one-line error) when it is taken or cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ValueError(f"Cannot serve on {host}:{port}: {e.strerror or e}.") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # held from now on: a second server on this port fails its bind
    except OSError as e:
        sock.close()
        raise ValueError(f"Cannot serve on {host}:{port}: {e.strerror or e}.") from e
    return sock


def default_served_name(model: str | None) -> str:
    """The id clients send: a Hub id as given (as vLLM serves it), a local path by its last
    part only (the server does not show the machine's paths)."""
    from jaxvllm.transformers_utils.hub import looks_like_hub_id
    from jaxvllm.transformers_utils.model_path import DEFAULT_MODEL
    if model is None:
        return DEFAULT_MODEL
    if not os.path.exists(os.path.expanduser(model)) and looks_like_hub_id(model):
        return model
    return os.path.basename(model.rstrip("/"))


async def _stop_when_engine_dies(engine, server, poll_s: float = 0.2, grace_s: float = 1.0) -> None:
    """vLLM's behaviour: a dead engine takes the server down with it (exit code 1), after a
    moment in which the requests in flight receive their error."""
    while not engine.errored:
        await asyncio.sleep(poll_s)
    logger.error("The engine core died; the server stops so that it can be restarted.")
    await asyncio.sleep(grace_s)
    server.should_exit = True


if __name__ == "__main__":  # vLLM's `python -m vllm.entrypoints.openai.api_server`: `jaxvllm serve`
    parser = cli_args.ArgumentParser(prog="jaxvllm serve")
    cli_args.add_serve_args(parser)
    ns = parser.parse_args()
    cli_args.configure_logging()
    cli_args.exit_now(run_server(ns))
