"""benchmarks/kernels.py end to end in --smoke mode (interpret mode, tiny shapes), as
scripts/device_check.sh runs it on a device, and the trace summary it prints."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import kernels  # noqa: E402
from benchmarks.trace_summary import Event, load_events, summarize  # noqa: E402


def test_smoke_run_writes_every_case_and_profiles_the_first(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    kernels.main(["--smoke", "--out", str(out), "--profile", str(tmp_path / "trace")])
    result = json.loads(out.read_text())
    assert [r["case"] for r in result["cases"]] == [c[0] for c in kernels.SMOKE]
    assert all(r["max_abs_err"] < 2e-2 and r["kernel_ms"] > 0 for r in result["cases"])
    printed = capsys.readouterr().out
    assert "profile: decode 4 seqs ctx 40" in printed
    rows = summarize(load_events(tmp_path / "trace"), calls=2)
    assert rows and all(r["us_per_call"] > 0 for r in rows)


def test_summary_keeps_device_timelines_per_call():
    """A GPU trace's layout: /device: planes whose lines hold the kernels; host events are
    left out when a device timeline exists."""
    gpu, stream = "/device:GPU:0", "Stream #13(Compute)"
    events = ([Event(gpu, stream, "ragged_paged_attention_gpu", 30e3)] * 4
              + [Event(gpu, stream, "loop_fusion", 2.5e3)] * 4
              + [Event("/host:CPU", "python", "PjitFunction", 500e3)])
    rows = summarize(events, calls=4)
    assert [(r["name"], r["us_per_call"], r["count"]) for r in rows] == [
        ("ragged_paged_attention_gpu", 30.0, 4), ("loop_fusion", 2.5, 4)]
    assert rows[0]["timeline"] == "/device:GPU:0 / Stream #13(Compute)"
    assert abs(rows[0]["share"] - 30 / 32.5) < 1e-9
