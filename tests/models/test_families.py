"""Each model family beyond Llama against transformers on a tiny random checkpoint:
prefill logits, greedy generation through LLM with chunked prefill and with preemption, a
checkpoint missing a tensor or with one of the wrong shape; opt-350m's layout, Qwen3 from a
GGUF, and an architecture the registry does not serve."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import assert_every_spec_method_keeps, run_prefill
from family_checkpoints import FAMILIES, write_family_checkpoint
from flax import nnx

from jaxvllm.models.layer_loops import unrolled_layers
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.transformers_utils.config import load_hf_config

ARCHS = sorted(FAMILIES)


@pytest.fixture(scope="module", params=ARCHS)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, write_family_checkpoint(request.param, path)


def load_model(path):
    hf_config = load_hf_config(str(path))
    model_cls, args_cls = get_model_class(hf_config)
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    model.load_hf_weights(load_weights(str(path)))
    return model


def test_prefill_logits_match_transformers(family):
    arch, path, ref = family
    model = load_model(path)
    token_ids = [int(t) for t in np.random.default_rng(0).integers(3, 256, 40)]  # crosses 3 pages
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    # Both layer loops: the switched one indexes each layer's window by the traced layer.
    for loop in (None, unrolled_layers):
        ours = run_prefill(model, token_ids, layer_loop=loop)
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"{arch} prefill max relative error {err:.2e}")
        assert err < 1e-4


def test_qwen3_use_sliding_window_slides_the_layers_from_max_window_layers(tmp_path):
    ref = write_family_checkpoint("Qwen3ForCausalLM", tmp_path, use_sliding_window=True, sliding_window=16,
                                  max_window_layers=1)
    model = load_model(tmp_path)
    assert model.sliding_windows() == [None, 16]
    token_ids = [int(t) for t in np.random.default_rng(0).integers(3, 256, 40)]
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    assert np.abs(run_prefill(model, token_ids) - theirs).max() / np.abs(theirs).max() < 1e-4


def test_opt_350m_layout_post_layer_norm(tmp_path):
    """opt-350m's layout: LayerNorms after attention and MLP, no final LayerNorm; its
    decoder named without "model.", as the facebook/opt-* checkpoints name it."""
    from safetensors.numpy import load_file, save_file
    ref = write_family_checkpoint("OPTForCausalLM", tmp_path, do_layer_norm_before=False)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    token_ids = [int(t) for t in np.random.default_rng(0).integers(3, 256, 20)]
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    ours = run_prefill(load_model(tmp_path), token_ids)
    assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-4


PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([5, 70, 17])]
N_NEW = 32


def test_greedy_matches_transformers_chunked_and_preempted(family):
    """Also with speculative decoding (every method; the model drafting for itself). One engine
    both chunks prefills (a 32-token budget: the 70-token prompt takes three steps) and preempts
    (9 usable pages of 16 for three requests needing 14; Gemma's 3 layers are 3 KV cache groups
    of 1 layer, its sliding ones holding 12-token windows: 19 usable blocks of one layer's page
    for requests needing about 33)."""
    from jaxvllm import LLM, SamplingParams
    arch, path, ref = family
    with torch.no_grad():
        want = [ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                             pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
              num_gpu_blocks_override=20 if arch.startswith("Gemma") else 10, skip_warmup=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == want
    core = llm.llm_engine.engine_core
    assert core.scheduler.num_preemptions > 0
    pool = core.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    # Speculative decoding (suffix: drafts from the prompts and the responses) in the same small
    # pool, chunked and preempted too, gives the same greedy tokens. ignore_eos, not min_tokens:
    # a request with min_tokens gets no drafts.
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                           use_tqdm=False)]
    llm.llm_engine.shutdown()
    # The model as its own draft model too: its layers join the pool's groups (Gemma's sliding
    # ones their own), and every draft is accepted. And a random EAGLE-3 head reading three of
    # its layers' hidden states (OPT's embedding is narrower than its layers: the head has its own).
    layers = load_hf_config(str(path)).num_hidden_layers
    assert_every_spec_method_keeps(path, PROMPTS, plain, params, (0, layers // 2, layers - 1),
                                   own_embedding=arch.startswith("OPT"), preempts=True, max_num_seqs=4,
                                   max_num_batched_tokens=32, max_model_len=128,
                                   num_gpu_blocks_override=20 if arch.startswith("Gemma") else 10)


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "Qwen2ForCausalLM"])
def test_every_speculative_method_keeps_greedy_output_on_the_llama_class(arch, tmp_path):
    """The Llama class's other architectures (Llama itself: tests/entrypoints/test_llm_spec_decode.py)."""
    from jaxvllm import LLM, SamplingParams
    path = tmp_path / "model"
    write_family_checkpoint(arch, path)
    args = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=16)
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    llm = LLM(str(path), skip_warmup=True, **args)
    plain = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                           use_tqdm=False)]
    llm.llm_engine.shutdown()
    assert_every_spec_method_keeps(path, PROMPTS, plain, params, (0, 1, 2), **args)


# Windows of 16-32 tokens, and pools far smaller than every layer keeping every page would
# need: sliding groups must free what leaves their window for these runs to finish at all.
WINDOWED = {  # arch -> (checkpoint overrides, num_gpu_blocks_override)
    "Gemma2ForCausalLM": (dict(sliding_window=16), 48),  # layers: sliding, full, sliding
    "Gemma3ForCausalLM": (dict(sliding_window=32), 50),  # sliding, sliding, full
    "MistralForCausalLM": (dict(sliding_window=24), 9),  # both sliding: one group
}


@pytest.mark.parametrize("arch", sorted(WINDOWED))
def test_sliding_windows_keep_greedy_parity_far_past_the_window(arch, tmp_path):
    """Prompts of 40-330 tokens, chunked (a 64-token budget) and preempted (the pool holds
    about half of what the three requests need at once); then a prompt continuing a finished
    one, whose prefix hit must be served by every group (a sliding group from the window's
    blocks it kept). Greedy tokens equal transformers', every block is back after each run."""
    from jaxvllm import LLM, SamplingParams
    overrides, num_blocks = WINDOWED[arch]
    ref = write_family_checkpoint(arch, tmp_path, **overrides)
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 256, n)] for n in (330, 40, 200, 100)]
    n_new = 16

    def reference(p):  # the mask given: a sampled 0 (the pad id) in `later` must not read as padding
        with torch.no_grad():
            return ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new,
                                pad_token_id=0)[0, len(p):].tolist()

    want = [reference(p) for p in prompts]
    later = prompts[3] + want[3] + [int(t) for t in rng.integers(3, 256, 20)]
    want.append(reference(later))
    llm = LLM(str(tmp_path), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512,
              num_gpu_blocks_override=num_blocks, enable_prefix_caching=True, skip_warmup=True)
    scheduler = llm.llm_engine.engine_core.scheduler
    manager, pool = scheduler.kv_cache_manager, scheduler.kv_cache_manager.block_pool
    assert manager.sliding_managers and all(m.sliding_window == overrides["sliding_window"]
                                            for m in manager.sliding_managers)
    params = SamplingParams(temperature=0, max_tokens=n_new, min_tokens=n_new)

    def generate(batch):
        out = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        assert pool.get_num_free_blocks() == pool.num_blocks - 1
        return [o.outputs[0].token_ids for o in out]

    got = generate(prompts[:3])
    assert scheduler.num_preemptions > 0
    got += generate(prompts[3:])
    hits = manager.prefix_cache_stats.hits
    got += generate([later])
    # 115 tokens of prompts[3] were computed: 7 full blocks, the window's last ones kept.
    assert manager.prefix_cache_stats.hits - hits == 112
    assert got == want


# A tensor each family adds to Llama's, dropped or given a wrong shape.
FAMILY_TENSOR = {
    "Qwen3ForCausalLM": "model.layers.1.self_attn.q_norm.weight",
    "Gemma2ForCausalLM": "model.layers.2.pre_feedforward_layernorm.weight",
    "Gemma3ForCausalLM": "model.layers.0.self_attn.k_norm.weight",
    "OPTForCausalLM": "model.decoder.layers.1.fc1.bias",
    "Phi3ForCausalLM": "model.layers.0.self_attn.qkv_proj.weight",
}


def test_missing_or_misshapen_tensor_is_named(family):
    arch, path, _ = family
    hf_config = load_hf_config(str(path))
    model_cls, args_cls = get_model_class(hf_config)
    weights = load_weights(str(path))
    key = FAMILY_TENSOR[arch]
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    with pytest.raises(ValueError, match=f"missing tensor '{key}'"):
        model.load_hf_weights({k: v for k, v in weights.items() if k != key})
    with pytest.raises(ValueError, match=f"Tensor '{key}' of shape"):
        model.load_hf_weights({**weights, key: np.zeros((weights[key].shape[0] + 3, *weights[key].shape[1:]),
                                                       np.float32)})


def test_unsupported_architecture_is_named_with_the_supported_ones(tiny_model_dir, tmp_path):
    import json
    import shutil

    from jaxvllm import LLM
    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["FalconForCausalLM"]}))
    with pytest.raises(ValueError, match=r"\['FalconForCausalLM'\] are not supported; supported: .*"
                                         r"Gemma2ForCausalLM, Gemma3ForCausalLM, .*OPTForCausalLM"):
        LLM(str(tmp_path), skip_warmup=True)


# How each GGUF test case's checkpoint is written (overrides to what a GGUF can state) and the
# metadata llama.cpp writes beside the basics.
GGUF_CASES = {
    "Qwen3ForCausalLM": ("qwen3", {}, {}),
    "Gemma2ForCausalLM": ("gemma2", dict(query_pre_attn_scalar=32), dict(
        sliding_window=12, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "Gemma3ForCausalLM": ("gemma3", dict(query_pre_attn_scalar=32, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}), dict(
        sliding_window=12, sliding_window_pattern=3, **{"rope.scaling.type": "linear", "rope.scaling.factor": 2.0})),
}


@pytest.mark.parametrize("arch", sorted(GGUF_CASES))
def test_gguf_loads_as_transformers_writes_it(arch, tmp_path_factory):
    """A GGUF written with llama.cpp's own tensor names (no Q/K row permutation; Gemma's
    norms as 1 + w, its sliding pattern and soft caps as metadata): its architecture, model
    args and weights are the safetensors checkpoint's."""
    import gguf
    gguf_arch, overrides, extra = GGUF_CASES[arch]
    path = tmp_path_factory.mktemp(f"{gguf_arch}-gguf")
    ref = write_family_checkpoint(arch, path, **overrides)
    cfg = ref.config
    writer = gguf.GGUFWriter(path / "tiny.gguf", gguf_arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    for key, value in extra.items():
        if key in ("sliding_window", "sliding_window_pattern"):
            writer.add_uint32(f"{gguf_arch}.attention.{key}", value)
        elif isinstance(value, str):
            writer.add_string(f"{gguf_arch}.{key}", value)
        else:
            writer.add_float32(f"{gguf_arch}.{key}", value)
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == gguf_arch)
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    for name, w in load_weights(str(path)).items():
        shift = 1.0 if gguf_arch.startswith("gemma") and name.endswith("norm.weight") else 0.0
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), w + shift)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_path = str(path / "tiny.gguf")
    gguf_config = load_hf_config(gguf_path)
    model_cls, args_cls = get_model_class(gguf_config)
    assert model_cls is get_model_class(cfg)[0]
    args, want_args = args_cls.from_hf_config(gguf_config), args_cls.from_hf_config(cfg)
    assert args.rms_norm_eps == pytest.approx(want_args.rms_norm_eps)  # float32 in the GGUF
    assert dataclasses.replace(args, rms_norm_eps=want_args.rms_norm_eps) == want_args
    weights, want = load_weights(gguf_path), load_weights(str(path))
    assert weights.keys() == want.keys()
    for name, w in weights.items():
        np.testing.assert_allclose(w, want[name], atol=1e-6, err_msg=name)
