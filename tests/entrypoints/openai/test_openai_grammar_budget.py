"""A grammar crafted to make each next-token mask slow (sixty regexes alive at every position,
each a lexer that grows with the text; as Lark, and as a JSON schema's alternation at every
item of a long array) sent beside ordinary streams: the attack ends with a 400 naming the
grammar's mask limit, the streams get every token, /health answers within a second, the
engine process is the same and every KV block is back in the pool. (The streams' TPOT with
and without the attack: benchmarks/grammar_attack.py.)"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
from health_probe import HealthProbe
from openai_server import API_KEY, tiny_server  # noqa: F401  (a fixture)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PATTERNS = [f"[a-z]*{chr(97 + i % 26)}[a-z]{{{6 + i % 9}}}" for i in range(60)]
ATTACKS = [{"grammar": "start: x+\nx: " + " | ".join(f"/{p}/" for p in PATTERNS)},
           {"json": {"type": "array", "minItems": 64, "items": {"anyOf": [
               {"type": "string", "pattern": f"^{p}$"} for p in PATTERNS]}}}]


def stream_tokens(url: str, prompt: str) -> int:
    """The tokens a greedy stream got, as its last event's usage counts them."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 48, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                usage = json.loads(line[5:]).get("usage") or usage
    return usage["completion_tokens"]


def attack(url: str, grammar: dict) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers=AUTH, timeout=120, json={
        "model": "tiny", "prompt": "Write it.", "max_tokens": 48, "temperature": 1.0, "structured_outputs": grammar})


def test_a_slow_mask_grammar_ends_alone_and_the_streams_go_on(tiny_server):  # noqa: F811
    pid = tiny_server.engine_core_pid
    probe = HealthProbe(tiny_server.url)
    try:
        with probe.window() as health, ThreadPoolExecutor(5) as pool:
            streams = [pool.submit(stream_tokens, tiny_server.url, f"Story {i}:") for i in range(3)]
            attacks = [pool.submit(attack, tiny_server.url, grammar) for grammar in ATTACKS]
            assert [s.result() for s in streams] == [48, 48, 48]
            for r in (a.result() for a in attacks):
                assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text
                assert r.json()["error"]["message"].startswith("structured_outputs: computing the grammar's "), r.text
    finally:
        probe.close()
    assert health.worst < 1.0 and not health.failures, (health.worst, health.failures)
    assert tiny_server.engine_core_pid == pid and tiny_server.proc.poll() is None
    metrics = tiny_server.metrics()
    assert metrics["jaxvllm:kv_cache_free_blocks"] == metrics["jaxvllm:kv_cache_total_blocks"]
