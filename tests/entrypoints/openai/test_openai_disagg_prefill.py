"""Disaggregated prefill and decode as processes: two `jaxvllm serve` (kv_producer,
kv_consumer) behind the proxy app (jaxvllm disagg-proxy), on a tiny random Llama with the
default model's tokenizer. Completions and chat, whole and streamed, equal the decode
engine's own; the decode engine computes one prompt token per request and counts the KV it
received on /metrics; after the prefill engine is killed, requests still finish (computed on
the decode side) and the decode engine's pool is whole."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest
from openai_server import TINY_ENGINE_FLAGS, RemoteServer, free_port, tiny_model

from jaxvllm.entrypoints.disagg_proxy import build_app

PROMPT = "The history of paged attention begins with operating systems, where memory is cut into pages " * 4


def kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "JaxTransferConnector", "kv_role": role, "kv_port": free_port(),
                       "kv_connector_extra_config": {"pull_timeout_s": 1.0}})


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    model = str(tiny_model(tmp_path_factory))
    flags = [model, *TINY_ENGINE_FLAGS, "--served-model-name", "tiny"]
    prefill = RemoteServer([*flags, "--kv-transfer-config", kv_config("kv_producer")], wait_ready=False)
    decode = RemoteServer([*flags, "--kv-transfer-config", kv_config("kv_consumer")])
    prefill._wait_ready(300)
    yield prefill, decode
    prefill.stop()
    decode.stop()


def post(prefill, decode, path: str, body: dict, stream: bool = False):
    """Through the proxy app, in this process."""
    return asyncio.run(_post(prefill, decode, path, body, stream))


async def _post(prefill, decode, path: str, body: dict, stream: bool):
    app = build_app([prefill.url], [decode.url])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=120) as c:
        if not stream:
            return (await c.post(path, json=body)).json()
        chunks = []
        async with c.stream("POST", path, json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
        return chunks


def counter(server, name: str) -> float:
    return server.metrics().get(f"jaxvllm:kv_transfer_total{{counter={name}}}", 0)


def test_requests_through_the_proxy_decode_from_transferred_kv(pd):
    prefill, decode = pd
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    alone = httpx.post(decode.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    time.sleep(1.2)  # /metrics follows the engine's stats once a second
    computed, received = decode.metrics()["jaxvllm:prefill_tokens_computed_total"], counter(decode, "received_requests")
    whole = post(prefill, decode, "/v1/completions", body)
    assert whole["choices"][0]["text"] == alone and whole["usage"]["completion_tokens"] == 12
    streamed = post(prefill, decode, "/v1/completions", body, stream=True)
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == alone
    chat = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0}
    direct = httpx.post(decode.url + "/v1/chat/completions", json=chat, timeout=120).json()
    through = post(prefill, decode, "/v1/chat/completions", chat)
    assert through["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    time.sleep(1.2)
    m = decode.metrics()
    assert counter(decode, "received_requests") - received == 3
    # One prompt token computed per transferred request, plus the direct chat's whole prompt.
    assert m["jaxvllm:prefill_tokens_computed_total"] - computed == 3 + direct["usage"]["prompt_tokens"]
    assert counter(decode, "received_bytes") > 0 and counter(decode, "failed_receives") == 0


def test_a_bad_request_is_the_clients_error_and_a_dead_prefill_engine_is_recomputed(pd):
    prefill, decode = pd
    bad = post(prefill, decode, "/v1/completions", {"model": "tiny", "prompt": "x", "temperature": -1})
    assert bad["error"]["code"] == 400 and "temperature" in bad["error"]["message"]
    body = {"model": "tiny", "prompt": PROMPT + "again", "max_tokens": 8, "temperature": 0}
    params = httpx.post(prefill.url + "/v1/completions", timeout=120, json={
        **body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}).json()["kv_transfer_params"]
    prefill.proc.send_signal(signal.SIGKILL)
    prefill.proc.wait(30)
    failed = counter(decode, "failed_receives")
    start = time.monotonic()
    pulled = httpx.post(decode.url + "/v1/completions", json={**body, "kv_transfer_params": params}, timeout=120)
    assert time.monotonic() - start < 5  # pull_timeout_s=1, then computed here
    through = post(prefill, decode, "/v1/completions", body)  # the prefill hop fails: computed here
    expected = httpx.post(decode.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    assert pulled.json()["choices"][0]["text"] == through["choices"][0]["text"] == expected
    time.sleep(1.2)
    m = decode.metrics()
    assert counter(decode, "failed_receives") - failed == 1
    assert m["jaxvllm:kv_cache_free_blocks"] == m["jaxvllm:kv_cache_total_blocks"]
