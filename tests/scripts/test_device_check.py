"""scripts/device_check.sh: every step under its budget, a step that runs out of time
reported in the closing table while the others still run, and (slow) the whole check with
tiny shapes on this CPU, as `--smoke` runs it, with its start-up step's cold and warm children."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
STEPS = ["env", "kernel tests", "model step", "kernels", "weights", "start-up", "throughput", "spec decode", "offload"]


def run_check(tmp_path, *args, **budgets):
    env = dict(os.environ, PYTHON=sys.executable, SCRATCH=str(tmp_path / "scratch"),
               **{f"B_{k.upper()}": str(v) for k, v in budgets.items()})
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=1500)


def test_steps_out_of_time_are_reported_and_the_rest_still_run(tmp_path):
    out = tmp_path / "out"
    proc = run_check(tmp_path, "--smoke", str(out), env=120, tests=1, model=1, kernels=1, weights=1,
                     startup=1, throughput=1, spec=1, offload=1)
    assert proc.returncode != 0
    table = proc.stdout[proc.stdout.index("== device check: "):]
    for step in STEPS[1:]:
        assert any(line.strip().startswith(step) and "TIMED OUT" in line for line in table.splitlines()), table
    assert "model step            no figures" in table
    assert (out / "table.txt").read_text().strip() == table.strip()
    with tarfile.open(out / "logs.tgz") as tar:
        assert "steps.tsv" in [Path(n).name for n in tar.getnames()]


@pytest.mark.slow
def test_smoke_runs_every_step_on_a_cpu(tmp_path):
    out = tmp_path / "out"
    proc = run_check(tmp_path, "--smoke", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    table = proc.stdout[proc.stdout.index("== device check: "):].splitlines()
    for step in STEPS:
        assert any(line.strip().startswith(step) and " ok " in line for line in table), table
    text = "\n".join(table)
    assert "% of HBM roofline" in text and "MFU" in text and "output tok/s" in text and "cold" in text
    assert "same tokens: True" in text
    offload = json.loads((out / "kv_offload.json").read_text())
    assert "kv offload            40-token prefix" in text and offload["host_tier_hit_tokens"] > 0
    assert offload["identical_outputs"] and offload["prefill_tokens_offload"] < offload["prefill_tokens_recompute"]
    assert sorted(p.name for p in out.iterdir()) == ["kernels.json", "kv_offload.json", "logs.tgz", "model_step.json",
                                                     "spec_decode.json", "startup.json", "table.txt", "throughput.json"]
    # The start-up step's children (benchmarks/latency.py; tests/benchmarks/test_latency.py leaves
    # them to this test): the cold one compiled every bucket, the warm one loaded them all from disk.
    startup = json.loads((out / "startup.json").read_text())["startup"]
    assert startup["cold_child"]["num_compilations"] > 0 == startup["warm_child"]["num_compilations"]
    assert startup["cold_s"] > 0 and startup["warm_s"] > 0
    assert startup["speedup"] == startup["cold_s"] / startup["warm_s"]
    assert startup["cold_child"]["llm_init_s"] < startup["cold_s"]
    assert any((tmp_path / "scratch" / "caches" / "xla" / "executables").iterdir())
