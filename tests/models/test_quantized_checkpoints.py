"""Quantized checkpoints as people download them, written here in each published layout
(quantized_checkpoints.py): fp8 128x128-style blocks, AWQ, GPTQ (4 and 8 bits, symmetric and
not, act order), compressed-tensors W4A16 (pack-quantized) and W8A8 int8. Each loads through
the engine's own resolution (the method and scheme read from config.json, the backend's
methods) with its values kept in their stored type, every linear equal to the file's
dequantized weight, and the logits and perplexity of the float model on those weights."""
from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from conftest import backend_for, run_prefill, write_tiny_moe
from flax import nnx
from quantized_checkpoints import WRITERS, write_awq, write_fp8_block, write_gptq
from safetensors.numpy import save_file

from jaxvllm import LLM, EngineArgs, SamplingParams
from jaxvllm.layers.quantization.checkpoint import checkpoint_quantization, resolve_quantization
from jaxvllm.layers.quantization.quantized_matmul import dequantize, split_act_order
from jaxvllm.models.layer_loops import unrolled_layers
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.transformers_utils.config import load_hf_config

TOKENS = np.random.default_rng(0).integers(0, 256, 96).tolist()
# format -> (quant_method, stored value dtype of the linears)
EXPECTED = {"fp8-block": ("fp8", jnp.float8_e4m3fn), "awq": ("awq", jnp.uint4), "gptq": ("gptq", jnp.int4),
            "gptq-act-order": ("gptq", jnp.int4), "gptq-8bit-asym-act-order": ("gptq", jnp.uint8),
            "w4a16": ("compressed-tensors", jnp.int4), "w4a16-asym": ("compressed-tensors", jnp.int4),
            "w8a8-int8": ("compressed-tensors", jnp.int8)}
# On the CPU 4-bit values are held a byte each (QuantizedWeight.to_qarray).
HELD = {jnp.int4: jnp.int8, jnp.uint4: jnp.uint8}


def held(fmt: str):
    return HELD.get(EXPECTED[fmt][1], EXPECTED[fmt][1])


def perplexity(logits: np.ndarray, tokens: list[int]) -> float:
    logp = logits[:-1] - np.log(np.exp(logits[:-1] - logits[:-1].max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits[:-1].max(-1, keepdims=True)
    return float(np.exp(-logp[np.arange(len(tokens) - 1), tokens[1:]].mean()))


def logits(model) -> np.ndarray:
    """TOKENS' logits, the layers unrolled and run op by op: each op compiles once for the
    module, where the CPU's layer loop would compile the model again for every checkpoint."""
    return run_prefill(model, TOKENS, layer_loop=unrolled_layers)


def load_pair(path, reference: dict):
    """The checkpoint at path loaded as the CPU engine would (its methods from the config),
    and the float model of its dequantized weights."""
    hf_config = load_hf_config(str(path))
    method, scheme = resolve_quantization(None, hf_config)
    backend = backend_for("cpu", "xla", quantization=method, scheme=scheme)
    model_cls, args_cls = get_model_class(hf_config)
    args = args_cls.from_hf_config(hf_config)
    quantized = nnx.eval_shape(lambda: model_cls(args, linear_method=backend.linear_method,
                                                 moe_method=backend.moe_method))
    quantized.load_hf_weights(load_weights(str(path)))
    ref = nnx.eval_shape(lambda: model_cls(args))
    ref.load_hf_weights({k: np.asarray(v, np.float32) for k, v in reference.items()})
    return (method, scheme), quantized, ref


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_checkpoint_loads_as_stored_with_the_logits_of_its_dequantized_weights(tmp_path, tiny_model_dir, fmt):
    reference = WRITERS[fmt](tiny_model_dir, tmp_path / fmt)
    (method, scheme), quantized, ref = load_pair(tmp_path / fmt, reference)
    assert method == EXPECTED[fmt][0]
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        stored, perm = split_act_order(quantized.layers[1][name].get_value())
        assert isinstance(stored, qwix.QArray) and stored.qvalue.dtype == held(fmt), name
        assert (perm is not None) == scheme.act_order
        weight = np.asarray(dequantize(stored, jnp.float32))
        if perm is not None:  # rows kept in group order: back to the checkpoint's
            weight = weight[np.argsort(np.asarray(perm))]
        np.testing.assert_allclose(weight, np.asarray(ref.layers[1][name].get_value()), rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    assert not isinstance(quantized.lm_head.get_value(), qwix.QArray)  # the head stays float, as stored
    got, want = logits(quantized), logits(ref)
    if scheme.input_dtype is None:
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    # W8A8: activations quantized per token too, so only close
    assert abs(perplexity(got, TOKENS) / perplexity(want, TOKENS) - 1) < 0.005


@pytest.mark.parametrize("fmt", ["fp8-block", "awq"])
def test_quantized_experts_load_as_stored(tmp_path, fmt):
    """Qwen3-MoE's experts in the format (blocks / groups of 16: its intermediate size is 48)."""
    write_tiny_moe(tmp_path / "float", "Qwen3Moe")
    write = (lambda s, d: write_fp8_block(s, d, (16, 16))) if fmt == "fp8-block" else \
        (lambda s, d: write_awq(s, d, group=16))
    reference = write(tmp_path / "float", tmp_path / fmt)
    _, quantized, ref = load_pair(tmp_path / fmt, reference)
    experts = quantized.layers[1]["experts_down"].get_value()
    assert isinstance(experts, qwix.QArray) and experts.qvalue.dtype == held(fmt)
    assert experts.scale.shape == (8, 48 // 16, 64)  # [experts, groups, out]
    np.testing.assert_allclose(np.asarray(dequantize(experts, jnp.float32, in_axis=1)),
                               np.asarray(ref.layers[1]["experts_down"].get_value()), rtol=1e-6, atol=1e-7)
    got, want = logits(quantized), logits(ref)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_llm_detects_an_awq_checkpoint_and_serves_it(tmp_path, tiny_model_dir):
    reference = write_awq(tiny_model_dir, tmp_path / "awq")
    shutil.copytree(tiny_model_dir, float_path := tmp_path / "float")
    save_file({k: np.asarray(v, np.float32) for k, v in reference.items()}, float_path / "model.safetensors")
    kwargs = dict(max_model_len=64, skip_warmup=True, kv_cache_memory_bytes=1 << 20)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [40, 2, 90]}]
    # Warmed: a step compiled ahead of time takes the 4-bit values as the engine holds them.
    llm = LLM(str(tmp_path / "awq"), **dict(kwargs, skip_warmup=False))
    assert llm.llm_engine.config.quantization == "awq"
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in LLM(str(float_path), **kwargs).generate(prompts, params, use_tqdm=False)]
    assert got == want


def test_a_quantization_other_than_the_checkpoints_is_refused_by_name(tmp_path, tiny_model_dir):
    write_gptq(tiny_model_dir, tmp_path / "gptq")
    hf_config = load_hf_config(str(tmp_path / "gptq"))
    assert EngineArgs(model=str(tmp_path / "gptq"), quantization="gptq").create_engine_config(
        hf_config, "cpu").quant_config.weights.qtype == "int4"
    with pytest.raises(ValueError, match="quantization='awq' contradicts the checkpoint, which is quantized "
                                         "\\('gptq' in its config.json\\)"):
        EngineArgs(model=str(tmp_path / "gptq"), quantization="awq").create_engine_config(hf_config, "cpu")
    with pytest.raises(ValueError, match="quantization='gptq' needs a checkpoint whose config.json has a "
                                         "quantization_config"):
        resolve_quantization("gptq", load_hf_config(str(tiny_model_dir)))
    with pytest.raises(ValueError, match="quantization='gguf' needs a .gguf model file"):
        resolve_quantization("gguf", load_hf_config(str(tiny_model_dir)))


@pytest.mark.parametrize("qc, error", [
    ({"quant_method": "awq", "bits": 3, "group_size": 128}, "bits=3; AWQ checkpoints load at 4 bits"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version='gemv'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group_size=0"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits=3; GPTQ checkpoints load at 4 or 8 bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*mlp": {}}}, "dynamic"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "checkpoint_format"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt='e5m2'"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size=\\[128\\]"),
])
def test_checkpoint_configs_that_do_not_load_are_named(qc, error):
    with pytest.raises(ValueError, match=error):
        checkpoint_quantization(type("Config", (), {"quantization_config": qc}))


def test_a_scales_shape_that_fits_no_format_is_named(tmp_path, tiny_model_dir):
    write_fp8_block(tiny_model_dir, path := tmp_path / "fp8")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [16, 16]  # the file's scales are per 32 x 32
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="down_proj.weight's block scale of shape \\(2, 4\\) does not fit a weight "
                                         "of shape \\(64, 128\\) in blocks of \\[16, 16\\] \\(needs \\(4, 8\\)"):
        load_weights(str(path))
