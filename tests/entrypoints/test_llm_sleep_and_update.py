"""LLM.sleep / wake_up / update_weights on a tiny random Llama, in process: greedy outputs
survive sleep, the device memory is freed while asleep, an update gives exactly what a fresh
engine built from the new weights gives, a bad update changes nothing, and none of it
compiles a program."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import monitoring
from safetensors.numpy import save_file

from jaxvllm import LLM, SamplingParams
from jaxvllm.engine.exceptions import EngineSleepingError

ENGINE = dict(skip_warmup=True, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
              num_gpu_blocks_override=32)
PROMPTS = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11, 12, 13]}]
GREEDY = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)
_LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # once per program compiled
_lowered: list[str] = []
monitoring.register_event_duration_secs_listener(
    lambda event, _, **kw: _lowered.append(kw.get("fun_name")) if event == _LOWERING else None)


@contextlib.contextmanager
def no_compilation():
    start = len(_lowered)
    yield
    assert _lowered[start:] == []


def greedy(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def perturbed(tensors: dict, scale: float = 0.05, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in tensors.items()}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from safetensors.numpy import load_file
    llm = LLM(str(tiny_model_dir), **ENGINE)
    return llm, load_file(str(tiny_model_dir / "model.safetensors"))


def test_sleep_and_wake_up_free_the_device_and_keep_outputs(tiny):
    llm, _ = tiny
    core = llm.llm_engine.engine_core
    before = greedy(llm)
    awake = core.device_memory_in_use()
    runner = core.model_executor.driver_worker.model_runner
    held = sum(x.nbytes for x in jax.tree.leaves(runner.params)) + runner.kv_cache.nbytes
    for level in (1, 2):
        with no_compilation():
            llm.sleep(level=level)
            assert llm.is_sleeping()
            asleep = core.device_memory_in_use()
            assert awake - asleep >= 0.95 * held, (level, awake, asleep, held)
            with pytest.raises(EngineSleepingError, match="sleeping"):
                llm.generate(PROMPTS, GREEDY, use_tqdm=False)
            llm.wake_up(tags=["weights"])  # level 2: reloaded from the checkpoint
            assert llm.is_sleeping()
            llm.wake_up(tags=["kv_cache"])
            assert not llm.is_sleeping()
            assert greedy(llm) == before
    with pytest.raises(ValueError, match="tags must be among"):
        llm.wake_up(tags=["optimizer"])


def test_sleep_is_refused_with_requests_in_flight(tiny):
    llm, _ = tiny
    engine = llm.llm_engine
    engine.add_request("busy", PROMPTS[0], GREEDY)
    with pytest.raises(RuntimeError, match=r"Cannot sleep with 1 request\(s\) in flight \(busy\)"):
        llm.sleep()
    with pytest.raises(RuntimeError, match="Cannot update_weights"):
        llm.update_weights({})
    while engine.has_unfinished_requests():
        engine.step()
    assert not llm.is_sleeping()


@pytest.fixture(scope="module")
def perturbed_model(tiny, tmp_path_factory):
    """A checkpoint of perturbed weights, and a fresh engine's greedy tokens on it."""
    llm, tensors = tiny
    new = perturbed(tensors)
    path = tmp_path_factory.mktemp("perturbed") / "model"
    shutil.copytree(llm_dir(llm), path)
    save_file(new, str(path / "model.safetensors"))
    return path, new, greedy(LLM(str(path), **ENGINE))


def test_update_weights_equals_a_fresh_engine(tiny, perturbed_model):
    llm, _ = tiny
    before = greedy(llm)
    _, new, expected = perturbed_model
    assert expected != before
    llm.sleep(level=1)  # the RL loop: sleep, train, update, wake up
    with no_compilation():
        llm.update_weights(new)
        llm.wake_up()
    assert greedy(llm) == expected
    # From a path, and back to the old weights.
    with no_compilation():
        llm.update_weights(str(llm_dir(llm)))
    assert greedy(llm) == before


def test_update_from_an_orbax_checkpoint(tiny, perturbed_model, tmp_path):
    from jaxvllm.entrypoints.cli import main
    llm, _ = tiny
    before = greedy(llm)
    path, _, expected = perturbed_model
    assert main(["convert", str(path), str(tmp_path / "ckpt")]) == 0
    llm.update_weights(tmp_path / "ckpt")
    assert greedy(llm) == expected
    llm.update_weights(llm_dir(llm))
    assert greedy(llm) == before


def test_a_bad_update_is_refused_and_the_old_weights_keep_serving(tiny, tmp_path):
    llm, tensors = tiny
    before = greedy(llm)
    up = "model.layers.1.mlp.up_proj.weight"
    bad = {**perturbed(tensors), up: np.zeros((3, 3), np.float32)}
    with pytest.raises(ValueError, match=rf"tensor '{up}' has shape \(3, 3\); the model's is \(128, 64\)"):
        llm.update_weights(bad)
    with pytest.raises(ValueError, match="no tensor 'model.layers.9.mlp.up_proj.weight'"):
        llm.update_weights({"model.layers.9.mlp.up_proj.weight": tensors[up]})
    with pytest.raises(ValueError, match="fused with .*'model.layers.0.self_attn.v_proj.weight'.* into "
                                         "'layers.0.qkv_proj'"):
        q_proj = "model.layers.0.self_attn.q_proj.weight"
        llm.update_weights({q_proj: tensors[q_proj]})
    with pytest.raises(ValueError, match="dtype int32"):
        llm.update_weights({up: tensors[up].astype(np.int32)})
    (tmp_path / "junk.gguf").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="could not read .*junk.gguf"):
        llm.update_weights(tmp_path / "junk.gguf")
    assert greedy(llm) == before


def test_update_by_parameter_names_uses_jax_arrays_without_a_copy(tiny):
    llm, tensors = tiny
    before = greedy(llm)
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    old = runner.params["embed_tokens"].get_value()
    new = jax.device_put(old * 1.5, old.sharding)
    with no_compilation():
        llm.update_weights({"embed_tokens": new})  # a partial update, of the tree's own layout
    held = runner.params["embed_tokens"].get_value()
    assert held.unsafe_buffer_pointer() == new.unsafe_buffer_pointer()
    assert greedy(llm) != before
    llm.update_weights({"model.embed_tokens.weight": tensors["model.embed_tokens.weight"]})
    assert greedy(llm) == before


def llm_dir(llm) -> Path:
    return Path(llm.llm_engine.engine_core.model_executor.driver_worker.model_path)
