"""benchmarks/model_step.py --smoke: the engine's forward (tiny model with random weights,
the attention `auto` picks here) for decode and prefill cases, timed and traced, each case
against the limits measured in the same run, as scripts/device_check.sh runs it on a device."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import model_step  # noqa: E402
from benchmarks.model_shapes import LLAMA3_8B  # noqa: E402
from benchmarks.trace_summary import Event, timeline_busy_union  # noqa: E402


def test_smoke_cases_report_roofline_mfu_and_device_busy_time(tmp_path, capsys):
    out = tmp_path / "model_step.json"
    result = model_step.main(["--smoke", "--profile", str(tmp_path / "trace"), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [r["case"] for r in result["cases"]] == ["decode 4 x 40", "decode 8 x 24", "prefill 1 x 32"]
    for r in result["cases"]:
        assert r["wall_us"] > 0 and r["busy_us"] > 0 and r["roofline_us"] > 0
        assert 0 < r["mfu_pct"] < 100  # against the fastest matmul measured
    printed = capsys.readouterr().out
    assert re.search(r"model step: tiny, 2 layers", printed)
    assert "HBM roofline" in printed and "MFU" in printed and "us/call" in printed
    assert "model step table:" in printed


def test_cases_parse_and_8b_decode_costs():
    assert model_step.parse_cases(model_step.CASES) == [("decode", 64, 2048), ("decode", 256, 1024),
                                                        ("prefill", 1, 2048)]
    cost = model_step.step_cost(LLAMA3_8B, "decode", 64, 2048, 2)
    # ~7.5B multiplied parameters in bf16 (the embedding table is gathered, not read whole).
    assert 14.9e9 < cost["weight_bytes"] < 15.1e9
    assert cost["kv_bytes"] == 64 * 2048 * 2 * 8 * 128 * 32 * 2
    prefill = model_step.step_cost(LLAMA3_8B, "prefill", 1, 2048, 2)
    assert 2048 * 2 * 6.98e9 < prefill["flops"] < 2048 * 2 * 7.6e9


def test_busy_time_is_the_union_of_a_timelines_events():
    """Nested events (a CPU thread's thunks inside their executor) count once; a program's
    whole span (XLA Modules) is not busy time."""
    line, plane = "Stream #13(Compute)", "/device:GPU:0"
    events = [Event(plane, line, "executor", 100e3, 0), Event(plane, line, "thunk", 40e3, 10e3),
              Event(plane, line, "kernel", 50e3, 150e3), Event(plane, "XLA Modules", "jit_step", 400e3, 0)]
    assert timeline_busy_union(events, calls=2) == {f"{plane} / {line}": 75.0}
