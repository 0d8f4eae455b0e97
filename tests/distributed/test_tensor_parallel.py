"""Tensor parallelism on 8 simulated CPU devices: greedy tokens at TP=2 and TP=4 equal
TP=1's, and every weight and the KV cache really live split across the devices.

The engines run in a subprocess (tp_check.py): the device count is fixed when jax is
imported, and the rest of the suite runs on one device.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.distributed.partition import fit_spec, padded_heads

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run_tp_jobs(jobs: list[tuple[str, str, list[list[int]], int, str]]) -> list[dict]:
    """tp_check.main(model, tps, prompts, max_tokens, backend) for each job, in one subprocess
    (one start of 8 devices); the results in job order."""
    calls = [(model, tps, json.dumps(prompts), str(n), backend) for model, tps, prompts, n, backend in jobs]
    script = (f"import sys; sys.path.insert(0, {HERE!r}); import tp_check\n"
              f"for call in {calls!r}:\n    tp_check.main(*call)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def expected_shards(spec: list, shape: list[int], tp: int) -> list[int]:
    """The per-device shape the family's weight spec promises: split dims divided by TP."""
    return [n // tp if axis is not None and n % tp == 0 else n for axis, n in zip(spec, shape)]


def test_padded_heads():
    assert padded_heads(9, 3, 1) == (9, 3)
    assert padded_heads(9, 3, 2) == (12, 4)   # the default model: 3 KV heads -> 4, groups of 3 kept
    assert padded_heads(9, 3, 4) == (12, 4)
    assert padded_heads(9, 3, 8) == (24, 8)
    assert padded_heads(32, 8, 8) == (32, 8)  # divisible: untouched
    with pytest.raises(ValueError, match="num_key_value_heads"):
        padded_heads(10, 4, 2)


def test_fit_spec_replicates_what_does_not_divide():
    mesh = jax.sharding.AbstractMesh((4,), ("model",))
    assert fit_spec(("model", None), (32000, 8), mesh) == P("model", None)
    assert fit_spec(("model", None), (32001, 8), mesh) == P(None, None)
    with pytest.raises(ValueError, match="tensor_parallel_size must be between 1 and"):
        make_mesh(len(jax.devices()) + 1)


TINY_PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41]]


@pytest.fixture(scope="module")
def tiny_runs(tiny_model_dir, tmp_path_factory) -> dict:
    """Every tiny-model run of this module in one subprocess: TP=1, 2, 4 and TP=2 with
    speculative decoding, suffix and a draft model ("auto"), TP=4 with
    each Pallas kernel, and TP=2, 4 from an Orbax checkpoint converted on one device."""
    from jaxvllm.entrypoints.cli import main
    ckpt = tmp_path_factory.mktemp("orbax") / "ckpt"
    assert main(["convert", str(tiny_model_dir), str(ckpt)]) == 0
    model = str(tiny_model_dir)
    jobs = {"auto": (model, "1,2,4,spec2,draft2", TINY_PROMPTS, 8, "auto"),
            "pallas-tpu": (model, "4", TINY_PROMPTS, 8, "pallas-tpu"),
            "pallas-gpu": (model, "4", TINY_PROMPTS, 8, "pallas-gpu"),
            "orbax": (str(ckpt), "2,4", TINY_PROMPTS, 8, "auto")}
    return dict(zip(jobs, run_tp_jobs(list(jobs.values()))))


@pytest.fixture(scope="module")
def tiny_tp(tiny_runs) -> dict:
    return tiny_runs["auto"]


def test_tiny_model_tp2_tp4_match_tp1_and_are_sharded(tiny_tp):
    r = tiny_tp
    assert r["2"]["tokens"] == r["1"]["tokens"]
    assert r["4"]["tokens"] == r["1"]["tokens"]
    assert r["spec2"]["ignore_eos"] == r["1"]["ignore_eos"] and r["spec2"]["draft_tokens"] > 0
    # The model drafting for itself on the same 2 devices: every draft accepted.
    assert r["draft2"]["ignore_eos"] == r["1"]["ignore_eos"]
    assert r["draft2"]["accepted_tokens"] == r["draft2"]["draft_tokens"] > 0
    for tp in ("2", "4"):
        for (tokens, cum), (ref_tokens, ref_cum) in zip(r[tp]["extended"], r["1"]["extended"]):
            assert tokens == ref_tokens and abs(cum - ref_cum) < 1e-4
    # TP=4 pads the tiny model's 2 KV heads (4 query heads) to 4 (8): 16-wide heads.
    w4 = r["4"]["weights"]
    # q/k/v fused: [hidden, KV heads, group of 2 query heads + K + V, head_dim].
    shapes = {name: {k: w[k] for k in ("shape", "shards")} for name, w in w4.items()}
    assert shapes["layers.1.qkv_proj"] == {"shape": [64, 4, 4, 16], "shards": [[64, 1, 4, 16]] * 4}
    assert shapes["layers.1.o_proj"] == {"shape": [128, 64], "shards": [[32, 64]] * 4}
    assert shapes["embed_tokens"] == {"shape": [256, 64], "shards": [[64, 64]] * 4}
    assert r["4"]["kv_cache"]["shards"] == [[2, 2, 64, 16, 1, 16]] * 4
    assert r["2"]["kv_cache"]["shards"] == [[2, 2, 64, 16, 1, 16]] * 2
    for tp in (2, 4):
        for name, w in r[str(tp)]["weights"].items():
            assert w["shards"] == [expected_shards(w["partition"], w["shape"], tp)] * tp, name


@pytest.mark.slow
def test_default_model_tp2_tp4_match_tp1():
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    tok = load_tokenizer(default_model_path())
    prompts = [tok.encode(p) for p in ["The capital of France is", "def fibonacci(n):",
                                       "The three primary colors are"]]
    r, = run_tp_jobs([("default", "1,2,4", prompts, 16, "auto")])
    print({tp: v["tokens"] for tp, v in r.items()})
    assert r["2"]["tokens"] == r["1"]["tokens"]
    assert r["4"]["tokens"] == r["1"]["tokens"]
    # 9 query / 3 KV heads of 64 are padded to 12 / 4 so that both split evenly.
    assert r["1"]["kv_cache"]["shards"] == [[30, 2, 64, 16, 3, 64]]
    assert r["2"]["kv_cache"]["shards"] == [[30, 2, 64, 16, 2, 64]] * 2
    assert r["4"]["kv_cache"]["shards"] == [[30, 2, 64, 16, 1, 64]] * 4
    assert r["4"]["weights"]["layers.29.qkv_proj"]["shards"] == [[576, 1, 5, 64]] * 4
    assert r["4"]["weights"]["layers.29.down_proj"]["shards"] == [[384, 576]] * 4
    assert r["4"]["weights"]["embed_tokens"]["shards"] == [[12288, 576]] * 4


@pytest.mark.parametrize("backend", ["pallas-tpu", "pallas-gpu"])
def test_pallas_kernels_run_per_shard(tiny_runs, tiny_tp, backend):
    """The Mosaic TPU and Triton GPU kernels (interpret mode here) under shard_map at TP=4:
    each device's kernel sees its own query heads and KV heads."""
    assert tiny_runs[backend]["4"]["tokens"] == tiny_tp["1"]["tokens"]


def test_orbax_checkpoint_restores_into_tp_shards(tiny_runs, tiny_tp):
    """Converted on one device, restored at TP=2 and TP=4 (heads padded on device)."""
    r = tiny_runs["orbax"]
    for tp in ("2", "4"):
        assert r[tp]["tokens"] == tiny_tp["1"]["tokens"]
        assert r[tp]["weights"] == tiny_tp[tp]["weights"]
        assert r[tp]["kv_cache"] == tiny_tp[tp]["kv_cache"]
