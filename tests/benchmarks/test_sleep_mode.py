"""benchmarks/sleep_mode.py on the tiny model: every figure the sleep-mode issue asks for."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import sleep_mode  # noqa: E402


def test_figures(tiny_model_dir, tmp_path):
    out = tmp_path / "sleep.json"
    r = sleep_mode.main(["--model", str(tiny_model_dir), "--skip-warmup", "--max-num-seqs", "2",
                         "--max-num-batched-tokens", "32", "--max-model-len", "128",
                         "--kv-cache-memory-bytes", str(8 << 20), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))
    assert r["compilations"] == 0
    assert all(r[f"same_outputs_after_{step}"] for step in ("level1", "level2", "update"))
    assert min(r["freed_fraction"].values()) > 0.9
    memory = r["memory_mib"]
    assert abs(memory["awake_after_level1"] - memory["awake"]) < 0.01 * memory["awake"]
