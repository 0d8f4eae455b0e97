"""The engine's step compiled by libtpu for compile-only TPU chips (jaxvllm/aot_compile.py), on
this CPU: every forward bucket of a tiny model and of SmolLM2's shapes (config.json only, no
weights) for a v5e and a v6e chip, Mosaic kernels included, under the memory plan the engine
would make there. Interpret mode accepts kernels Mosaic refuses, and only the real compiler
knows whether the plan fits the chip: a refusal or a plan that does not fit fails here.

libtpu comes with the `test` extra (jax[tpu]); without it this module is skipped."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("libtpu", reason="libtpu (jax[tpu], in the test extra) compiles for TPUs")
# Other processes (a concurrent test run, a benchmark) may hold libtpu's lock file; compiling
# for compile-only devices shares nothing with them.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from jaxvllm.aot_compile import compile_for_target  # noqa: E402
from jaxvllm.platforms.tpu_targets import TARGETS  # noqa: E402

CONFIGS = {
    "tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048),
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                    rope_theta=100000.0),
}
# SmolLM2's shapes with 2 of its 30 layers: the same kernels and matmuls (every layer compiles
# the same), in a fifteenth of the compile time.
CONFIGS["smollm2-2-layers"] = dict(CONFIGS["smollm2"], num_hidden_layers=2)
CONFIGS["tiny-draft"] = dict(CONFIGS["tiny"], num_hidden_layers=1)  # a draft model for the tiny one
CONFIGS["tiny-32k"] = dict(CONFIGS["tiny"], max_position_embeddings=32768)
# 8 KV heads of 128: a slot of 1,024 lanes, where an 8-bit pool tiled (32, 128) was relaid
# around every KV write.
CONFIGS["tiny-8-kv-heads"] = dict(CONFIGS["tiny"], num_attention_heads=8, num_key_value_heads=8, head_dim=128)
# Small batches keep the buckets few (16 and 32 tokens: each bucket is a full compile of the
# same kernels and matmuls at another token count) and the compiles quick.
ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=1024)
BUCKETS = ["forward T=16", "forward T=32"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    out = {}
    eagle3 = tmp_path_factory.mktemp("tiny-eagle3")  # an EAGLE-3 head for the tiny model
    (eagle3 / "config.json").write_text(json.dumps(dict(
        CONFIGS["tiny"], num_hidden_layers=1, draft_vocab_size=512, architectures=["LlamaForCausalLMEagle3"],
        model_type="llama", rms_norm_eps=1e-5, hidden_act="silu",
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})))
    out["tiny-eagle3"] = str(eagle3)
    for name, fields in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        config = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
                      tie_word_embeddings=True, hidden_act="silu", **fields)
        (path / "config.json").write_text(json.dumps(config))
        out[name] = str(path)
    return out


@pytest.mark.parametrize("model, target", [
    ("tiny", "tpu-v5e-1"), ("smollm2", "tpu-v5e-1"), ("smollm2-2-layers", "tpu-v6e-1")])
def test_every_forward_bucket_compiles_within_the_plan(models, model, target):
    # The memory plan compiles every sampler at SmolLM2's vocabulary (about 30 s here); it is
    # planned for the whole SmolLM2 and the tiny model on v5e (on v6e the next test plans the
    # tiny model at 32k, 256 sequences and every default bucket). The 2-layer cut of it,
    # whose plan would say little about the real model, checks Mosaic's v6e kernels in a pool
    # of a set size.
    fixed_pool = dict(num_gpu_blocks_override=256) if model == "smollm2-2-layers" else {}
    report = compile_for_target(models[model], target, programs=("forward",), **ENGINE, **fixed_pool)
    rows = report["programs"]
    assert [r["program"] for r in rows] == BUCKETS
    assert [(r["program"], r["error"]) for r in rows if not r["compiled"]] == []
    assert report["fits"] and report["max_concurrency"] >= 1, report
    for r in rows:  # the KV cache is donated, updated in place
        assert r["alias_bytes"] >= report["kv_cache_bytes"], r
    if model == "smollm2":
        assert_roofline_is_weights_and_kv_read(report, TARGETS[target].chip)


def assert_roofline_is_weights_and_kv_read(report: dict, chip) -> None:
    """A dense model's decode step moves its weights once and the KV its sequences read: the
    prediction is within 20% of that over HBM bandwidth (XLA's `bytes accessed` counted
    Llama-3-8B's forward at 7.66 GB per v5e-8 chip, against 2.0 GB of weights)."""
    kv_per_token = report["kv_cache_bytes"] / (report["kv_blocks"] * report["block_size"])
    for r in report["programs"]:
        tokens = int(r["program"].split("T=")[1])
        if tokens > report["max_num_seqs"]:
            continue  # not a decode step
        floor = (report["weights_bytes"] + tokens * report["roofline_context"] * kv_per_token) / chip.hbm_bytes_per_s
        assert floor <= r["predicted_s"] <= 1.2 * floor, (r, floor)


def test_every_forward_bucket_compiles_at_a_shipped_context_and_the_default_batch(models):
    """The engine's TPU defaults (256 sequences, 2,048 tokens a step) at a context models ship
    with (32k): the page table, 256 x 1,024 pages, is all of a TensorCore's SMEM, so a kernel
    that prefetched it whole failed to compile here. Two layers: the kernel is what matters."""
    report = compile_for_target(models["tiny-32k"], "tpu-v6e-1", programs=("forward",))
    assert (report["max_model_len"], report["max_num_seqs"], report["max_num_batched_tokens"]) == (32768, 256, 2048)
    assert [r["program"] for r in report["programs"]] == [f"forward T={2**k}" for k in range(4, 12)]
    assert [(r["program"], r["error"]) for r in report["programs"] if not r["compiled"]] == []
    assert report["fits"] and report["max_concurrency"] >= 1, report
    # The memory profile's pool (1 GiB, not one request's 1,025 blocks, which libtpu keeps in
    # VMEM: the step then had no HBM temporaries at all) gives the step the temporaries it
    # has beside the real pool.
    assert report["profile_kv_blocks"] == 2**30 // (report["kv_cache_bytes"] // report["kv_blocks"])
    profiled = compile_for_target(models["tiny-32k"], "tpu-v6e-1", programs=("forward T=2048",),
                                  num_gpu_blocks_override=report["profile_kv_blocks"])["programs"][0]
    served = report["programs"][-1]["temp_bytes"]
    assert served > 0 and abs(profiled["temp_bytes"] - served) <= served / 10, (profiled, served)


@pytest.mark.parametrize("model,backend,kv_cache_dtype", [
    ("tiny", "pallas", "auto"), ("tiny", "xla", "auto"), ("tiny-8-kv-heads", "pallas", "fp8"),
    ("tiny-8-kv-heads", "xla", "int8")])
def test_temporaries_do_not_grow_with_the_kv_pool(models, model, backend, kv_cache_dtype):
    """A step that copies the pool (a relayout, a scatter XLA cannot do in place) shows as
    temporaries that grow with it."""
    small, large = (compile_for_target(models[model], "tpu-v5e-1", programs=("forward T=16",),
                                       attention_backend=backend, kv_cache_dtype=kv_cache_dtype,
                                       num_gpu_blocks_override=blocks, **ENGINE)
                    for blocks in (64, 1024))
    grew = large["programs"][0]["temp_bytes"] - small["programs"][0]["temp_bytes"]
    assert small["programs"][0]["compiled"] and large["programs"][0]["compiled"]
    assert grew < (large["kv_cache_bytes"] - small["kv_cache_bytes"]) / 10, (small, large)


@pytest.mark.parametrize("target", ["tpu-v5e-1", "tpu-v6e-4"])
def test_the_lora_forward_compiles_with_abstract_adapter_stacks(models, target):
    """enable_lora adds forward_lora to what the engine warms up; its adapter stacks are shape
    structs here (nothing is written to compile-only chips), sharded as their base layers over
    the slice's tensor parallelism."""
    report = compile_for_target(models["tiny"], target, programs=("forward_lora",), enable_lora=True, max_loras=2,
                                max_lora_rank=8, **ENGINE)
    rows = report["programs"]
    assert [r["program"] for r in rows] == ["forward_lora T=16", "forward_lora T=32"]
    assert [(r["program"], r["error"]) for r in rows if not r["compiled"]] == []
    assert report["fits"] and all(r["alias_bytes"] >= report["kv_cache_bytes"] for r in rows), report


def test_a_draft_models_programs_compile_in_the_shared_pool(models):
    """Speculative decoding with a draft model (method draft_model): its forward over a step's
    tokens and `propose` (3 greedy steps unrolled) compile, Mosaic kernels included, as do
    eagle3's forward (with the captured hidden states) and `propose_eagle`, against
    the KV cache of target and draft layers, which both update in place; the plan counts the
    draft's weights and its layers' pages."""
    spec = {"method": "draft_model", "model": models["tiny-draft"], "num_speculative_tokens": 3}
    pool = dict(ENGINE, num_gpu_blocks_override=64)  # the plan itself is tested above
    report = compile_for_target(models["tiny"], "tpu-v5e-1", programs=("draft_forward T=16", "propose R=8"),
                                speculative_config=spec, **pool)
    assert [r["program"] for r in report["programs"]] == ["draft_forward T=16", "propose R=8"]
    eagle3 = compile_for_target(models["tiny"], "tpu-v5e-1", programs=("forward T=16", "propose_eagle T=16"),
                                speculative_config=dict(spec, method="eagle3", model=models["tiny-eagle3"]), **pool)
    assert [r["program"] for r in eagle3["programs"]] == ["forward T=16", "propose_eagle T=16"]
    for r in (report, eagle3):
        assert [(row["program"], row["error"]) for row in r["programs"] if not row["compiled"]] == []
        assert r["fits"] and all(row["alias_bytes"] >= r["kv_cache_bytes"] for row in r["programs"]), r
    plain = compile_for_target(models["tiny"], "tpu-v5e-1", programs=("none",), **pool)
    assert report["weights_bytes"] > plain["weights_bytes"]
    assert report["kv_cache_bytes"] == plain["kv_cache_bytes"] * 3 // 2  # 2 target layers and 1 draft layer


def test_a_model_too_large_for_the_slice_or_an_unknown_target_is_refused_by_name(tmp_path):
    """Before anything compiles: Llama-3-8B's bf16 weights (15 GiB) and one request of 8,192
    tokens do not fit one v5e chip (16 GiB x 0.9); the refusal names the smallest v5e slice
    that holds them under tensor parallelism. An unknown target lists the known ones."""
    llama3_8b = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                     intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                     max_position_embeddings=8192)
    (tmp_path / "config.json").write_text(json.dumps(llama3_8b))
    with pytest.raises(ValueError, match=r"does not fit tpu-v5e-1 .* smallest slice that fits: tpu-v5e-4 "
                                         r"\(tensor_parallel_size=4\)"):
        compile_for_target(str(tmp_path), "tpu-v5e-1")
    with pytest.raises(ValueError, match=r"Unknown target 'tpu-v9-1'; known targets: tpu-v5e-1, .*tpu-v6e-4"):
        compile_for_target(str(tmp_path), "tpu-v9-1")
    # Llama 3.1 8B in AWQ's 4 bits (packed two a byte on TPU: 5.6 GiB with its float head and
    # embedding) at its 131,072 tokens: one request's bfloat16 KV (16 GiB) does not fit; the
    # refusal points at an fp8 KV, which halves it (not yet counting the step's own memory).
    awq = dict(llama3_8b, max_position_embeddings=131072, quantization_config=dict(
        quant_method="awq", bits=4, group_size=128, zero_point=True, version="gemm"))
    (tmp_path / "config.json").write_text(json.dumps(awq))
    with pytest.raises(ValueError, match=r"5\.61 GiB of weights per chip .* kv_cache_dtype='fp8', which halves the KV"):
        compile_for_target(str(tmp_path), "tpu-v5e-1")


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_a_weight_only_quantized_model_compiles_with_its_8_bit_weights(models, quantization):
    """The worker quantizes float weights as it loads them; the compile takes them as the worker
    then holds them (QArrays: 8-bit values, a float32 scale per output channel, each sharded as
    its weight), so the plan counts a quarter of float32's bytes and the forward multiplies
    8-bit weights."""
    pool = dict(ENGINE, num_gpu_blocks_override=64)
    plain = compile_for_target(models["tiny"], "tpu-v6e-4", programs=("none",), dtype="float32", **pool)
    report = compile_for_target(models["tiny"], "tpu-v6e-4", programs=("forward T=16",), dtype="float32",
                                quantization=quantization, **pool)
    assert [(r["program"], r["error"]) for r in report["programs"]] == [("forward T=16", None)]
    assert report["fits"] and report["programs"][0]["alias_bytes"] >= report["kv_cache_bytes"]
    # the embedding (vocab x hidden, tied: also the head) stays float32; the layers' matmuls go 8-bit
    embedding = 1024 * 256 * 4 // 4
    assert report["weights_bytes"] - embedding < (plain["weights_bytes"] - embedding) / 3
