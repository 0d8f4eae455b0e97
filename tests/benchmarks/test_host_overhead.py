"""benchmarks/host_overhead.py on small batches: every part of a step is timed, the step
period measured with async scheduling on and off, and the JSON has the figures issue 21 names."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import host_overhead  # noqa: E402


def test_small_batches(tmp_path, capsys):
    out = tmp_path / "host.json"
    result = host_overhead.main(["--batches", "4", "8", "--steps", "3", "--period-batch", "4",
                                 "--period-steps", "3", "--period-model", "tiny", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert set(result["host_us_per_step"]) == set(result["mixed_host_us_per_step"]) == {"4", "8"}
    for row in result["rows"]:
        assert all(row[f"{p}_us"] > 0 for p in host_overhead.PARTS), row
        assert row["host_us"] + row["device_us"] <= row["wall_us"] * 1.01
    for mode in ("async", "sync"):
        assert result[mode]["step_ms"] > 0 and result[mode]["device_ms"] > 0
    assert "8 decode +prefill" in capsys.readouterr().out
