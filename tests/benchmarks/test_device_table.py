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


def test_a_throughput_step_cut_short_after_its_rounds_still_shows_them(tmp_path):
    """throughput.py writes the rounds before its decode measurement (an H200 run of 12-04 ran
    out of its budget there and lost the round's 7,539 tok/s); spec decode rows as written."""
    (tmp_path / "steps.tsv").write_text("throughput\t124\t102\t100\nspec decode\t0\t134\t170\n")
    (tmp_path / "throughput.json").write_text(json.dumps(dict(
        model="random llama3-8b", workload=dict(num_requests=256),
        jaxvllm=dict(output_tok_s=7539.1, requests_s=57.7))))
    (tmp_path / "spec_decode.json").write_text(json.dumps(dict(rows=[dict(
        method="ngram", batch_size=1, off_tok_s=216.5, spec_tok_s=150.4, speedup=0.69, mean_accepted_length=None,
        acceptance_rate=None, identical_tokens=True)])))
    table = device_table.table(tmp_path)
    assert "7539.1 output tok/s, 57.70 req/s; no decode figures (out of time)" in table
    assert ("spec decode ngram     batch 1: 150.4 tok/s against 216.5 (0.69x), accepted length None, "
            "same tokens: True") in table


def test_offload_row_reads_the_kv_offload_figures(tmp_path):
    (tmp_path / "kv_offload.json").write_text(json.dumps(dict(
        prefix_len=32768, ttft_median_s_offload=0.41, ttft_median_s_recompute=3.2, ttft_median_speedup=7.8,
        host_tier_hit_tokens=65536, identical_outputs=True)))
    table = device_table.table(tmp_path)
    assert ("kv offload            32768-token prefix, TTFT reloaded from host 0.410 s against computed 3.200 s "
            "(7.8x), host hits 65536 tokens, same tokens: True") in table
    assert "kv offload            no figures" in device_table.table(tmp_path / "missing")
