"""benchmarks/kernels.py end to end in --smoke mode (interpret mode, tiny shapes), as
scripts/device_check.sh runs it on a device, and the trace summary it prints."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import kernels  # noqa: E402
from benchmarks.trace_summary import load_events, summarize  # noqa: E402


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


def test_summary_reads_device_timelines_per_call(tmp_path):
    """A GPU trace's layout: a /device: process whose stream thread holds the kernels;
    host events are left out when a device timeline exists."""
    meta = [dict(ph="M", name="process_name", pid=1, args=dict(name="/device:GPU:0")),
            dict(ph="M", name="thread_name", pid=1, tid=7, args=dict(name="Stream #13(Compute)")),
            dict(ph="M", name="process_name", pid=2, args=dict(name="/host:CPU"))]
    kernel = [dict(ph="X", pid=1, tid=7, name="ragged_paged_attention_gpu", ts=10 * i, dur=30.0) for i in range(4)]
    small = [dict(ph="X", pid=1, tid=7, name="loop_fusion", ts=10 * i + 5, dur=2.5) for i in range(4)]
    host = [dict(ph="X", pid=2, tid=1, name="PjitFunction", ts=0, dur=500.0)]
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    with gzip.open(run / "perfetto_trace.json.gz", "wt") as f:
        json.dump(dict(traceEvents=meta + kernel + small + host), f)
    rows = summarize(load_events(tmp_path), calls=4)
    assert [(r["name"], r["us_per_call"], r["count"]) for r in rows] == [
        ("ragged_paged_attention_gpu", 30.0, 4), ("loop_fusion", 2.5, 4)]
    assert rows[0]["timeline"] == "/device:GPU:0 / Stream #13(Compute)"
    assert abs(rows[0]["share"] - 30 / 32.5) < 1e-9
