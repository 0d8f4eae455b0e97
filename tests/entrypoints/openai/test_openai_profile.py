"""/start_profile and /stop_profile (enabled by --profile-dir) trace the engine process."""
from __future__ import annotations

from pathlib import Path

from openai_server import client, tiny_server  # noqa: F401  (fixtures)


def test_profile_endpoints_write_a_trace_with_step_spans(client, tiny_server):  # noqa: F811
    assert client.post("/stop_profile").status_code == 400  # nothing being captured yet
    started = client.post("/start_profile")
    assert started.status_code == 200 and started.json()["profile_dir"] == tiny_server.profile_dir
    again = client.post("/start_profile")
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3})
    assert r.status_code == 200
    assert client.post("/stop_profile").status_code == 200
    traces = list(Path(tiny_server.profile_dir).rglob("*.xplane.pb"))
    assert traces
    data = traces[-1].read_bytes()
    for span in (b"engine_step", b"schedule", b"model_step", b"sampling"):
        assert span in data, span
