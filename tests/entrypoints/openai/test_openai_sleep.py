"""The sleep-mode endpoints (--enable-sleep-mode): vLLM's paths and parameters, behind the API
key; generation answers 503 while asleep; /update_weights from a path changes the greedy
output and a bad one changes nothing; a server without the flag serves none of them."""
from __future__ import annotations

import asyncio
import shutil

import httpx
import numpy as np
import pytest
from openai_server import API_KEY, TINY_ENGINE_FLAGS, client, module_server, tiny_model, tiny_server  # noqa: F401
from safetensors.numpy import load_file, save_file

PROMPT = {"model": "tiny", "prompt": "Hello there", "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def sleepy(request, tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    server = module_server(request, [
        str(model), *TINY_ENGINE_FLAGS, "--served-model-name", "tiny", "--api-key", API_KEY,
        "--enable-sleep-mode"])
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c, model


def text(c) -> str:
    r = c.post("/v1/completions", json=PROMPT)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_sleep_wake_up_and_is_sleeping(sleepy):
    c, _ = sleepy
    before = text(c)
    assert httpx.post(str(c.base_url) + "/sleep").status_code == 401  # the API key guards them
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}
    assert c.post("/sleep", params={"level": 1}).status_code == 200
    assert c.get("/is_sleeping").json() == {"is_sleeping": True}
    r = c.post("/v1/completions", json=PROMPT)
    assert r.status_code == 503 and "sleeping" in r.json()["error"]["message"]
    chat = c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 503
    assert c.post("/wake_up", params={"tags": "weights"}).status_code == 200
    assert c.get("/is_sleeping").json() == {"is_sleeping": True}  # the KV cache still asleep
    assert c.post("/wake_up").status_code == 200
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}
    assert text(c) == before
    bad = c.post("/sleep", params={"level": 3})
    assert bad.status_code == 400 and "level must be 1 or 2" in bad.json()["error"]["message"]
    assert c.post("/wake_up", params={"tags": "gpu"}).status_code == 400
    assert c.post("/reset_prefix_cache").status_code == 200


def test_update_weights_from_a_path(sleepy, tmp_path):
    c, model = sleepy
    before = text(c)
    tensors = load_file(str(model / "model.safetensors"))
    new = tmp_path / "new"
    new.mkdir()
    rng = np.random.default_rng(0)
    save_file({k: (v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in tensors.items()},
              str(new / "model.safetensors"))
    assert c.post("/sleep", params={"level": 2}).status_code == 200
    assert c.post("/update_weights", json={"update_info": {"path": str(new)}}).status_code == 200
    assert c.post("/wake_up", params={"tags": "kv_cache"}).status_code == 200
    after = text(c)
    assert after != before
    wrong = tmp_path / "wrong"
    shutil.copytree(new, wrong)
    save_file({"model.norm.weight": np.ones(3, np.float32)}, str(wrong / "model.safetensors"))
    r = c.post("/update_weights", json={"update_info": {"path": str(wrong)}})
    assert r.status_code == 400 and "'model.norm.weight' has shape (3,)" in r.json()["error"]["message"]
    assert c.post("/update_weights", json={"path": str(new)}).status_code == 400
    assert c.post("/update_weights", json={"update_info": {"path": str(tmp_path / "none")}}).status_code == 400
    assert text(c) == after  # the refused updates changed nothing
    assert c.post("/update_weights", json={"update_info": {"path": str(model)}}).status_code == 200
    assert text(c) == before


def test_refused_without_the_flag(client):  # noqa: F811
    for path in ("/sleep", "/wake_up", "/reset_prefix_cache", "/update_weights"):
        assert client.post(path).status_code == 404, path
    assert client.get("/is_sleeping").status_code == 404


@pytest.mark.parametrize("level", ["99999999999999999999999", "abc", "", "1.0", "-1"])
def test_sleep_level_is_validated_into_a_400(sleepy, level):
    c, _ = sleepy
    r = c.post("/sleep", params={"level": level})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "level" and "level must be 1 or 2" in r.json()["error"]["message"]
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}


async def _race(url: str, delays: list[float]) -> tuple[int, list[int]]:
    """/sleep and completions sent meanwhile, each after its delay."""
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        async def complete(delay):
            await asyncio.sleep(delay)
            return (await c.post("/v1/completions", json=PROMPT)).status_code
        sleep = asyncio.ensure_future(c.post("/sleep", params={"level": 1}))
        statuses = await asyncio.gather(*(complete(d) for d in delays))
        return (await sleep).status_code, list(statuses)


def test_requests_racing_sleep_get_503(sleepy):
    """Requests that arrive while /sleep runs are refused with 503 (never a 500): the front
    end's sleep state admits none from the moment /sleep starts, and a request that reaches a
    sleeping engine core gets the same 503. /sleep itself answers 200, or 409 when a request
    admitted before it is still in flight."""
    c, _ = sleepy
    seen = {}
    for _ in range(6):
        sleep, statuses = asyncio.run(_race(str(c.base_url), [0.002 * i for i in range(12)]))
        assert sleep in (200, 409), sleep
        assert set(statuses) <= {200, 503}, statuses
        for s in [sleep, *statuses]:
            seen[s] = seen.get(s, 0) + 1
        if sleep == 200:
            assert c.post("/v1/completions", json=PROMPT).status_code == 503
            assert c.post("/wake_up").status_code == 200
    print(f"\nstatuses over 6 races (/sleep and 72 completions): {seen}")
    assert seen.get(503), seen
    assert c.get("/is_sleeping").json() == {"is_sleeping": False} and text(c)


def test_every_update_weights_refusal_says_why(sleepy, tmp_path):
    c, _ = sleepy
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "nothing").mkdir()
    for path in ("empty", "junk.gguf", "nothing", "missing"):
        r = c.post("/update_weights", json={"update_info": {"path": str(tmp_path / path)}})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert message.startswith("update_weights: ") and not message.rstrip(".").endswith(":"), message
        assert len(message) > len(f"update_weights: {str(tmp_path / path)!r}") + 20, message
