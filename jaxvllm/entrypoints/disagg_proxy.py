"""The front door of disaggregated prefill and decode (vLLM's proxy pattern): each completion
or chat request goes to a prefill engine for one token with `kv_transfer_params:
{"do_remote_decode": true}`, then, with the params that engine returns, to a decode engine,
whose answer (streamed or whole) goes back to the client. Engines of each kind take
requests in turn.

A load balancer cannot do this (the second hop is built from the first's answer), and the
routers that can (vllm-router, sglang's) are separate binaries written for their engines;
the relay is a few dozen lines over FastAPI and httpx, both here already.

Should the prefill hop fail (the engine is down, or answers with an error other than the
client's own 400), the decode engine computes the prompt itself: the client still gets
its answer, later.
"""

import argparse
import itertools
import logging

logger = logging.getLogger(__name__)


def build_app(prefill_urls: list[str], decode_urls: list[str], timeout: float = 600.0):
    import httpx  # here, not at the top: `jaxvllm --help` stays quick
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    app = FastAPI(title="jaxvllm disaggregated prefill proxy")
    prefills, decodes = itertools.cycle(prefill_urls), itertools.cycle(decode_urls)
    client = httpx.AsyncClient(timeout=timeout)

    async def relay(path: str, request):
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        first = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n")}
        first.update(max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        try:
            prefilled = await client.post(next(prefills) + path, json=first, headers=headers)
        except httpx.HTTPError as e:
            logger.warning("Prefill engine unreachable (%s): the decode engine computes the prompt.", e)
            prefilled = None
        if prefilled is not None and prefilled.status_code == 400:  # the client's mistake: say so
            return JSONResponse(prefilled.json(), status_code=400)
        params = prefilled.json().get("kv_transfer_params") if prefilled is not None and prefilled.is_success else None
        second = {**body, "kv_transfer_params": params} if params else body
        url = next(decodes) + path
        if not body.get("stream"):
            answer = await client.post(url, json=second, headers=headers)
            return Response(answer.content, answer.status_code, media_type="application/json")
        upstream = await client.send(client.build_request("POST", url, json=second, headers=headers), stream=True)

        async def chunks():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
        return StreamingResponse(chunks(), upstream.status_code, media_type=upstream.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await relay("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        answer = await client.get(decode_urls[0] + "/v1/models", headers=dict(request.headers))
        return Response(answer.content, answer.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    app.router.on_shutdown.append(client.aclose)
    return app


def add_parser(sub) -> None:
    proxy = sub.add_parser("disagg-proxy", help="Front door of disaggregated prefill and decode.")
    proxy.add_argument("--prefill", nargs="+", required=True, help="Prefill engines' base URLs (kv_producer).")
    proxy.add_argument("--decode", nargs="+", required=True, help="Decode engines' base URLs (kv_consumer).")
    proxy.add_argument("--host", default="127.0.0.1")
    proxy.add_argument("--port", type=int, default=8000)


def run(ns: argparse.Namespace) -> int:
    import uvicorn

    app = build_app([u.rstrip("/") for u in ns.prefill], [u.rstrip("/") for u in ns.decode])
    uvicorn.run(app, host=ns.host, port=ns.port, log_level="warning")
    return 0
