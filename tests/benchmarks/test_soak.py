"""benchmarks/soak.py end to end at a small size: it starts its own `jaxvllm serve` of a
tiny random model, runs the mixed workload twice with a third of the streams dropped, and
exits 0 with no 5xx and every KV block free again (about 30 s on 2 CPU cores)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import soak  # noqa: E402


def test_small_soak_is_clean(tmp_path):
    out = tmp_path / "soak.json"
    # 24 requests are too few for a steady RSS (a batch shape first seen in run 2 compiles
    # there): the 5% limit is for the full soak; here it only has to be measured.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--num-requests", "24",
                           "--runs", "2", "--max-rss-growth", "25", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())
    assert result["passed"] and all(v is not False for v in result["checks"].values())
    assert result["checks"]["no_process_left"] is True and result["checks"]["rss_growth"] is True
    assert len(result["runs"]) == 2
    for run in result["runs"]:
        assert run["requests"] == 24 and not any(s.startswith("5") for s in run["statuses"])
        assert run["statuses"] == {"200": 24}
        m = run["metrics"]
        assert m["kv_cache_free_blocks"] == m["kv_cache_total_blocks"] > 0
        assert m["kv_cache_usage_perc"] == 0 and m["num_requests_running"] == 0
        assert run["dropped"] == run["drops_planned"] > 0 and run["aborted"] == run["dropped"]
        endpoints = {(r["endpoint"], r["stream"]) for r in run["requests_detail"]}
        assert endpoints == {("completions", False), ("completions", True), ("chat", False), ("chat", True)}
        assert all(v is not None and v > 0 for v in run["rss_kb"].values())
    assert all(len(g) == 1 for g in result["rss_growth_pct"].values())
    assert "PASSED" in proc.stdout


def test_workload_is_seeded_and_drops_a_third_of_the_streams():
    args = soak.parse_args(["--num-requests", "300"])
    specs = soak.make_specs(300, "m", args)
    assert [s.body for s in specs] == [s.body for s in soak.make_specs(300, "m", args)]
    streams = [s for s in specs if s.stream]
    assert len([s for s in streams if s.drop]) == round(len(streams) / 3)
    assert not any(s.drop for s in specs if not s.stream)
    assert {s.endpoint for s in specs} == {"chat", "completions"}
    assert all(s.body["max_tokens"] == args.drop_output_len for s in specs if s.drop)


def test_bad_flags_are_refused():
    with pytest.raises(ValueError, match="loopback"):
        soak.parse_args(["--base-url", "http://10.0.0.1:8000"])
    with pytest.raises(ValueError, match="--num-requests"):
        soak.parse_args(["--num-requests", "0"])
    with pytest.raises(ValueError, match="--drop-fraction"):
        soak.parse_args(["--drop-fraction", "1.5"])
