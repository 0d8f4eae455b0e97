"""Expert parallelism on 8 simulated CPU devices (in a subprocess, ep_check.py): greedy tokens
at EP=2 and EP=4 (and at TP=2, experts split on their features, in each of two pipeline
stages) equal TP=1's for Mixtral and Qwen3-MoE, each device holding whole experts; experts
that do not divide are refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import write_tiny_moe
from jax.sharding import AbstractMesh

from jaxvllm import LLM
from jaxvllm.distributed.partition import param_sharding
from jaxvllm.layers.fused_moe import DOWN_AXES
from jaxvllm.models.weight_spec import EXPERTS, Weight

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = [[5, 6, 7, 8], list(range(9, 29))]  # the second is prefilled in two chunks


def run_ep(models: list[str], configs: str, prompts: list[list[int]], max_tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "ep_check.py"), ",".join(models), configs,
                           json.dumps(prompts),
                           str(max_tokens)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ep2_ep4_and_tp2_match_tp1(tmp_path):
    """Both families in one subprocess (one start of 8 devices)."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(default_model_path())
    cfgs = {}
    for arch in ("Mixtral", "Qwen3Moe"):
        cfgs[str(tmp_path / arch)] = write_tiny_moe(tmp_path / arch, arch)
        tokenizer.save_pretrained(tmp_path / arch)
    results = run_ep(list(cfgs), "1,pp2x2,2ep,4ep", PROMPTS, 6)
    for path, r in results.items():
        for config in ("pp2x2", "2ep", "4ep"):
            assert r[config]["tokens"] == r["1"]["tokens"], (path, config)
        E, H = 8, cfgs[path].hidden_size
        I = getattr(cfgs[path], "moe_intermediate_size", None) or cfgs[path].intermediate_size
        assert r["pp2x2"]["experts"]["experts_down"] == [[E, I // 2, H]] * 2  # each expert's features split
        for ep in (2, 4):
            assert r[f"{ep}ep"]["experts"] == {"experts_gate_up": [[E // ep, H, 2, I]] * ep,
                                               "experts_down": [[E // ep, I, H]] * ep}
            # Tokens are replicated between layers: all-reduces (attention's output projection,
            # the experts' sum, the vocabulary-parallel embedding), no all-to-all.
            assert set(r[f"{ep}ep"]["collectives"]) == {"all-reduce"}


def test_experts_that_do_not_divide_are_refused(tiny_model_dir):
    mesh = AbstractMesh((4,), ("model",))
    with pytest.raises(ValueError, match=r"6 experts do not divide over tensor_parallel_size=4"):
        param_sharding(Weight("layers.0.experts_down", (6, 48, 64), DOWN_AXES, kind=EXPERTS), (6, 48, 64), mesh,
                       expert_parallel=True)
    with pytest.raises(ValueError, match="enable_expert_parallel: .* has no experts"):
        LLM(str(tiny_model_dir), enable_expert_parallel=True, skip_warmup=True, num_gpu_blocks_override=16)
