"""Killing the engine-core process: /health fails and every in-flight request (streaming
or not) ends with an error within 5 seconds; nothing hangs. It uses the shared tiny server
and discards it afterwards (a later test gets a fresh one); the module name sorts last."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from openai_server import API_KEY, RemoteServer, discard_server, tiny_server  # noqa: F401

AUTH = {"Authorization": f"Bearer {API_KEY}"}
DEADLINE_S = 5.0


@pytest.fixture(scope="module")
def doomed_server(tiny_server):
    yield tiny_server
    discard_server("tiny")


async def _in_flight_then_kill(server: RemoteServer):
    body = {"model": "tiny", "prompt": [5] * 8, "max_tokens": 500, "ignore_eos": True}
    streaming_started = [asyncio.Event() for _ in range(3)]

    async def stream(c, started: asyncio.Event):
        lines = []
        async with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
                    started.set()
        return lines

    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as c:
        tasks = [asyncio.create_task(stream(c, ev)) for ev in streaming_started]
        plain = asyncio.create_task(c.post("/v1/completions", json=body))
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in streaming_started)), 60)
        os.kill(server.engine_core_pid, signal.SIGKILL)
        # Everything in flight must end by itself, with an error, within the deadline.
        done = await asyncio.wait_for(asyncio.gather(*tasks, plain), DEADLINE_S)
    return done[:-1], done[-1]


def test_killing_engine_core_fails_fast(doomed_server):
    assert httpx.get(doomed_server.url + "/health").status_code == 200
    streams, plain = asyncio.run(_in_flight_then_kill(doomed_server))
    for lines in streams:
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: "):])["error"]
        assert error["code"] == 500 and "engine" in error["message"].lower()
    assert plain.status_code == 500 and "engine" in plain.json()["error"]["message"].lower()

    deadline = time.monotonic() + DEADLINE_S
    while httpx.get(doomed_server.url + "/health", timeout=DEADLINE_S).status_code == 200:
        assert time.monotonic() < deadline, "/health still reports a dead engine as healthy"
        time.sleep(0.1)
    assert httpx.get(doomed_server.url + "/health").status_code == 503
    # New requests fail at once with the same error shape; the HTTP server itself stays up.
    r = httpx.post(doomed_server.url + "/v1/completions", headers=AUTH, timeout=DEADLINE_S,
                   json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    r = httpx.post(doomed_server.url + "/v1/chat/completions", headers=AUTH, timeout=DEADLINE_S,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert r.status_code == 500 and "engine" in r.json()["error"]["message"].lower()
    r = httpx.post(doomed_server.url + "/tokenize", json={"prompt": "still here"}, timeout=DEADLINE_S)
    assert r.status_code == 200 and r.json()["count"] > 0
    assert httpx.get(doomed_server.url + "/metrics", timeout=DEADLINE_S).status_code == 200
