"""benchmarks/embed.py on a tiny random Llama (transformers as the peer): both workloads
embedded by jaxvllm and transformers, a rate for each in the table."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import embed  # noqa: E402


def test_tiny_run_reports_both_workloads(tiny_model_dir, tmp_path, capsys):
    result = embed.main(["--model", str(tiny_model_dir), "--num-texts", "6", "--max-len", "40",
                         "--prefix-len", "8", "--rounds", "1", "--max-model-len", "64", "--max-num-seqs", "4",
                         "--max-num-batched-tokens", "32", "--peers", "transformers",
                         "--export-dir", str(tmp_path / "peer-copy")])
    rates = result["input_tok_s"]
    assert set(rates) == {f"{e}/{w}" for e in ("jaxvllm", "transformers") for w in ("plain", "shared-prefix")}
    assert all(r > 0 for r in rates.values())
    assert "load average before the run" in capsys.readouterr().out
