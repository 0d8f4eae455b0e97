"""Plumbing of benchmarks/latency.py on a tiny random model: the batch latency figures and
the cold/warm start-up children (fresh processes sharing one cache directory)."""
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


def test_cold_and_warm_startup_children(tiny_model_dir, tmp_path):
    args = latency.parse_args(["--model", str(tiny_model_dir), *SMALL, "--batch-sizes", "1"])
    cache = tmp_path / "caches"
    cache.mkdir()
    startup = latency.measure_startup(args, str(cache))
    assert any((cache / "xla").iterdir()), "the cold child wrote no compiled programs to JAXVLLM_XLA_CACHE"
    assert startup.cold_s > 0 and startup.warm_s > 0
    assert startup.speedup == startup.cold_s / startup.warm_s
    # The cold child compiled every bucket; the warm one loaded them all from disk.
    assert startup.cold_child["num_compilations"] > 0 == startup.warm_child["num_compilations"]
    assert any((cache / "xla" / "executables").iterdir())
    assert startup.cold_child["llm_init_s"] < startup.cold_s


def test_bad_sizes_are_refused():
    import pytest
    with pytest.raises(ValueError, match="--output-len"):
        latency.parse_args(["--output-len", "0"])
    with pytest.raises(ValueError, match="--batch-sizes"):
        latency.parse_args(["--batch-sizes", "1", "0"])
