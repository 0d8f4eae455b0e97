"""benchmarks/throughput.py --random-weights tiny: the end-to-end device benchmark's path
(random weights drawn and saved as the engine's checkpoint, random token ids, no peers) on a
CPU, and the fastest-matmul reference every MFU divides by."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmarks import machine, throughput  # noqa: E402

TINY_RUN = ["--random-weights", "tiny", "--num-requests", "8", "--input-len", "4", "16", "--output-len", "2", "8",
            "--max-num-seqs", "4", "--max-model-len", "64", "--max-num-batched-tokens", "32"]


def test_random_weights_run_reports_throughput_and_a_possible_mfu(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    result = throughput.main([*TINY_RUN, "--random-weights-dir", str(tmp_path / "model"), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["peers"] == {} and result["model"] == "random tiny"
    assert result["workload"]["num_requests"] == 8
    ours = result["jaxvllm"]
    assert ours["output_tok_s"] > 0 and ours["decode_tok_s"] > 0
    assert ours["compiles_after_warmup"] == 0
    # Against the matmul peak at decode's own shapes: a utilisation, never over 100%.
    assert 0 < ours["decode_mfu"] < 1
    m = result["machine"]
    assert "decode's shapes, batch 4" in m["decode_matmul_source"]
    assert m["matmul_flops"] == max(m["matmul_measured"].values())
    assert "random tiny" in capsys.readouterr().out
    # The model directory is reused by a second run with the same shapes.
    assert (tmp_path / "model" / "random_weights.json").is_file()


def test_peak_matmul_is_the_fastest_measured():
    peak = machine.peak_matmul("float32", 256)
    assert peak["flops"] == peak["measured"][peak["source"]] == max(peak["measured"].values())
    assert "xla float32" in peak["measured"]
    import jax
    from conftest import backend_for

    from jaxvllm.layers.packed_linear import PackedLinearMethod
    if isinstance(backend_for(jax.default_backend()).linear_method, PackedLinearMethod):
        assert "native packed float32" in peak["measured"]  # the engine's own matmul counts


def test_defaults_differ_for_random_weights():
    ns = throughput.parse_args(["--random-weights", "llama3-8b"])
    assert (ns.num_requests, ns.peers, ns.config, ns.max_num_seqs) == (256, "", None, None)
    ns = throughput.parse_args([])
    assert (ns.num_requests, ns.peers, ns.max_num_seqs) == (64, "vllm,transformers", 64)
    assert ns.config.endswith("configs/cpu-dev.yaml")
