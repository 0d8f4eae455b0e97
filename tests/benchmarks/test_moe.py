"""benchmarks/moe.py end to end in --smoke mode (tiny shapes): every variant timed at every
token count, the grouped matmul equal to the dense reference."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import moe  # noqa: E402


def test_smoke_run_times_every_variant(tmp_path):
    out = tmp_path / "moe.json"
    moe.main(["--smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["tokens"] for r in result["rows"]] == moe.SMOKE_TOKENS
    for row in result["rows"]:
        assert row["max_rel_err"] < 1e-5
        assert all(row[f"{name}_tok_s"] > 0 for name in ("grouped", "dense_reference", "dense_mlp"))
