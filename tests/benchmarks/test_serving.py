"""Plumbing of benchmarks/serving.py against a real `jaxvllm serve` of a tiny random model
(the server fixture of the OpenAI tests): streamed completions, Poisson arrivals, token
counts from the server's usage, and failures reported rather than raised."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "entrypoints" / "openai"))
from openai_server import API_KEY, tiny_server  # noqa: E402,F401  (fixture)

from benchmarks import serving  # noqa: E402

SIZES = ["--input-len", "8", "40", "--output-len", "3", "12", "--seed", "3"]


@pytest.mark.parametrize("prompt_format,rate", [("ids", "20"), ("text", "inf")])
def test_streams_every_request(tiny_server, tmp_path, prompt_format, rate):
    out = tmp_path / "serving.json"
    result = serving.main(["--base-url", tiny_server.url, "--api-key", API_KEY, "--num-prompts", "6",
                           "--request-rate", rate, "--prompt-format", prompt_format, *SIZES,
                           "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["model"] == "tiny"  # resolved from /v1/models
    assert (result["completed"], result["failed"]) == (6, 0), result["errors"]
    # ignore_eos reached the server: every request ran to its workload length.
    assert result["output_tokens"] == result["workload"]["num_output_tokens"]
    if prompt_format == "ids":
        assert result["input_tokens"] == result["workload"]["num_input_tokens"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        row = result[name]
        assert 0 < row["p50"] <= row["p90"] <= row["p99"]
    for r in result["requests"]:
        assert len(r["itl"]) <= r["output_tokens"] - 1 and r["latency"] >= r["ttft"] > 0


def test_failures_are_counted_not_raised(tiny_server):
    result = serving.main(["--base-url", tiny_server.url, "--api-key", "wrong-key", "--model", "tiny",
                           "--num-prompts", "3", *SIZES])
    assert (result["completed"], result["failed"]) == (0, 3)
    assert result["errors"][0].startswith("HTTP 401")
    assert result["output_tokens"] == 0 and result["ttft_ms"]["p50"] is None


def test_poisson_arrivals_are_seeded():
    delays = serving.arrival_delays(2000, rate=4.0, seed=1)
    assert delays == serving.arrival_delays(2000, rate=4.0, seed=1)
    assert delays[0] == 0.0 and delays == sorted(delays)
    assert math.isclose(delays[-1] / (len(delays) - 1), 0.25, rel_tol=0.1)  # mean gap 1/rate
    assert serving.arrival_delays(3, math.inf, 0) == [0.0, 0.0, 0.0]


def test_bad_flags_are_refused():
    with pytest.raises(ValueError, match="--request-rate"):
        serving.parse_args(["--request-rate", "0"])
    with pytest.raises(ValueError, match="--input-len"):
        serving.parse_args(["--input-len", "9", "3"])
