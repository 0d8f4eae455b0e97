"""Killing the engine-core process: every in-flight request (streaming or not) ends with
an error within a second, and the server then exits non-zero within ten seconds (as
vLLM's does, so that a supervisor restarts it), leaving no process behind."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from openai_server import TINY_ENGINE_FLAGS, RemoteServer, tiny_model

ERROR_DEADLINE_S, EXIT_DEADLINE_S = 1.0, 10.0


@pytest.fixture
def doomed_server(tmp_path_factory):
    server = RemoteServer([str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS,
                           "--served-model-name", "tiny"])
    yield server
    server.stop()


async def _in_flight_then_kill(server: RemoteServer, pid: int):
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

    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        tasks = [asyncio.create_task(stream(c, ev)) for ev in streaming_started]
        plain = asyncio.create_task(c.post("/v1/completions", json=body))
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in streaming_started)), 60)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # Everything in flight must end by itself, with an error, within the deadline.
        done = await asyncio.wait_for(asyncio.gather(*tasks, plain), ERROR_DEADLINE_S + 1)
        ended = time.monotonic() - killed
    return done[:-1], done[-1], ended, killed


def test_killing_engine_core_fails_fast_and_the_server_exits(doomed_server):
    pid = doomed_server.engine_core_pid
    assert httpx.get(doomed_server.url + "/health").status_code == 200
    streams, plain, ended, killed = asyncio.run(_in_flight_then_kill(doomed_server, pid))
    assert ended < ERROR_DEADLINE_S
    for lines in streams:
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: "):])["error"]
        assert error["code"] == 500 and "engine" in error["message"].lower()
    assert plain.status_code == 500 and "engine" in plain.json()["error"]["message"].lower()

    code = doomed_server.proc.wait(EXIT_DEADLINE_S - (time.monotonic() - killed))
    assert code not in (0, None), code
    assert "engine core died" in doomed_server.log_text()
    for gone in (pid, doomed_server.proc.pid):
        with pytest.raises(ProcessLookupError):
            os.kill(gone, 0)
