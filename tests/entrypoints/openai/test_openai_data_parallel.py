"""`jaxvllm serve --data-parallel-size 2`: one endpoint over two engine cores. Concurrent
requests are served by both cores, each request whole on one, and /metrics labels each
core's series with its index. When a core dies its streams get their error, /health says
503 (the server does not restart a core: its supervisor restarts the server), /metrics
drops the dead core's gauges, and the other core keeps serving."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest
from openai_server import TINY_ENGINE_FLAGS, RemoteServer, tiny_model
from prometheus_client.parser import text_string_to_metric_families

NUM_REQUESTS, MAX_TOKENS = 4, 6


async def _complete_all(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        responses = await asyncio.gather(*(c.post("/v1/completions", json={
            "model": "tiny", "prompt": f"Request {i}:", "max_tokens": MAX_TOKENS, "ignore_eos": True})
            for i in range(NUM_REQUESTS)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = RemoteServer([str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS,
                           "--served-model-name", "tiny", "--data-parallel-size", "2"])
    yield server
    server.stop()


def test_two_cores_behind_one_server(server):
    results = asyncio.run(_complete_all(server.url))
    assert [r["usage"]["completion_tokens"] for r in results] == [MAX_TOKENS] * NUM_REQUESTS
    finished, generated = {}, {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for s in family.samples:
            if s.name == "vllm:request_success_total":
                finished[s.labels["engine"]] = finished.get(s.labels["engine"], 0) + s.value
            elif s.name == "vllm:generation_tokens_total":
                generated[s.labels["engine"]] = s.value
    assert sorted(finished) == sorted(generated) == ["0", "1"]
    assert all(n > 0 for n in finished.values()) and sum(finished.values()) == NUM_REQUESTS
    assert {e: finished[e] * MAX_TOKENS for e in finished} == generated  # each request on one core


async def _stream(c: httpx.AsyncClient, i: int, events: list) -> None:
    async with c.stream("POST", "/v1/completions", json={
            "model": "tiny", "prompt": f"Stream {i}:", "max_tokens": 400, "ignore_eos": True,
            "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: [DONE]") or '"error"' in line:
                events.append((i, time.monotonic(), line))
                return


async def _kill_core_1_mid_streams(server) -> dict:
    core1 = int(re.search(r"Data-parallel engine core 1: pid (\d+)", server.log_text()).group(1))
    events, seen = [], {}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
        streams = [asyncio.create_task(_stream(c, i, events)) for i in range(8)]
        while not (running := await _all_running(c, 8)):  # every stream admitted, on both cores
            await asyncio.sleep(0.1)
        seen["on_core_1"] = running["1"]
        os.kill(core1, signal.SIGKILL)
        killed = time.monotonic()
        while "health_503" not in seen and time.monotonic() - killed < 30:
            if (await c.get("/health")).status_code == 503:
                seen["health_503"] = time.monotonic() - killed
            await asyncio.sleep(0.02)
        while len([e for e in events if '"error"' in e[2]]) < running["1"] and time.monotonic() - killed < 30:
            await asyncio.sleep(0.02)
        seen["errors"] = [(t - killed, line) for _, t, line in events]
        seen["metrics"] = (await c.get("/metrics")).text
        seen["after"] = await c.post("/v1/completions", json={"model": "tiny", "prompt": "Hi",
                                                              "max_tokens": 3})
        for task in streams:
            task.cancel()
    return seen


async def _all_running(c: httpx.AsyncClient, n: int) -> dict | None:
    """Requests running per core once all n run and both cores hold some (the balancer
    need not split them evenly), else None."""
    running = {}
    for family in text_string_to_metric_families((await c.get("/metrics")).text):
        for s in family.samples:
            if s.name == "vllm:num_requests_running":
                running[s.labels["engine"]] = s.value
    both = running.get("0", 0) > 0 and running.get("1", 0) > 0
    return running if both and sum(running.values()) == n else None


def test_a_dead_core_fails_its_streams_and_health(server):
    seen = asyncio.run(_kill_core_1_mid_streams(server))
    errors = [line for _, line in seen["errors"] if '"error"' in line]
    assert len(errors) == seen["on_core_1"] and all("core 1 died" in line for line in errors), seen["errors"]
    print(f"\nerror events {[round(t, 3) for t, _ in seen['errors']]} s after SIGKILL; "
          f"/health 503 after {seen['health_503']:.3f} s")
    assert 'engine="1"' not in "".join(l for l in seen["metrics"].splitlines()
                                       if l.startswith("vllm:num_requests_running"))
    assert 'vllm:num_requests_running{engine="0"' in seen["metrics"]
    assert seen["after"].status_code == 200, seen["after"].text
    assert server.proc.poll() is None
