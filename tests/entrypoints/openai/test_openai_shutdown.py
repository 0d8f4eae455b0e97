"""Stopping `jaxvllm serve` as a supervisor (SIGTERM) or a terminal (Ctrl-C: SIGINT to the
whole process group) does: under load every stream completes or ends with an error event,
new requests get 503 meanwhile, and the server exits 0 with no traceback and no process of
its group left; during start-up it stops within 2 s, even mid-compile."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from openai_server import TINY_ENGINE_FLAGS, RemoteServer, tiny_model

SHUTDOWN_TIMEOUT_S = 2.0


def send(server: RemoteServer, how: str) -> None:
    if how == "SIGTERM":
        server.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(server.proc.pid, signal.SIGINT)


def assert_stopped_cleanly(server: RemoteServer, within_s: float) -> float:
    """Returns when the server exited (time.monotonic())."""
    code = server.proc.wait(within_s)
    exited = time.monotonic()
    log = server.log_text()
    assert code == 0, log
    assert "Traceback" not in log, log
    deadline = time.monotonic() + 5
    while server.group_pids() and time.monotonic() < deadline:  # children reaped by init
        time.sleep(0.1)
    assert server.group_pids() == [], server.group_pids()
    return exited


async def _streams_then_signal(server: RemoteServer, how: str):
    long = {"model": "tiny", "prompt": [5] * 8, "max_tokens": 480, "ignore_eos": True, "stream": True}
    short = long | {"max_tokens": 8}
    started = [asyncio.Event() for _ in range(16)]

    async def stream(c, body, ev):
        lines = []
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
                    ev.set()
        ev.set()
        return lines

    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        tasks = [asyncio.create_task(stream(c, long if i % 2 else short, ev))
                 for i, ev in enumerate(started)]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 60)
        send(server, how)
        await asyncio.sleep(0.3)
        late = await c.post("/v1/completions", json=short | {"stream": False})
        streams = await asyncio.wait_for(asyncio.gather(*tasks), SHUTDOWN_TIMEOUT_S + 10)
    return streams, late


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the group"])
def test_shutdown_under_load(tmp_path_factory, how):
    server = RemoteServer([str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS,
                           "--served-model-name", "tiny", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)])
    try:
        streams, late = asyncio.run(_streams_then_signal(server, how))
        assert late.status_code == 503 and late.json()["error"]["code"] == 503
        completed = errored = 0
        for lines in streams:
            assert lines[-1] == "data: [DONE]", lines[-3:]
            last = json.loads(lines[-2][len("data: "):])
            if "error" in last:
                errored += 1
                assert "shutting down" in last["error"]["message"]
            else:
                completed += 1
                assert last["choices"][0]["finish_reason"] == "length"
        assert completed >= 8 and completed + errored == 16
        assert_stopped_cleanly(server, SHUTDOWN_TIMEOUT_S + 15)
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the group"])
def test_stop_during_start_up(tmp_path_factory, how):
    """Signalled while the engine compiles its warm-up programs."""
    flags = [f for f in TINY_ENGINE_FLAGS if f != "--skip-warmup"]
    server = RemoteServer([str(tiny_model(tmp_path_factory)), *flags], wait_ready=False)
    try:
        deadline = time.monotonic() + 120
        while "Memory plan per device:" not in server.log_text():  # logged just before the warm-up compiles
            assert time.monotonic() < deadline and server.proc.poll() is None, server.log_text()
            time.sleep(0.05)
        signalled = time.monotonic()
        send(server, how)
        assert assert_stopped_cleanly(server, 10) - signalled < 2.0
        assert "Warm-up:" not in server.log_text()  # it was stopped mid-compile
    finally:
        server.stop()
