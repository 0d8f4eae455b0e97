"""Hostile `response_format` / `structured_outputs` schemas against a running server:
reference chains and cycles to depth 20,000, allOf/anyOf/oneOf/not nesting through
references, huge enums and alternations, pathological regexes, size keywords at their
extremes. Each one gets a 200 whose text satisfies the schema (or stops at max_tokens) or
a 4xx with an OpenAI-shaped body; the server's processes stay the same, /health answers
throughout, and the next plain request is served."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from health_probe import HealthProbe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_server import API_KEY, tiny_server  # noqa: F401  (a fixture)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LEAF = {"type": "integer"}


def through(kind: str, target: dict) -> dict:
    """A subschema that reaches `target` through one keyword."""
    return {"ref": lambda: target, "allOf": lambda: {"allOf": [target]},
            "anyOf": lambda: {"anyOf": [target, {"type": "null"}]},
            "oneOf": lambda: {"oneOf": [target, {"type": "boolean"}]},
            "not": lambda: {"not": {"not": target}},
            "items": lambda: {"type": "array", "items": target, "maxItems": 2},
            "properties": lambda: {"type": "object", "properties": {"a": target},
                                   "required": ["a"], "additionalProperties": False},
            }[kind]()


def ref_graph(depth: int, kind: str, cycle: bool) -> dict:
    defs = {f"d{i}": through(kind, {"$ref": f"#/$defs/d{i + 1}"}) for i in range(depth)}
    defs[f"d{depth}"] = {"$ref": "#/$defs/d0"} if cycle else LEAF
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def nested(depth: int, kind: str) -> dict:
    schema = LEAF
    for _ in range(depth):
        schema = through(kind, schema)
    return schema


KINDS = st.sampled_from(["ref", "allOf", "anyOf", "oneOf", "not", "items", "properties"])
DEPTHS = st.one_of(st.integers(1, 200), st.sampled_from([500, 2_000, 5_000, 20_000]))
PATHOLOGICAL = ["^(a|a)*(b|b)*(((a*)*)*)*c{1000}{1000}$", "^(a+)+$", "^((a*)*)*b$", "^(.*a){30}$",
                "^[ab]*a[ab]{40}$", "^(x{100}){100}$", "^(a|aa)*c{5000}$", "(" * 300 + "a" + ")" * 300,
                "^\\d{2,}$", "^[^\\x00-\\x7f]{1,3}$"]
EXTREMES = [0, 1, 7, 10**6, 2**31, 2**63, 10**30]
SCHEMAS = st.one_of(
    st.builds(ref_graph, DEPTHS, KINDS, st.booleans()),
    st.builds(nested, st.integers(1, 400), KINDS),
    st.integers(1, 60_000).map(lambda n: {"enum": [f"v{i}" for i in range(n)]}),
    st.integers(1, 30_000).map(lambda n: {"type": "string", "pattern": "^(" + "|".join(
        f"w{i}" for i in range(n)) + ")$"}),
    st.sampled_from(PATHOLOGICAL).map(lambda p: {"type": "string", "pattern": p}),
    st.builds(lambda kw, v, lo: {"type": "array", "items": LEAF, kw: v} | (
        {"minItems": lo} if kw == "maxItems" else {}), st.sampled_from(["minItems", "maxItems"]),
        st.sampled_from(EXTREMES), st.sampled_from([0, 3])),
    st.builds(lambda kw, v: {"type": "string", kw: v}, st.sampled_from(["minLength", "maxLength"]),
              st.sampled_from(EXTREMES)),
)


def satisfies(schema: dict, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.fixture(scope="module")
def pids(tiny_server):
    return tiny_server.proc.pid, tiny_server.engine_core_pid


@pytest.fixture(scope="module")
def probe(tiny_server):
    probe = HealthProbe(tiny_server.url)
    yield probe
    probe.close()


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(schema=SCHEMAS, via=st.sampled_from(["response_format", "structured_outputs"]))
def test_any_schema_gets_a_valid_answer_or_a_4xx(tiny_server, pids, probe, schema, via):
    body = {"model": "tiny", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Answer in JSON."}]}
    if via == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    else:
        body["structured_outputs"] = {"json": schema}
    with probe.window() as health:
        r = httpx.post(tiny_server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length"), choice
        if choice["finish_reason"] == "stop":
            assert satisfies(schema, choice["message"]["content"]), choice
    else:
        assert 400 <= r.status_code < 500, r.text
        error = r.json()["error"]
        assert error["code"] == r.status_code and error["message"] and "Traceback" not in error["message"]
    assert not health.failures, health.failures
    assert (tiny_server.proc.pid, tiny_server.engine_core_pid) == pids
    assert tiny_server.proc.poll() is None
    ok = httpx.post(tiny_server.url + "/v1/completions", headers=AUTH, timeout=60,
                    json={"model": "tiny", "prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text


@pytest.mark.parametrize("via", ["response_format", "structured_outputs"])
def test_the_5000_deep_ref_chain_is_a_400(tiny_server, pids, via):
    schema = ref_graph(5000, "ref", cycle=False)
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    body |= ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
             if via == "response_format" else {"structured_outputs": {"json": schema}})
    r = httpx.post(tiny_server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text
    assert "deeper than 128 levels" in r.json()["error"]["message"]
    assert (tiny_server.proc.pid, tiny_server.engine_core_pid) == pids
    assert httpx.get(tiny_server.url + "/health", timeout=5).status_code == 200


def test_a_grammar_that_crashes_the_compiler_is_a_400(tiny_server, pids):
    """A 5,000-rule Lark chain is past no schema limit: its compiler crashes, in the front
    end's checking process, and the request gets its 400."""
    lark = "start: a0\n" + "".join(f"a{i}: a{i + 1}\n" for i in range(5000)) + 'a5000: "7"\n'
    r = httpx.post(tiny_server.url + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "tiny", "prompt": "hi", "max_tokens": 4, "structured_outputs": {"grammar": lark}})
    assert r.status_code == 400 and "crashed its compiler" in r.json()["error"]["message"], r.text
    assert (tiny_server.proc.pid, tiny_server.engine_core_pid) == pids
    ok = httpx.post(tiny_server.url + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "tiny", "prompt": "hi", "max_tokens": 4, "structured_outputs": {"regex": "[0-9]{4}"}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"].isdigit(), ok.text
