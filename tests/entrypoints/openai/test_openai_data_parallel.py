"""`jaxvllm serve --data-parallel-size 2`: one endpoint over two engine cores. Concurrent
requests are served by both cores, each request whole on one, and /metrics labels each
core's series with its index."""
from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from openai_server import TINY_ENGINE_FLAGS, RemoteServer, tiny_model

NUM_REQUESTS, MAX_TOKENS = 4, 6


async def _complete_all(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        responses = await asyncio.gather(*(c.post("/v1/completions", json={
            "model": "tiny", "prompt": f"Request {i}:", "max_tokens": MAX_TOKENS, "ignore_eos": True})
            for i in range(NUM_REQUESTS)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


def test_two_cores_behind_one_server(tmp_path_factory):
    server = RemoteServer([str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS,
                           "--served-model-name", "tiny", "--data-parallel-size", "2"])
    try:
        results = asyncio.run(_complete_all(server.url))
        assert [r["usage"]["completion_tokens"] for r in results] == [MAX_TOKENS] * NUM_REQUESTS
        finished, generated = {}, {}
        for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
            for s in family.samples:
                if s.name == "jaxvllm:request_success_total":
                    finished[s.labels["engine"]] = finished.get(s.labels["engine"], 0) + s.value
                elif s.name == "jaxvllm:generation_tokens_total":
                    generated[s.labels["engine"]] = s.value
        assert sorted(finished) == sorted(generated) == ["0", "1"]
        assert all(n > 0 for n in finished.values()) and sum(finished.values()) == NUM_REQUESTS
        assert {e: finished[e] * MAX_TOKENS for e in finished} == generated  # each request on one core
    finally:
        server.stop()
