"""Pre-quantized compressed-tensors checkpoints (llm-compressor's layout, written here with
torch as the reference), Llama and Qwen3-MoE (experts quantized): the QArrays loaded hold the
file's 8-bit values bit for bit, the logits are those of the float model on the file's
dequantized weights, and LLM detects the format from config.json and serves it."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
import qwix
import torch
from conftest import run_prefill, write_tiny_moe
from flax import nnx
from safetensors.torch import load_file, save_file

from jaxvllm import LLM, EngineArgs, SamplingParams
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization.checkpoint import checkpoint_quantization
from jaxvllm.layers.quantization.weight_only import WeightOnlyLinearMethod
from jaxvllm.layers.quantization.weight_only_moe import WeightOnlyFusedMoEMethod
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.models.weight_spec import EXPERTS
from jaxvllm.transformers_utils.config import load_hf_config

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def write_compressed_tensors(src, dst, fmt: str, strategy: str) -> dict[str, np.ndarray]:
    """src's checkpoint as llm-compressor writes it to dst: the decoder layers' linears in 8
    bits with a bfloat16 scale each ([out, 1] per channel, [1] per tensor) and a static
    input scale (which weight-only serving does not read); the rest float. Returns the
    checkpoint dequantized (the float reference)."""
    shutil.copytree(src, dst)
    stored, dequantized = {}, {}
    for name, w in load_file(dst / "model.safetensors").items():
        if not (name.startswith("model.layers.") and name.endswith("_proj.weight")):
            stored[name], dequantized[name] = w, w.numpy()
            continue
        absmax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)
        if fmt == "float-quantized":
            scale = (absmax / FP8_MAX).to(torch.bfloat16)
            q = (w / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        else:
            scale = (absmax / 127).to(torch.bfloat16)
            q = (w / scale.float()).round().clamp(-128, 127).to(torch.int8)
        base = name.removesuffix("weight")
        stored[name], stored[base + "weight_scale"], stored[base + "input_scale"] = q, scale, torch.ones(1)
        dequantized[name] = (q.float() * scale.float()).numpy()
    save_file(stored, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float" if fmt == "float-quantized" else "int", "strategy": strategy,
            "symmetric": True, "dynamic": False}, "input_activations": None}},
        "ignore": ["lm_head"]}
    (dst / "config.json").write_text(json.dumps(config))
    return dequantized


@pytest.mark.parametrize("arch, fmt, strategy", [
    ("Llama", "float-quantized", "channel"),
    ("Llama", "int-quantized", "tensor"),  # q, k and v fused: three scales, broadcast per channel
    ("Qwen3Moe", "float-quantized", "channel"),  # quantized experts
])
def test_loaded_values_are_the_files_and_logits_the_dequantized_models(tmp_path, tiny_model_dir, arch, fmt,
                                                                     strategy):
    src = tiny_model_dir if arch == "Llama" else tmp_path / "float"
    if arch != "Llama":
        write_tiny_moe(src, arch)
    dequantized = write_compressed_tensors(src, path := tmp_path / "ct", fmt, strategy)
    hf_config = load_hf_config(str(path))
    assert checkpoint_quantization(hf_config)[0] == "compressed-tensors"
    model_cls, args_cls = get_model_class(hf_config)
    args = args_cls.from_hf_config(hf_config)
    moe = any(w.kind == EXPERTS for w in model_cls.weight_spec(args))
    quantized = nnx.eval_shape(lambda: model_cls(args, linear_method=WeightOnlyLinearMethod("compressed-tensors"),
                                                 moe_method=WeightOnlyFusedMoEMethod("compressed-tensors")))
    quantized.load_hf_weights(load_weights(str(path)))
    ref = nnx.eval_shape(lambda: model_cls(args, linear_method=UnquantizedLinearMethod()))
    ref.load_hf_weights(dequantized)

    stored = load_file(path / "model.safetensors")["model.layers.0.self_attn.o_proj.weight"]
    o_proj = quantized.layers[0]["o_proj"].get_value()
    assert o_proj.qvalue.dtype == (jnp.float8_e4m3fn if fmt == "float-quantized" else jnp.int8)
    np.testing.assert_array_equal(np.asarray(o_proj.qvalue).view(np.uint8), stored.view(torch.uint8).numpy().T)
    layer = {name: w.get_value() for name, w in quantized.layers[1].items()}
    mlp = ("experts_gate_up", "experts_down") if moe else ("gate_up_proj", "down_proj")
    assert {name for name, w in layer.items() if isinstance(w, qwix.QArray)} == {"qkv_proj", "o_proj", *mlp}
    for name in ("qkv_proj", "o_proj", *mlp):  # each layout: the dequantized weight, exactly
        np.testing.assert_array_equal(np.asarray(qwix.dequantize(layer[name])),
                                      np.asarray(ref.layers[1][name].get_value()), err_msg=name)
    if quantized.lm_head is not None:  # in the ignore list: float, as stored
        assert not isinstance(quantized.lm_head.get_value(), qwix.QArray)
    if moe:  # float experts quantized at load instead (quantization="int8")
        at_load = nnx.eval_shape(lambda: model_cls(args, moe_method=WeightOnlyFusedMoEMethod("int8")))
        at_load.load_hf_weights(dequantized)
        assert at_load.layers[1]["experts_down"].get_value().qvalue.dtype == jnp.int8
    tokens = [3, 17, 42, 99, 7, 250, 1, 64]
    want = run_prefill(ref, tokens)
    np.testing.assert_allclose(run_prefill(quantized, tokens), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_llm_detects_and_serves_the_checkpoint(tmp_path, tiny_model_dir):
    dequantized = write_compressed_tensors(tiny_model_dir, path := tmp_path / "ct", "float-quantized", "channel")
    shutil.copytree(tiny_model_dir, float_path := tmp_path / "float")
    save_file({k: torch.from_numpy(v) for k, v in dequantized.items()}, float_path / "model.safetensors")
    kwargs = dict(max_model_len=64, skip_warmup=True, kv_cache_memory_bytes=1 << 20)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [40, 2, 90]}]
    llm = LLM(str(path), **kwargs)
    assert llm.llm_engine.config.quantization == "compressed-tensors"
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in LLM(str(float_path), **kwargs).generate(prompts, params, use_tqdm=False)]
    assert got == want


def test_quantization_that_contradicts_the_checkpoint_is_refused(tmp_path, tiny_model_dir):
    write_compressed_tensors(tiny_model_dir, path := tmp_path / "ct", "float-quantized", "tensor")
    hf_config = load_hf_config(str(path))
    with pytest.raises(ValueError, match="quantization='int8' contradicts.*'compressed-tensors'"):
        EngineArgs(model=str(path), quantization="int8").create_engine_config(hf_config, "cpu")
    float_config = load_hf_config(str(tiny_model_dir))
    with pytest.raises(ValueError, match="quantization='compressed-tensors' needs a checkpoint"):
        EngineArgs(model=str(tiny_model_dir), quantization="compressed-tensors").create_engine_config(
            float_config, "cpu")


@pytest.mark.parametrize("group, error", [
    ({"format": "pack-quantized", "weights": {"num_bits": 3, "type": "int", "strategy": "group"}},
     "num_bits=3, type='int'; format 'pack-quantized' loads num_bits in \\(4, 8\\)"),
    ({"format": "float-quantized", "weights": {"num_bits": 8, "type": "float", "strategy": "group"}},
     "strategy='group' needs group_size > 0"),
    ({"format": "int-quantized", "weights": {"num_bits": 8, "type": "int", "strategy": "channel",
                                             "symmetric": False}}, "symmetric=False"),
    ({"format": "marlin-24", "weights": {"num_bits": 4, "type": "int", "strategy": "group"}},
     "format 'marlin-24' is not supported"),
])
def test_formats_that_do_not_load_are_named(group, error):
    config = SimpleNamespace(quantization_config={"quant_method": "compressed-tensors",
                                                  "config_groups": {"group_0": group}})
    with pytest.raises(ValueError, match=error):
        checkpoint_quantization(config)
    with pytest.raises(ValueError, match="quant_method='bitsandbytes' is not supported"):
        checkpoint_quantization(SimpleNamespace(quantization_config={"quant_method": "bitsandbytes"}))
