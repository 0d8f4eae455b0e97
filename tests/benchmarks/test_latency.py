"""Plumbing of benchmarks/latency.py on a tiny random model: the batch latency figures. Its
cold/warm start-up children (fresh processes sharing one cache directory) are checked where
scripts/device_check.sh --smoke runs them (tests/scripts/test_device_check.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import latency  # noqa: E402

# Few buckets (token 4/8/16, requests 1/2): the engine warms up in seconds.
SMALL = ["--max-num-seqs", "2", "--max-model-len", "64", "--max-num-batched-tokens", "16"]


def test_batch_latency_figures(tiny_model_dir, tmp_path):
    out = tmp_path / "latency.json"
    result = latency.main(["--model", str(tiny_model_dir), *SMALL, "--skip-startup", "--batch-sizes", "1", "2",
                           "--input-len", "12", "--output-len", "5", "--num-iters", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [r["batch_size"] for r in result["latency"]] == [1, 2]
    for r in result["latency"]:
        assert 0 < r["ttft_s"] < r["e2e_s"] and r["tpot_s"] > 0
        assert r["output_tok_s"] == r["batch_size"] * 5 / r["e2e_s"]
    # The engine's warm-up covered every shape the benchmark ran.
    assert result["compiles_after_warmup"] == 0
    assert result["startup"] is None


def test_bad_sizes_are_refused():
    import pytest
    with pytest.raises(ValueError, match="--output-len"):
        latency.parse_args(["--output-len", "0"])
    with pytest.raises(ValueError, match="--batch-sizes"):
        latency.parse_args(["--batch-sizes", "1", "0"])
