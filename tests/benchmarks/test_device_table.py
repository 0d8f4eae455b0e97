"""benchmarks/device_table.py: the device check's closing table from its steps' files, with
a step that ran out of time shown as such and its figures as missing."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import device_table  # noqa: E402


def test_table_shows_every_step_and_the_figures_that_exist(tmp_path):
    (tmp_path / "env.txt").write_text("NVIDIA H200, jax 0.11.2")
    (tmp_path / "steps.tsv").write_text("model step\t0\t61\t90\nstart-up\t124\t120\t120\nthroughput\t1\t3\t110\n")
    (tmp_path / "model_step.json").write_text(json.dumps(dict(
        shape="llama3-8b", dtype="bfloat16", copy_gbps=4300.0, matmul_tflops=780.0, matmul_source="xla bfloat16",
        cases=[dict(case="decode 64 x 2048", kind="decode", wall_us=9000.0, busy_pct=97.0, pct_roofline=83.0,
                    mfu_pct=1.0),
               dict(case="prefill 1 x 2048", kind="prefill", wall_us=60000.0, busy_pct=99.0, pct_roofline=5.0,
                    mfu_pct=61.0)])))
    table = device_table.table(tmp_path)
    lines = table.splitlines()
    assert lines[0] == "== device check: NVIDIA H200, jax 0.11.2 =="
    assert "model step" in lines[1] and "ok" in lines[1] and "61 s of 90 s" in lines[1]
    assert "TIMED OUT" in lines[2] and "FAILED (rc=1)" in lines[3]
    assert any("decode 64 x 2048" in l and "83.0% of HBM roofline" in l and "busy  97.0%" in l for l in lines)
    assert any("prefill 1 x 2048" in l and "MFU  61.0%" in l for l in lines)
    assert "start-up to 1st token no figures" in table and "offline throughput    no figures" in table
