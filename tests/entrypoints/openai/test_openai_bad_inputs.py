"""Bad requests get the right status and an OpenAI-shaped error naming the field, and the
server answers a normal request right after each one."""
from __future__ import annotations

import json

import httpx
import pytest
from openai_server import API_KEY, client, tiny_server  # noqa: F401  (fixtures)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


def body(**fields) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 4} | fields).encode()


def chat(**fields) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]} | fields).encode()


# (case, path, raw body, headers, status, param)
CASES = [
    ("invalid JSON", CMPL, b'{"prompt": "hi",', AUTH, 400, None),
    ("non-UTF-8 bytes", CMPL, b'{"prompt": "\xff\xfe hi"}', AUTH, 400, None),
    ("body is a JSON array", CMPL, b'[1, 2]', AUTH, 400, None),
    ("missing prompt", CMPL, b'{"max_tokens": 4}', AUTH, 400, "prompt"),
    ("prompt of the wrong type", CMPL, body(prompt=5), AUTH, 400, "prompt"),
    ("max_tokens of the wrong type", CMPL, body(prompt="hi", max_tokens="many"), AUTH, 400, "max_tokens"),
    ("negative max_tokens", CMPL, body(prompt="hi", max_tokens=-1), AUTH, 400, "max_tokens"),
    ("huge max_tokens", CMPL, body(prompt="hi", max_tokens=10**9), AUTH, 400, "max_tokens"),
    ("huge max_completion_tokens", CMPL, body(prompt="hi", max_completion_tokens=10**6), AUTH, 400,
     "max_completion_tokens"),
    ("temperature < 0", CMPL, body(prompt="hi", temperature=-0.5), AUTH, 400, "temperature"),
    ("top_p > 1", CMPL, body(prompt="hi", top_p=1.5), AUTH, 400, "top_p"),
    ("n = 0", CMPL, body(prompt="hi", n=0), AUTH, 400, "n"),
    ("empty prompt", CMPL, body(prompt=""), AUTH, 400, "prompt"),
    ("empty prompt list", CMPL, body(prompt=[]), AUTH, 400, "prompt"),
    ("over-long prompt", CMPL, body(prompt=[100] * 600), AUTH, 400, "prompt"),
    ("token id outside the vocabulary", CMPL, body(prompt=[[5, 6], [10**7]]), AUTH, 400, "prompt[1]"),
    ("stop of the wrong type", CMPL, body(prompt="hi", stop=5), AUTH, 400, "stop"),
    ("stream_options of the wrong type", CMPL, body(prompt="hi", stream=True, stream_options=3), AUTH,
     400, "stream_options"),
    ("stream_options without stream", CMPL, body(prompt="hi", stream_options={"include_usage": True}),
     AUTH, 400, "stream_options"),
    ("top_k < -1", CMPL, body(prompt="hi", top_k=-5), AUTH, 400, "top_k"),
    ("min_p > 1", CMPL, body(prompt="hi", min_p=2.0), AUTH, 400, "min_p"),
    ("negative seed", CMPL, body(prompt="hi", seed=-3), AUTH, 400, "seed"),
    ("logprobs > 20", CMPL, body(prompt="hi", logprobs=50), AUTH, 400, "logprobs"),
    ("min_tokens > max_tokens", CMPL, body(prompt="hi", min_tokens=9), AUTH, 400, "min_tokens"),
    ("unknown model", CMPL, body(prompt="hi", model="gpt-4"), AUTH, 404, "model"),
    ("missing API key", CMPL, body(prompt="hi"), {}, 401, None),
    ("wrong API key", CMPL, body(prompt="hi"), {"Authorization": "Bearer nope"}, 401, None),
    ("body over the size limit", CMPL, body(prompt="a " * (5 << 20)), AUTH, 413, None),
    ("chat: messages not a list", CHAT, chat(messages="hi"), AUTH, 400, "messages"),
    ("chat: empty messages", CHAT, chat(messages=[]), AUTH, 400, "messages"),
    ("chat: message without role", CHAT, chat(messages=[{"content": "hi"}]), AUTH, 400,
     "messages[0].role"),
    ("chat: unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), AUTH, 400,
     "messages[0].role"),
    ("chat: image content part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), AUTH, 400,
     "messages[0].content[0].type"),
    ("chat: top_logprobs without logprobs", CHAT, chat(top_logprobs=2), AUTH, 400, "top_logprobs"),
    ("chat: n of the wrong type", CHAT, chat(n="two"), AUTH, 400, "n"),
    ("chat: a template of its own, not trusted", CHAT, chat(chat_template="{{ messages }}"), AUTH,
     400, "chat_template"),
    ("tokenize: neither prompt nor messages", "/tokenize", b"{}", AUTH, 400, "prompt"),
    ("detokenize: token id out of range", "/detokenize", b'{"tokens": [-1]}', AUTH, 400, "tokens"),
]


@pytest.mark.parametrize("case,path,raw,headers,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_then_normal_request(tiny_server, case, path, raw, headers, status, param):
    r = httpx.post(tiny_server.url + path, content=raw,
                   headers={"Content-Type": "application/json"} | headers, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["param"] == param
    assert isinstance(err["message"], str) and err["message"]
    if param:
        assert param.split("[")[0].split(".")[-1] in err["message"] or param in err["message"]
    ok = httpx.post(tiny_server.url + CMPL, json={"model": "tiny", "prompt": "Hello", "max_tokens": 3},
                    headers=AUTH, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] >= 1


def test_unknown_route_and_method_are_openai_shaped(client):
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
