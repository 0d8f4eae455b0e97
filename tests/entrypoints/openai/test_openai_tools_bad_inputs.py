"""Malformed tools and tool choices get a 400 naming the field (and the engine serves the next
request); "auto" without the server's flags is a 400 naming them; unknown request fields are
logged once per name. Against the shared tiny server, which has no tool flags."""
from __future__ import annotations

import json

import pytest
from openai_server import client, tiny_server  # noqa: F401  (fixtures)

FN = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def tool(**function):
    return {"type": "function", "function": function}


CASES = [
    ("no name", [tool(parameters=FN["parameters"])], "required", "tools[0].function.name"),
    ("empty name", [tool(name="", parameters={})], "required", "tools[0].function.name"),
    ("parameters not an object", [tool(name="f", parameters=[1, 2])], "required",
     "tools[0].function.parameters"),
    ("parameters of type string", [tool(name="f", parameters={"type": "string"})], "required",
     "tools[0].function.parameters"),
    ("1,000 tools", [tool(name=f"f{i}", parameters={}) for i in range(1000)], "required", "tools"),
    ("a schema llguidance rejects", [tool(name="f", parameters={
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}})], "none",
     "tools[0].function.parameters"),
    ("an unsatisfiable schema", [tool(name="f", parameters={
        "type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 5,
                                                                 "maximum": 1}}})], "required",
     "tools[0].function.parameters"),
    ("the same name twice", [tool(**FN), tool(**FN)], "required", "tools[1].function.name"),
    ("strict with an open object", [tool(name="f", strict=True, parameters={
        **FN["parameters"], "additionalProperties": True})], "none", "tools[0].function.parameters"),
    ("a named function not in tools", [tool(**FN)], {"type": "function", "function": {"name": "g"}},
     "tool_choice.function.name"),
    ("tool_choice of an unknown kind", [tool(**FN)], "sometimes", "tool_choice"),
    ("tool_choice without tools", None, "required", "tool_choice"),
]


@pytest.mark.parametrize("tools,choice,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_tools_are_a_400_naming_the_field(client, tools, choice, param):  # noqa: F811
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
        "tools": tools, "tool_choice": choice})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    ok = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200, ok.text


OPEN = {"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"^x": {}}}}}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"tools": [tool(name="f", parameters=OPEN, strict=True)], "tool_choice": "none"},
     "tools[0].function.parameters"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": OPEN, "strict": True}}}, "response_format.json_schema.schema"),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "parameters": OPEN, "strict": True}],
                       "tool_choice": "none"},
     "tools[0].parameters"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": OPEN, "strict": True}}},
     "text.format.schema"),
], ids=["chat tool", "response_format", "responses tool", "responses text.format"])
def test_what_strict_mode_cannot_express_is_a_400_naming_the_keyword(client, path, body, param):  # noqa: F811
    """As OpenAI answers it; without `strict` the same schema is served."""
    base = ({"input": "hi", "max_output_tokens": 2} if path == "/v1/responses" else
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    r = client.post(path, json={"model": "tiny", **base, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "strict mode does not support 'patternProperties' (at properties.a)" in \
        error["message"], error
    loose = json.loads(json.dumps(body).replace('"strict": true', '"strict": false'))
    assert client.post(path, json={"model": "tiny", **base, **loose}).status_code == 200


def test_auto_without_the_flags_is_a_400_naming_them(client):  # noqa: F811
    for choice in ("auto", None):  # tools without tool_choice means "auto", as in OpenAI's API
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool(**FN)], **({"tool_choice": choice} if choice else {})})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
        assert "--tool-call-parser" in r.json()["error"]["message"]


def test_required_works_on_a_random_model_and_tool_messages_render(client):  # noqa: F811
    r = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 40, "temperature": 1.0, "seed": 3, "tools": [tool(**FN)],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                           "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "done"}]})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "f"


def test_unknown_fields_are_logged_once_per_name(client, tiny_server):  # noqa: F811
    for _ in range(3):
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1,
                                                 "frobnicate_level": 3})
        assert r.status_code == 200
    assert tiny_server.log_text().count("'frobnicate_level'") == 1
