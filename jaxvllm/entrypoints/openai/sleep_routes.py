"""The sleep-mode endpoints, served only with --enable-sleep-mode (behind the API key, as
every endpoint but the probes): vLLM's paths and parameters, for RL trainers and schedulers
that free a server's accelerator between rollouts.

POST /sleep?level=1|2, POST /wake_up[?tags=weights&tags=kv_cache], GET /is_sleeping,
POST /reset_prefix_cache, POST /update_weights {"update_info": {"path": DIR}} (a safetensors
directory or an Orbax checkpoint on the server's machine). While asleep, generation answers
503; sleeping or updating with requests in flight answers 409, naming them.
"""
from __future__ import annotations

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from jaxvllm.entrypoints.openai.errors import APIError


async def _call(coro):
    """The engine's refusals as the client's errors: a bad argument 400, a busy engine 409."""
    try:
        return await coro
    except RuntimeError as e:  # raised by the engine process's utility call, as "Type: message"
        kind, _, message = str(e).partition(": ")
        if kind == "ValueError":
            raise APIError(message or "The engine refused the arguments.", 400) from e
        if kind == "RuntimeError" and message.startswith("Cannot "):
            raise APIError(message, 409) from e
        raise APIError(f"The engine failed: {message or kind}", 500) from e


def add_sleep_routes(app: FastAPI, engine) -> None:
    @app.post("/sleep")
    async def sleep(level: str = "1"):
        if level not in ("1", "2"):  # read as text: any other string is the client's 400
            raise APIError(f"sleep level must be 1 or 2, got {level[:20]!r}.", 400, "level")
        await _call(engine.sleep(int(level)))
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(tags: list[str] | None = Query(None)):
        await _call(engine.wake_up(tags))
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": await engine.is_sleeping()}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """200 once the cache is forgotten; 409 while requests hold cached pages."""
        if not await engine.reset_prefix_cache():
            raise APIError("The prefix cache cannot be reset while requests hold its pages.", 409)
        return Response(status_code=200)

    @app.post("/update_weights")
    async def update_weights(raw: Request):
        try:
            body = await raw.json()
            path = body["update_info"]["path"]
        except (ValueError, KeyError, TypeError):
            raise APIError('The body must be {"update_info": {"path": DIR}}.', 400, "update_info") from None
        if not isinstance(path, str):
            raise APIError("update_info.path must be a string.", 400, "update_info.path")
        await _call(engine.update_weights(path))
        return Response(status_code=200)
