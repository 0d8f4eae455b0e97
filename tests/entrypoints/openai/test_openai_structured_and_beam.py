"""response_format / structured_outputs (and vLLM's legacy guided_* fields, which must fail
closed) and use_beam_search through the HTTP API."""
from __future__ import annotations

import json

import pytest
from openai_server import client, tiny_server  # noqa: F401  (fixtures)

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False,
          # A random-weight model would fill max_tokens with the whitespace JSON allows.
          "x-guidance": {"whitespace_flexible": False}}


def test_response_format_json_schema_is_obeyed(client):  # noqa: F811
    for seed in range(3):
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "A color?"}], "seed": seed,
            "max_tokens": 48, "temperature": 1.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}})
        assert r.status_code == 200, r.text
        value = json.loads(r.json()["choices"][0]["message"]["content"])
        assert value["color"] in ("red", "green", "blue") and isinstance(value["ok"], bool)
        assert set(value) == {"color", "ok"}


def test_structured_outputs_choice_on_completions(client):  # noqa: F811
    r = client.post("/v1/completions", json={
        "model": "tiny", "prompt": "Pick:", "max_tokens": 8, "temperature": 1.0, "seed": 1,
        "structured_outputs": {"choice": ["yes", "no"]}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")


def test_legacy_guided_fields_constrain_as_structured_outputs(client, tiny_server):  # noqa: F811
    choices = ["yes", "no", "maybe"]
    for seed in range(2):  # the completions and chat forms, each a reply from the choices
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Pick:", "max_tokens": 8,
                                                 "temperature": 1.0, "seed": seed,
                                                 "guided_choice": choices})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] in choices
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Pick"}], "max_tokens": 8,
            "temperature": 1.0, "seed": seed, "guided_choice": choices,
            "guided_decoding_backend": "xgrammar"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] in choices
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Digits:", "max_tokens": 6,
                                             "temperature": 1.0, "guided_regex": "[0-9]{3}"})
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 3
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "JSON"}], "max_tokens": 48,
        "temperature": 1.0, "guided_json": SCHEMA})
    assert set(json.loads(r.json()["choices"][0]["message"]["content"])) == {"color", "ok"}
    log = tiny_server.log_text()
    assert log.count("guided_choice is deprecated") == 1  # once per field name, not per request
    assert "maps it onto structured_outputs.choice" in log


@pytest.mark.parametrize("body,param", [
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
    ({"guided_choice": []}, "structured_outputs"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_grammar": "start: ("}, "structured_outputs"),
])
def test_legacy_guided_fields_bad_input_is_a_400(client, body, param):  # noqa: F811
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError", error


def test_bad_response_format_is_a_400(client):  # noqa: F811
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("response_format")
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                             "response_format": {"type": "yaml"}})
    assert r.status_code == 400 and "response_format.type" in r.json()["error"]["message"]


def test_use_beam_search_returns_n_best_beams(client):  # noqa: F811
    r = client.post("/v1/completions", json={
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "n": 3,
        "use_beam_search": True, "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    texts = [c["text"] for c in body["choices"]]
    assert len(texts) == 3 and len(set(texts)) == 3
    assert body["usage"]["completion_tokens"] == 12
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "use_beam_search": True,
                                             "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
