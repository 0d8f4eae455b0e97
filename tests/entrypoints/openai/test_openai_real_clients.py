"""One test per thing real clients send (benchmark clients, eval harnesses, SDKs), over raw
HTTP against a real server with a tiny random model."""
from __future__ import annotations

import dataclasses
import json

import pytest
from openai_server import client, tiny_server  # noqa: F401  (fixtures)

from jaxvllm.sampling_params import SamplingParams

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


def needs(*names):
    missing = [n for n in names if n not in SAMPLING_FIELDS]
    return pytest.mark.skipif(bool(missing), reason=f"SamplingParams has no {missing} yet "
                                                   f"(the sampler branch adds them)")


def complete(client, **fields) -> dict:
    r = client.post("/v1/completions", json={"model": "tiny", "max_tokens": 4} | fields)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(client, text: str) -> list[int]:
    return client.post("/tokenize", json={"prompt": text}).json()["tokens"]


def sse_events(response) -> list:
    lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_prompt_as_string(client):
    out = complete(client, prompt="The capital of France is")
    assert len(out["choices"]) == 1 and out["object"] == "text_completion"
    assert out["usage"]["prompt_tokens"] == len(tokens(client, "The capital of France is"))
    assert out["usage"]["completion_tokens"] == 4
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 4


def test_prompt_as_list_of_strings(client):
    out = complete(client, prompt=["Hello", "Goodbye my friend"], ignore_eos=True)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    expected = len(tokens(client, "Hello")) + len(tokens(client, "Goodbye my friend"))
    assert out["usage"]["prompt_tokens"] == expected
    assert out["usage"]["completion_tokens"] == 8


def test_prompt_as_token_ids(client):
    ids = tokens(client, "Once upon a time")
    by_ids = complete(client, prompt=ids, temperature=0)
    by_text = complete(client, prompt="Once upon a time", temperature=0)
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_prompt_as_list_of_token_id_lists(client):
    out = complete(client, prompt=[[1, 2, 3], [40, 41]], temperature=0)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"]["prompt_tokens"] == 5


def test_echo_without_logprobs(client):
    out = complete(client, prompt="Echo this", echo=True, temperature=0)
    plain = complete(client, prompt="Echo this", temperature=0)
    assert out["choices"][0]["text"] == "Echo this" + plain["choices"][0]["text"]


@needs("logprobs", "prompt_logprobs")
def test_echo_with_logprobs(client):
    ids = tokens(client, "The quick brown fox")
    out = complete(client, prompt="The quick brown fox", echo=True, logprobs=2, max_tokens=3,
                   temperature=0)
    lp = out["choices"][0]["logprobs"]
    n = len(ids) + 3
    assert all(len(lp[k]) == n for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
    assert all(1 <= len(t) <= 3 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert "".join(lp["tokens"][:len(ids)]) == "The quick brown fox"


@needs("logprobs")
def test_completion_logprobs_greedy_token_is_top(client):
    out = complete(client, prompt="Hello", logprobs=3, temperature=0, max_tokens=3)
    lp = out["choices"][0]["logprobs"]
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert value == pytest.approx(max(top.values()), abs=1e-4) and token in top


@needs("logprobs")
def test_chat_logprobs_and_streamed_completion_logprobs(client):
    chat = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "ignore_eos": True, "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 and c["bytes"] for c in content)
    with client.stream("POST", "/v1/completions", json={
            "model": "tiny", "prompt": "Stream", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "logprobs": 1}) as r:
        events = sse_events(r)
    lps = [e["choices"][0]["logprobs"] for e in events]
    assert sum(len(lp["tokens"]) for lp in lps) == 5
    offsets = [o for lp in lps for o in lp["text_offset"]]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_max_completion_tokens(client):
    out = complete(client, prompt="Count:", max_tokens=None, max_completion_tokens=7, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 7 and out["choices"][0]["finish_reason"] == "length"


def test_chat_content_as_string_or_text_parts(client):
    base = {"model": "tiny", "max_tokens": 5, "temperature": 0}
    as_str = client.post("/v1/chat/completions", json=base | {
        "messages": [{"role": "user", "content": "Hi there\nfriend"}]}).json()
    as_parts = client.post("/v1/chat/completions", json=base | {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi there"},
                                                   {"type": "text", "text": "friend"}]}]}).json()
    assert as_str["usage"] == as_parts["usage"]
    assert as_str["choices"][0]["message"] == as_parts["choices"][0]["message"]
    assert as_str["choices"][0]["message"]["role"] == "assistant"
    counted = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi there\nfriend"}]})
    assert counted.json()["count"] == as_str["usage"]["prompt_tokens"]


def test_stream_options_include_usage(client):
    with client.stream("POST", "/v1/completions", json={
            "model": "tiny", "prompt": "Stream me", "max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        events = sse_events(r)
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stream_options_continuous_usage_stats(client):
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 6,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        events = sse_events(r)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 6 and all(e["usage"] for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text


def test_x_request_id_echoed(client):
    rid = "my-trace id/42?&=#!"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                    headers={"x-request-id": rid})
    assert r.headers["x-request-id"] == rid and r.json()["id"] == f"cmpl-{rid}"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "", "max_tokens": 2},
                    headers={"x-request-id": rid})
    assert r.status_code == 400 and r.headers["x-request-id"] == rid


def test_unknown_extra_fields_ignored(client):
    out = complete(client, prompt="Hello", foo={"bar": [1, 2]}, guided_json=None, best_of=None,
                   response_format={"type": "text"}, user="someone", suffix=None)
    assert out["usage"]["completion_tokens"] == 4


def test_vllm_extra_sampling_fields(client):
    out = complete(client, prompt="Hello", top_k=5, min_p=0.05, min_tokens=6, max_tokens=6,
                   ignore_eos=True, seed=7, temperature=0.8)
    again = complete(client, prompt="Hello", top_k=5, min_p=0.05, min_tokens=6, max_tokens=6,
                     ignore_eos=True, seed=7, temperature=0.8)
    assert out["usage"]["completion_tokens"] == 6
    assert out["choices"][0]["text"] == again["choices"][0]["text"]


@needs("presence_penalty", "frequency_penalty", "repetition_penalty")
def test_penalties_accepted(client):
    out = complete(client, prompt="Hello", presence_penalty=0.5, frequency_penalty=0.5,
                   repetition_penalty=1.2)
    assert out["usage"]["completion_tokens"] == 4


def test_unsupported_penalty_is_a_clear_400_or_accepted(client):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2,
                                             "repetition_penalty": 1.3})
    if "repetition_penalty" in SAMPLING_FIELDS:
        assert r.status_code == 200
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty"


def test_tokenizer_endpoints(client):
    tok = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] == 512
    assert client.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": "Hello world"}
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["vocab_size"] >= 49152 and info["chat_template"]


def test_models_version_health(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 512
    assert client.get("/version").json()["version"]
    assert client.get("/health").status_code == 200
