"""Pipeline parallelism on 4 simulated CPU devices: PP=2 and PP=2 x TP=2 give the greedy
tokens of one device, with two batches in flight (the batch queue), through preemptions and
aborts that leave the KV pool whole; each stage's KV cache holds only its layers, and only
the first stage embeds and only the last normalizes and samples. The engines run in a
subprocess (pp_check.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import write_tiny_llama

from jaxvllm.distributed.pipeline import stage_layer_ranges

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41]]


def run_pp(model: str, layouts: str, prompts: list[list[int]], max_tokens: int, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pp_check.py"), model, layouts,
                           json.dumps(prompts), str(max_tokens), *extra],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_layers_split_as_evenly_as_possible():
    assert stage_layer_ranges(30, 2) == [range(0, 15), range(15, 30)]
    assert [len(r) for r in stage_layer_ranges(30, 4)] == [7, 8, 8, 7]  # extras before the last
    assert [len(r) for r in stage_layer_ranges(3, 2)] == [2, 1]
    with pytest.raises(ValueError, match="pipeline_parallel_size must be between 1 and the model's "
                                         r"number of layers \(3\), got 4"):
        stage_layer_ranges(3, 4)


def test_tiny_model_in_two_stages_matches_one_device(tmp_path):
    """Three layers (2 + 1) and a tied head, which the last stage keeps (as the embedding, or
    as the linear method's own copy of it). PP=2 x TP=2 is warmed up with
    check_recompilation: every stage's programs are compiled ahead. The pool of 10 blocks is
    too small for the four longer requests at once: they preempt each other."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    write_tiny_llama(tmp_path, num_layers=3, tie=True)
    load_tokenizer(default_model_path()).save_pretrained(tmp_path)
    r = run_pp(str(tmp_path), "1x1,2x1,2x2w", PROMPTS, 8, "10")
    ref = r["1x1"]
    assert ref["preemptions"] > 0 and ref["kept"] == ref["long"][0::2]
    for layout in ("1x1", "2x1", "2x2w"):
        assert r[layout]["free_after_long"] == r[layout]["free_after_abort"] == r[layout]["total_blocks"] == 9
    for layout in ("2x1", "2x2w"):
        assert r[layout]["max_in_flight"] == 2
        assert r[layout]["preemptions"] > 0 and r[layout]["long"] == ref["long"]
        assert "a3" in r[layout]["in_flight_at_abort"]  # aborted while its batch was in flight
        assert r[layout]["kept"] == ref["kept"] and r[layout]["aborted"] == []
        assert r[layout]["tokens"] == r["1x1"]["tokens"]
        for (tokens, cum), (ref_tokens, ref_cum) in zip(r[layout]["extended"], r["1x1"]["extended"]):
            assert tokens == ref_tokens and abs(cum - ref_cum) < 1e-4
        first, last = r[layout]["holds"]
        assert first == ["embed_tokens"] and last in (["embed_tokens", "norm"], ["norm", "lm_head"])
    assert r["2x1"]["kv_shards"] == [[[2, 2, 10, 16, 2, 16]], [[1, 2, 10, 16, 2, 16]]]
    assert r["2x2w"]["kv_shards"] == [[[2, 2, 10, 16, 1, 16]] * 2, [[1, 2, 10, 16, 1, 16]] * 2]


@pytest.mark.slow
def test_default_model_in_two_stages_matches_one_device():
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    tok = load_tokenizer(default_model_path())
    prompts = [tok.encode(p) for p in ["The capital of France is", "def fibonacci(n):"]]
    # PP=2 x TP=2 (stages of 15 real layers, 3 KV heads padded to 4); PP=2 alone is the tiny
    # model's test above.
    r = run_pp("default", "1x1,2x2", prompts, 12)
    print({layout: v["tokens"] for layout, v in r.items()})
    assert r["2x2"]["tokens"] == r["1x1"]["tokens"]
    assert r["2x2"]["kv_shards"] == [[[15, 2, 64, 16, 2, 64]] * 2] * 2  # 3 KV heads padded to 4


@pytest.mark.parametrize("args, message", [
    (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be at least 1, got 0"),
    (dict(pipeline_parallel_size=2, distributed_executor_backend="mp"), "use distributed_executor_backend='uni'"),
    (dict(pipeline_parallel_size=2, preemption_mode="swap"), "not supported with pipeline_parallel_size > 1"),
    (dict(data_parallel_size=0), "data_parallel_size must be at least 1, got 0"),
    (dict(data_parallel_size=2, nnodes=2), "runs its engine cores on one host"),
    (dict(distributed_executor_backend="ray", tensor_parallel_size=4, ray_workers=3),
     r"ray_workers must be at least 1 and divide tensor_parallel_size \(4\), got 3"),
    (dict(distributed_executor_backend="ray", preemption_mode="swap"), "'mp' or 'ray' executor"),
])
def test_scale_out_arguments_are_checked(args, message):
    from types import SimpleNamespace

    from jaxvllm.config import EngineArgs
    with pytest.raises(ValueError, match=message):
        EngineArgs(**args).create_engine_config(SimpleNamespace(max_position_embeddings=512), "cpu")


def test_every_family_runs_in_stages(tmp_path):
    """Every family's forward is its stage parts (embed, forward_layers, final_norm), so any
    splits into stages: OPT (its learned positions join where the first stage's layers begin)
    and a Mixtral served with quantization="int8", every stage of which runs 8-bit experts
    (float experts on a stage once differed by 4e-4), give PP=1's prompt logprobs."""
    from types import SimpleNamespace

    from conftest import write_tiny_moe
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    from family_checkpoints import write_family_checkpoint

    from jaxvllm.models.causal_lm import CausalLM
    from jaxvllm.models.registry import get_model_class, supported_architectures
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    for arch in supported_architectures():
        assert get_model_class(SimpleNamespace(architectures=[arch]))[0].__call__ is CausalLM.__call__, arch
    write_family_checkpoint("OPTForCausalLM", tmp_path / "opt")
    write_tiny_moe(tmp_path / "mixtral", "Mixtral")
    load_tokenizer(default_model_path()).save_pretrained(tmp_path / "mixtral")
    opt, mixtral = str(tmp_path / "opt"), f"{tmp_path / 'mixtral'}=int8"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pp_logprobs_check.py"), opt, mixtral],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r[mixtral]["1"]["expert_dtypes"] == ["int8"] and r[mixtral]["2"]["expert_dtypes"] == ["int8", "int8"]
    for model in (opt, mixtral):
        np.testing.assert_allclose(r[model]["2"]["prompt_logprobs"], r[model]["1"]["prompt_logprobs"],
                                   rtol=0, atol=1e-5)
