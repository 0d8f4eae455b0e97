"""Weight quantization at load (layers/quantization/weight_only.py) and the memory it saves:
the quantized matmul against the float one, a tiny model's logits with quantized weights,
the plan's and the engine's bytes and blocks (asserted facts, not timings)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from conftest import run_prefill, write_tiny_llama
from flax import nnx

from jaxvllm import LLM, SamplingParams
from jaxvllm.backends import get_backend
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization.config import QuantizationConfig
from jaxvllm.layers.quantization.weight_only import WeightOnlyLinearMethod
from jaxvllm.memory_plan import GiB, engine_config, plan, weight_bytes
from jaxvllm.memory_plan import main as memory_plan_main
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.loader import load_weights
from jaxvllm.models.shapes import LLAMA3_8B, SMOLLM2
from jaxvllm.platforms import get_platform
from jaxvllm.transformers_utils.config import load_hf_config

# Relative error of one weight: half a step of 127 (int8); e4m3's 3-bit mantissa (fp8).
WEIGHT_RTOL = {"int8": 1 / 254, "fp8": 2**-4}


def plan_on_tpu(model_cls, args, device_memory: int, **flags):
    """memory_plan's plan for an engine of these flags on a TPU."""
    config = engine_config(**flags)
    return plan(model_cls, args, config, get_backend(config, get_platform("tpu")), device_memory)


def quant_config_for(quantization):
    """The methods an accelerator's backend runs a weight format with."""
    backend = get_backend(engine_config(quantization=quantization), get_platform("tpu"))
    return QuantizationConfig(backend.linear_method, backend.moe_method)


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_quantized_matmul_against_float(quantization):
    kx, kw = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(kx, (5, 96)), jax.random.normal(kw, (96, 3, 32))
    method = WeightOnlyLinearMethod(quantization)
    qw = method.process_weights_after_loading(w)
    assert isinstance(qw, qwix.QArray) and qw.qvalue.dtype == method.qtype and qw.scale.shape == (1, 3, 32)
    # Each weight within its format's step, relative to its output channel's largest.
    deq = np.asarray(qwix.dequantize(qw))
    channel_max = np.abs(np.asarray(w)).max(axis=0)
    assert (np.abs(deq - np.asarray(w)) <= WEIGHT_RTOL[quantization] * channel_max + 1e-6).all()
    y = np.asarray(method.apply(x, qw))
    np.testing.assert_allclose(y, np.einsum("ti,ijk->tjk", np.asarray(x), deq), rtol=1e-5, atol=1e-4)
    ref = np.einsum("ti,ijk->tjk", np.asarray(x), np.asarray(w))
    assert np.abs(y - ref).max() < 4 * WEIGHT_RTOL[quantization] * np.abs(ref).max()
    if quantization == "fp8":  # scales by llm-compressor's mse observer: no channel worse than absmax's
        absmax = qwix.dequantize(qwix.quantize(w, jnp.float8_e4m3fn, channelwise_axes=(1, 2)))
        errors = [(np.abs(np.asarray(d) - np.asarray(w)) ** 2.4).sum(axis=0) for d in (deq, absmax)]
        assert (errors[0] <= errors[1]).all() and (errors[0] < errors[1]).any()
    # A float weight (a tied LM head: the embedding) is multiplied as XLA's method does.
    np.testing.assert_allclose(np.asarray(method.apply(x, w)), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_tiny_model_logits_with_quantized_weights(tmp_path, quantization):
    write_tiny_llama(tmp_path, tie=True)
    args = LlamaArgs.from_hf_config(load_hf_config(str(tmp_path)))
    weights = load_weights(str(tmp_path))
    models = {}
    for name, method in (("float", UnquantizedLinearMethod()), (quantization, WeightOnlyLinearMethod(quantization))):
        models[name] = nnx.eval_shape(lambda: LlamaForCausalLM(args, linear_method=method))  # noqa: B023
        models[name].load_hf_weights(weights)
    layer = models[quantization].layers[0]
    assert all(isinstance(layer[n].get_value(), qwix.QArray)
               for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    assert models[quantization].lm_head is None  # the tied head stays the float embedding
    tokens = [3, 17, 42, 99, 7, 250, 1, 64]
    ref, got = run_prefill(models["float"], tokens), run_prefill(models[quantization], tokens)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75


def test_layers_the_config_ignores_stay_float(tmp_path):
    """The quantization config picks each named layer's method (get_quant_method): the layers
    it ignores, by name or pattern, keep float weights and run XLA's float matmul; a model
    whose every linear is ignored gives the float model's logits exactly."""
    write_tiny_llama(tmp_path)
    args = LlamaArgs.from_hf_config(load_hf_config(str(tmp_path)))
    weights = load_weights(str(tmp_path))

    def load(quant_config):
        model = nnx.eval_shape(lambda: LlamaForCausalLM(args, quant_config=quant_config))
        model.load_hf_weights(weights)
        return model

    model = load(QuantizationConfig(WeightOnlyLinearMethod("int8"), ignore=("layers.0.qkv_proj", r"re:layers\.1\..*")))
    quantized = {path for path in model.weights() if isinstance(model._param(path).get_value(), qwix.QArray)}
    assert quantized == {"layers.0.o_proj", "layers.0.gate_up_proj", "layers.0.down_proj", "lm_head"}
    assert model.quant_method("layers.1.down_proj").__class__ is UnquantizedLinearMethod
    tokens = [3, 17, 42, 99, 7, 250, 1, 64]
    everything = QuantizationConfig(WeightOnlyLinearMethod("int8"), ignore=(r"re:.*",))
    np.testing.assert_array_equal(run_prefill(load(everything), tokens),
                                  run_prefill(load(QuantizationConfig()), tokens))


@pytest.mark.parametrize("args", [SMOLLM2, LLAMA3_8B], ids=["smollm2", "llama3-8b"])
def test_plan_weight_bytes_and_kv_blocks(args):
    float32 = weight_bytes(LlamaForCausalLM, args, quant_config_for(None), "float32")[0]
    for quantization in ("int8", "fp8"):
        assert weight_bytes(LlamaForCausalLM, args, quant_config_for(quantization), "float32")[0] <= 0.27 * float32
    budget = dict(device_memory=64 * GiB, quantization="int8", dtype="bfloat16")
    bf16 = plan_on_tpu(LlamaForCausalLM, args, **budget).num_blocks
    for kv in ("fp8", "fp8_e5m2", "int8"):
        assert plan_on_tpu(LlamaForCausalLM, args, kv_cache_dtype=kv, **budget).num_blocks >= 1.9 * bf16


def test_memory_plan_cli_for_llama3_8b_on_16gib(capsys):
    memory_plan_main(["--shape", "llama3-8b", "--quantization", "int8", "--kv-cache-dtype", "fp8",
                      "--device-memory", "16GiB", "--max-model-len", "8192"])
    out = capsys.readouterr().out
    assert "2,097,152 bytes per block of 32 tokens" in out and "requests of 8192 tokens" in out  # the TPU's pages
    memory_plan_main(["--shape", "llama3-8b", "--device-memory", "16GiB"])  # bfloat16 weights
    assert "blocks that fit: none" in capsys.readouterr().out


def test_memory_plan_cli_plans_a_checkpoints_packed_weights(capsys):
    """An AWQ checkpoint's weights at 4 bits with group scales and zeros; a format that depends
    on the checkpoint is refused without its scheme (it was planned at 8 bits, silently)."""
    def matmul_mib(*flags):
        memory_plan_main(["--shape", "llama3-8b", "--device-memory", "16GiB", *flags])
        line = next(x for x in capsys.readouterr().out.splitlines() if "in matmuls" in x)
        return float(line.split("(")[1].split(" MiB")[0].replace(",", ""))
    bf16, int8 = matmul_mib(), matmul_mib("--quantization", "int8")
    awq = matmul_mib("--quantization", "awq", "--weight-scheme", "uint4:128:zp")
    fp8_blocks = matmul_mib("--quantization", "fp8", "--weight-scheme", "float8_e4m3fn:128")
    assert awq < 0.35 * bf16 and awq < 0.7 * int8 and int8 < fp8_blocks < 0.6 * bf16  # the head stays float
    for flags, error in [(["--quantization", "awq"], "give its --weight-scheme"),
                         (["--quantization", "gguf"], "plan it from the file"),
                         (["--quantization", "gptq", "--weight-scheme", "int3:128"], "WeightScheme.qtype"),
                         (["--quantization", "int8", "--weight-scheme", "int4:128"], "has none")]:
        with pytest.raises(SystemExit):
            memory_plan_main(["--shape", "llama3-8b", "--device-memory", "16GiB", *flags])
        assert error in capsys.readouterr().err


def test_memory_plan_counts_the_tpu_layouts_lane_padding(capsys):
    """On a TPU each KV head takes whole 128-lane vregs: SmolLM2's heads of 64 take twice their
    bytes, so its pool holds half the blocks the portable layout would."""
    config = engine_config(block_size=32)
    plans = {p: plan(LlamaForCausalLM, SMOLLM2, config, get_backend(config, get_platform(p)), 16 * GiB)
             for p in ("cuda", "tpu")}
    assert plans["tpu"].kv_bytes_per_block == 2 * plans["cuda"].kv_bytes_per_block
    assert plans["tpu"].num_blocks == plans["cuda"].num_blocks // 2
    memory_plan_main(["--shape", "smollm2", "--device-memory", "16GiB", "--block-size", "32", "--platform", "tpu"])
    assert f"{plans['tpu'].kv_bytes_per_block:,} bytes per block" in capsys.readouterr().out


def test_memory_plan_counts_what_sliding_window_groups_hold():
    """Gemma 3 (5 sliding layers at window 1,024 to 1 global): at 32k tokens a request holds
    its whole length in the global group only, so the pool holds over 4x the requests."""
    from jaxvllm.models.gemma import GemmaForCausalLM
    from jaxvllm.models.shapes import GEMMA3_27B
    p = plan_on_tpu(GemmaForCausalLM, GEMMA3_27B, quantization="int8", device_memory=16 * GiB, max_model_len=32768,
                    tensor_parallel_size=4)
    assert p.groups == "sliding window 1024: 52 layers in 6 groups, full attention: 10 layers in 1 group"
    assert p.blocks_per_request == 2048 + 6 * (64 + 1)
    assert p.max_full_length_seqs >= 4 * p.max_full_length_seqs_without_windows > 0


def test_engine_allocates_quantized_weights_and_cache(tiny_model_dir):
    budget = 1 << 20
    llm = LLM(str(tiny_model_dir), quantization="int8", kv_cache_dtype="fp8", kv_cache_memory_bytes=budget,
              max_model_len=128, skip_warmup=True)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    worker = llm.llm_engine.engine_core.model_executor.driver_worker
    runner, a = worker.model_runner, worker.args
    float32_block = a.num_layers * 2 * 16 * a.num_kv_heads * a.head_dim * 4
    # e4m3 pages, stored as such or as their bits (uint8) where the platform says so.
    assert worker.kv_dtype.dtype == jnp.float8_e4m3fn and runner.kv_cache.dtype == worker.kv_dtype.storage
    assert runner.kv_cache.shape[2] == budget // (float32_block // 4) >= 1.9 * 2 * (budget // float32_block)
    matmul = [x for path, x in jax.tree_util.tree_leaves_with_path(runner.params)
              if any(getattr(k, "key", None) in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
                     for k in path)]
    stored = sum(x.nbytes for x in matmul)
    as_float32 = sum(x.size * 4 for x in matmul if x.dtype == jnp.int8)
    assert as_float32 and stored <= 0.27 * as_float32


@pytest.mark.parametrize("platform", ["cpu", "cuda", "tpu"])
def test_every_platform_runs_quantized_weights_through_xla(platform):
    from jaxvllm.config import EngineConfig, ModelConfig
    from jaxvllm.config import QuantizationConfig as QuantizationSection
    model = ModelConfig(dtype="float32", attention_backend="xla" if platform != "cpu" else "auto")
    backend = get_backend(EngineConfig(model=model, quant_config=QuantizationSection("fp8")), get_platform(platform))
    method = backend.linear_method
    assert isinstance(method, WeightOnlyLinearMethod) and method.qtype == jnp.float8_e4m3fn
    assert not isinstance(backend.float_linear_method, WeightOnlyLinearMethod)


def test_quantized_experts_against_the_dense_reference_on_dequantized_weights():
    """fp8 experts (int8 differ in qtype only) through the CPU's tile loop (the whole layer and
    expert-parallel shares) and XLA's ragged_dot, against every expert run densely on the
    dequantized weights."""
    from jaxvllm.kernels.xla.grouped_matmul import grouped_matmul
    from jaxvllm.layers.fused_moe import dense_moe, select_experts
    from jaxvllm.layers.quantization.weight_only_moe import WeightOnlyFusedMoEMethod
    rng = np.random.default_rng(0)
    T, H, I, E, k = 13, 32, 24, 8, 2
    x = jnp.asarray(rng.standard_normal((T, H)), jnp.float32)
    w_gate_up = jnp.asarray(rng.standard_normal((E, H, 2, I)) * 0.2, jnp.float32)
    w_down = jnp.asarray(rng.standard_normal((E, I, H)) * 0.2, jnp.float32)
    weights, ids = select_experts(jnp.asarray(rng.standard_normal((T, E)), jnp.float32), k, True)
    float_ref = np.asarray(dense_moe(x, w_gate_up, w_down, weights, ids))
    tiles, ragged = (WeightOnlyFusedMoEMethod("fp8", gm) for gm in (grouped_matmul, jax.lax.ragged_dot))
    q_gate_up, q_down = (tiles.process_weights_after_loading(w) for w in (w_gate_up, w_down))
    assert q_gate_up.qvalue.dtype == tiles.qtype and q_gate_up.scale.shape == (E, 1, 2, I)
    assert q_down.scale.shape == (E, 1, H)

    @jax.jit  # one compile instead of one per operation
    def run(q_gate_up, q_down):
        def experts(w, e):
            return jax.tree.map(lambda a: a[e:e + 2], w)
        shares = sum(tiles.apply(x, experts(q_gate_up, e), experts(q_down, e), weights, ids, first_expert=e)
                     for e in range(0, E, 2))
        return (tiles.apply(x, q_gate_up, q_down, weights, ids), shares,
                ragged.apply(x, q_gate_up, q_down, weights, ids),
                dense_moe(x, qwix.dequantize(q_gate_up), qwix.dequantize(q_down), weights, ids))

    *got, reference = run(q_gate_up, q_down)
    for out in got:
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(reference) - float_ref).max() < 8 * WEIGHT_RTOL["fp8"] * np.abs(float_ref).max()
