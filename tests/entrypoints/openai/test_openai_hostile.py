"""Requests a hostile client sends: values past what the engine's arrays hold, bodies that
break parsers, templates that run away, fan-out, missing keys. Each gets its 4xx with an
OpenAI-shaped body; /health keeps answering within a second while it runs; and the same
engine process serves a normal request right after."""
from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest
from health_probe import HealthProbe
from openai_server import API_KEY, TINY_ENGINE_FLAGS, module_server, tiny_model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MAX_N, MAX_PROMPTS = 8, 16


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    profile_dir = str(tmp_path_factory.mktemp("profiles"))
    return module_server(request, [
        str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS, "--served-model-name", "tiny",
        "--api-key", API_KEY, "--profile-dir", profile_dir, "--trust-request-chat-template",
        "--chat-template-timeout", "1", "--max-n", str(MAX_N),
        "--max-prompts-per-request", str(MAX_PROMPTS), "--max-request-bytes", str(1 << 20)])


def cmpl(**fields) -> bytes:
    return json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4} | fields).encode()


def chat(**fields) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]} | fields).encode()


def raw_cmpl(fragment: str) -> bytes:
    """A body with `fragment` spliced in as written (JSON that json.dumps cannot produce)."""
    return ('{"model": "tiny", "prompt": "hi", "max_tokens": 4, ' + fragment + "}").encode()


def template(text: str) -> bytes:
    return chat(chat_template_kwargs={"chat_template": text})


LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
BIG = 2**70

# (case, method, path, body, headers, status, param)
CASES = [
    # Numbers past what the engine's int32/int64 arrays hold, and non-finite floats.
    ("top_k past int32", "POST", CMPL, cmpl(top_k=2**31), AUTH, 400, "top_k"),
    ("top_k as bool", "POST", CMPL, cmpl(top_k=True), AUTH, 400, "top_k"),
    ("temperature Infinity", "POST", CMPL, raw_cmpl('"temperature": Infinity'), AUTH, 400, None),
    ("temperature NaN", "POST", CMPL, raw_cmpl('"temperature": NaN'), AUTH, 400, None),
    ("temperature 1e309 (inf)", "POST", CMPL, raw_cmpl('"temperature": 1e309'), AUTH, 400, "temperature"),
    ("top_p as string", "POST", CMPL, cmpl(top_p="0.5"), AUTH, 400, "top_p"),
    ("presence_penalty inf", "POST", CMPL, raw_cmpl('"presence_penalty": 1e309'), AUTH, 400,
     "presence_penalty"),
    ("repetition_penalty inf", "POST", CMPL, raw_cmpl('"repetition_penalty": 1e309'), AUTH, 400,
     "repetition_penalty"),
    ("n past 64 bits", "POST", CMPL, cmpl(n=BIG), AUTH, 400, "n"),
    ("n as bool", "POST", CMPL, cmpl(n=True), AUTH, 400, "n"),
    ("seed past 64 bits", "POST", CMPL, cmpl(seed=BIG), AUTH, 400, "seed"),
    ("max_tokens past int64", "POST", CMPL, cmpl(max_tokens=2**63), AUTH, 400, "max_tokens"),
    ("max_tokens as bool", "POST", CMPL, cmpl(max_tokens=True), AUTH, 400, "max_tokens"),
    ("min_tokens past int32", "POST", CMPL, cmpl(min_tokens=2**40, max_tokens=4), AUTH, 400,
     "min_tokens"),
    ("prompt token id past 64 bits", "POST", CMPL, cmpl(prompt=[5, BIG]), AUTH, 400, "prompt"),
    ("prompt token ids as bools", "POST", CMPL, cmpl(prompt=[True, False]), AUTH, 400, "prompt"),
    ("stop_token_ids past int32", "POST", CMPL, cmpl(stop_token_ids=[2**40]), AUTH, 400,
     "stop_token_ids"),
    ("stop_token_ids as bools", "POST", CMPL, cmpl(stop_token_ids=[True]), AUTH, 400,
     "stop_token_ids[0]"),
    ("stop as list of ints", "POST", CMPL, cmpl(stop=[5]), AUTH, 400, "stop"),
    ("allowed_token_ids past the vocabulary", "POST", CMPL, cmpl(allowed_token_ids=[2**40]), AUTH,
     400, "allowed_token_ids"),
    ("bad_words as ints", "POST", CMPL, cmpl(bad_words=[5]), AUTH, 400, "bad_words[0]"),
    ("chat: bad_words as ints", "POST", CHAT, chat(bad_words=[5]), AUTH, 400, "bad_words[0]"),
    ("logit_bias to a string", "POST", CMPL, cmpl(logit_bias={"5": "x"}), AUTH, 400, "logit_bias.5"),
    ("logit_bias past the vocabulary", "POST", CMPL, cmpl(logit_bias={str(BIG): 1}), AUTH, 400,
     "logit_bias"),
    ("priority past 64 bits", "POST", CMPL, cmpl(priority=BIG), AUTH, 400, "priority"),
    ("logprobs as bool", "POST", CMPL, cmpl(logprobs=True), AUTH, 400, "logprobs"),
    ("stream as string", "POST", CMPL, cmpl(stream="yes"), AUTH, 400, "stream"),
    ("chat: top_logprobs past 64 bits", "POST", CHAT, chat(logprobs=True, top_logprobs=BIG), AUTH,
     400, "top_logprobs"),
    ("chat: content as a number", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]),
     AUTH, 400, "messages[0].content"),
    ("detokenize: id past 64 bits", "POST", "/detokenize", json.dumps({"tokens": [BIG]}).encode(),
     AUTH, 400, "tokens"),
    # Bodies that break parsers.
    ("nested 100k deep", "POST", CMPL, b"[" * 100_000 + b"]" * 100_000, AUTH, 400, None),
    ("nested 100 deep in an unknown field", "POST", CMPL,
     raw_cmpl('"extra": ' + "{\"a\": " * 100 + "1" + "}" * 100), AUTH, 400, None),
    ("lone surrogate in model", "POST", CMPL, b'{"model": "\\ud800", "prompt": "hi"}', AUTH, 400, None),
    ("lone surrogate in prompt", "POST", CMPL, b'{"model": "tiny", "prompt": "a\\udfffb"}', AUTH,
     400, None),
    ("lone surrogate in a chat message", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', AUTH, 400, None),
    ("lone surrogate in /tokenize", "POST", "/tokenize", b'{"prompt": "\\udc00"}', AUTH, 400, None),
    # Grammars of the wrong shape.
    ("regex given as a list", "POST", CMPL, cmpl(structured_outputs={"regex": ["a+", "b"]}), AUTH,
     400, "structured_outputs.regex"),
    ("json schema given as a number", "POST", CMPL, cmpl(structured_outputs={"json": 5}), AUTH,
     400, "structured_outputs.json"),
    ("empty choice list", "POST", CMPL, cmpl(structured_outputs={"choice": []}), AUTH, 400,
     "structured_outputs"),
    ("regex that does not compile", "POST", CMPL, cmpl(structured_outputs={"regex": "(a"}), AUTH,
     400, "structured_outputs"),
    # Fan-out past the server's caps.
    ("n past --max-n", "POST", CMPL, cmpl(n=MAX_N + 1), AUTH, 400, "n"),
    ("chat: n past --max-n", "POST", CHAT, chat(n=1000), AUTH, 400, "n"),
    ("prompts past --max-prompts-per-request", "POST", CMPL, cmpl(prompt=["hi"] * 1000), AUTH, 400,
     "prompt"),
    # Templates a request brings: sandboxed, with a time and size limit.
    ("template: nested loops", "POST", CHAT, template(LOOPS), AUTH, 400, "chat_template"),
    ("template: output past the size limit", "POST", CHAT,
     template("{% for a in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"), AUTH, 400,
     "chat_template"),
    ("template: reaches for Python internals", "POST", CHAT,
     template("{{ ''.__class__.__mro__[1].__subclasses__() }}"), AUTH, 400, "chat_template"),
    ("template: syntax error", "POST", CHAT, template("{% for %}"), AUTH, 400, "chat_template"),
    ("template: not a string", "POST", CHAT, chat(chat_template=["x"]), AUTH, 400, "chat_template"),
    ("tokenize: template with nested loops", "POST", "/tokenize",
     json.dumps({"messages": [{"role": "user", "content": "hi"}], "chat_template": LOOPS}).encode(),
     AUTH, 400, "chat_template"),
    # Work that needs the key.
    ("tokenize without the key", "POST", "/tokenize", b'{"prompt": "hi"}', {}, 401, None),
    ("detokenize without the key", "POST", "/detokenize", b'{"tokens": [1]}', {}, 401, None),
    ("start_profile without the key", "POST", "/start_profile", b"", {}, 401, None),
    ("tokenizer_info without the key", "GET", "/tokenizer_info", b"", {}, 401, None),
    ("docs without the key", "GET", "/docs", b"", {}, 401, None),
    ("openapi.json without the key", "GET", "/openapi.json", b"", {}, 401, None),
    # Bodies that say they are not JSON.
    ("body as text/plain", "POST", CMPL, cmpl(), AUTH | {"Content-Type": "text/plain"}, 415, None),
    ("body form-encoded", "POST", CHAT, chat(),
     AUTH | {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
    ("an unknown model named in 20 KB", "POST", CMPL, cmpl(model="m" * 20_000), AUTH, 404, "model"),
    ("body past --max-request-bytes", "POST", "/tokenize",
     json.dumps({"prompt": "a" * (2 << 20)}).encode(), AUTH, 413, None),
]


@pytest.fixture(scope="module")
def probe(server):
    probe = HealthProbe(server.url)
    yield probe
    probe.close()


@pytest.mark.parametrize("case,method,path,raw,headers,status,param", CASES, ids=[c[0] for c in CASES])
def test_hostile_request(server, probe, case, method, path, raw, headers, status, param):
    pid = server.engine_core_pid
    with probe.window() as health:
        r = httpx.request(method, server.url + path, content=raw,
                          headers={"Content-Type": "application/json"} | headers, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["param"] == param and err["message"]
    assert "Traceback" not in err["message"] and not re.search(r"\b[A-Z]\w*Error\b", err["message"])
    assert len(err["message"]) < 1000  # nothing the client sent is echoed whole
    # /health answered within a second throughout: the server never waits on the hostile work.
    assert health.worst < 1.0 and not health.failures, (health.worst, health.failures)
    ok = httpx.post(server.url + CMPL, json={"model": "tiny", "prompt": "Hello", "max_tokens": 3},
                    headers=AUTH, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 3
    assert server.engine_core_pid == pid and server.proc.poll() is None


def test_a_trusted_request_template_renders(server):
    """The sandbox renders an honest template (and /tokenize counts it the same way)."""
    tpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ eos_token }}"
    r = httpx.post(server.url + "/tokenize", headers=AUTH, timeout=60, json={
        "messages": [{"role": "user", "content": "hello there"}], "chat_template": tpl})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    r = httpx.post(server.url + "/tokenize", headers=AUTH, timeout=60,
                   json={"prompt": "<user>hello there<|im_end|>", "add_special_tokens": False})
    assert r.json()["tokens"] == tokens
    r = httpx.post(server.url + CHAT, headers=AUTH, timeout=60, content=chat(
        messages=[{"role": "user", "content": "hello there"}], chat_template=tpl))
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(tokens), r.text


def test_open_probes_need_no_key_and_the_model_path_stays_private(server):
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path
    models = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["tiny"] and "/" not in json.dumps(models)
    from jaxvllm.entrypoints.openai.api_server import default_served_name
    assert default_served_name("/models/my-llama/") == "my-llama"  # no path shown
    assert default_served_name("org/name") == "org/name"  # a Hub id as vLLM serves it


def test_idle_connections_cannot_take_the_server(tmp_path_factory, request):
    """Sockets that never finish a request head: past --max-concurrent-connections they are
    closed as they come, the rest after --header-timeout; the server then answers again,
    and its log did not fill up meanwhile."""
    srv = module_server(request, [
        str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS, "--header-timeout", "1",
        "--max-concurrent-connections", "32"])
    log_before = len(srv.log_text())
    idle = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            idle.append(s)
        start = time.monotonic()
        for s in idle:  # every one is closed by the server, none outlives the timeout
            try:
                assert s.recv(1024) == b""
            except ConnectionResetError:  # closed with the unread head still queued
                pass
        assert time.monotonic() - start < 5
    finally:
        for s in idle:
            s.close()
    assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
    assert len(srv.log_text()) - log_before < 20_000


def test_failed_accepts_log_once_a_minute(caplog):
    import asyncio

    from jaxvllm.entrypoints.openai.connection_limits import install_accept_error_handler

    loop = asyncio.new_event_loop()
    try:
        install_accept_error_handler(loop)
        with caplog.at_level("WARNING"):
            for _ in range(100):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files")})
    finally:
        loop.close()
    records = [r for r in caplog.records if "Cannot accept connections" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is None
