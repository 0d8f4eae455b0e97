"""Many streaming clients at once, a third of them hanging up mid-stream: the others
complete, the dropped requests are aborted in the engine, and the KV pool is whole again.
Also: /metrics exposes what operators graph, under vLLM's names: every query of vLLM's
published Grafana dashboard finds its series."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
from openai_server import API_KEY, client, tiny_server  # noqa: F401  (fixtures)
from vllm_grafana import DASHBOARD_QUERIES, unmatched

NUM_CLIENTS, KEPT_TOKENS, DROPPED_TOKENS = 32, 24, 400


async def _stream_client(c: httpx.AsyncClient, i: int, drop: bool):
    body = {"model": "tiny", "prompt": f"Client number {i} says", "stream": True, "ignore_eos": True,
            "max_tokens": DROPPED_TOKENS if drop else KEPT_TOKENS,
            "stream_options": {"include_usage": True}}
    events = []
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            if drop and len(events) == 2:
                return None  # leaving the block closes the connection mid-stream
            events.append(line)
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


async def _run_clients(url: str):
    async with httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"},
                                 limits=httpx.Limits(max_connections=NUM_CLIENTS + 4)) as c:
        return await asyncio.gather(*(_stream_client(c, i, drop=i % 3 == 0) for i in range(NUM_CLIENTS)))


def _wait_idle(server, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"engine still busy: {m}"
        time.sleep(0.2)


def test_32_streams_a_third_disconnecting(tiny_server):
    before = _wait_idle(tiny_server)
    results = asyncio.run(_run_clients(tiny_server.url))
    dropped = [r for r in results if r is None]
    kept = [r for r in results if r is not None]
    assert len(dropped) == 11 and len(kept) == 21
    for events in kept:
        assert events[-1]["usage"]["completion_tokens"] == KEPT_TOKENS
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert "".join(e["choices"][0]["text"] for e in events[:-1])
    after = _wait_idle(tiny_server)
    aborted = after["jaxvllm:num_requests_aborted_total"] - before["jaxvllm:num_requests_aborted_total"]
    assert aborted == len(dropped)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    # Had the dropped requests run on, they alone would have generated 11 * 400 tokens.
    assert generated < len(kept) * KEPT_TOKENS + len(dropped) * DROPPED_TOKENS / 2
    assert after["jaxvllm:kv_cache_free_blocks"] == after["jaxvllm:kv_cache_total_blocks"] > 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    # The server keeps serving.
    r = httpx.post(tiny_server.url + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": "tiny", "prompt": "ok", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200


def test_non_streaming_client_disconnect_aborts(tiny_server):
    before = _wait_idle(tiny_server)
    try:
        httpx.post(tiny_server.url + "/v1/completions", timeout=httpx.Timeout(60, read=0.3),
                   headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": "tiny", "prompt": [7] * 8, "max_tokens": 500, "ignore_eos": True, "n": 1})
        finished = True
    except httpx.ReadTimeout:
        finished = False
    after = _wait_idle(tiny_server)
    if not finished:  # the client gave up first: the server must have aborted it
        assert (after["jaxvllm:num_requests_aborted_total"]
                - before["jaxvllm:num_requests_aborted_total"]) == 1
        generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        assert generated < 500
    assert after["jaxvllm:kv_cache_free_blocks"] == after["jaxvllm:kv_cache_total_blocks"]


def test_metrics_cover_what_operators_graph(client, tiny_server):
    prompt = "A long shared system prompt that the prefix cache should remember " * 4
    for _ in range(2):
        assert client.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                    "max_tokens": 3}).status_code == 200
    m = tiny_server.metrics()
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "jaxvllm:prefix_cache_hit_rate", "jaxvllm:kv_cache_free_blocks",
                 "jaxvllm:kv_cache_total_blocks", "jaxvllm:num_compilations",
                 "vllm:num_preemptions_total"]:
        assert name in m, name
    assert m["vllm:prefix_cache_hits_total"] > 0 and 0 < m["jaxvllm:prefix_cache_hit_rate"] <= 1
    assert m["vllm:prompt_tokens_total"] > 0 and m["vllm:generation_tokens_total"] > 0
    for hist in ["time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds"]:
        assert m[f"vllm:{hist}_count"] > 0 and f"vllm:{hist}_bucket{{le=+Inf}}" in m
    assert m["vllm:request_success_total{finished_reason=length}"] >= 2
    assert m["jaxvllm:num_compilations"] >= 1


def test_vllm_grafana_dashboard_finds_every_series(client, tiny_server):
    for stream in (False, True):
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Dashboards", "max_tokens": 4,
                                                 "ignore_eos": True, "stream": stream})
        assert r.status_code == 200
    text = client.get("/metrics").text
    assert len(DASHBOARD_QUERIES) == 32  # the dashboard's panel targets
    assert unmatched(text, "tiny") == []
    assert unmatched(text, "another-model")  # the matcher does tell a missing series
    assert 'vllm:cache_config_info{block_size="' in text and 'engine="0"' in text
    assert "vllm:iteration_tokens_total_bucket" in text
